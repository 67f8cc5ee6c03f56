"""Registries of advantage estimators and DAA lambda rules; RLOO against hand values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from da3po_jax.rl import (
    ADVANTAGE_ESTIMATORS,
    DAA_RULES,
    AdvantageConfig,
    BetaPrior,
    DAAConfig,
    DAARule,
    PromptHistory,
    Registry,
    apply_daa,
    compute_advantages,
    daa_lambda,
    grpo_advantages,
    rloo_advantages,
)


@pytest.fixture
def restore_registries(monkeypatch):
    """Entries a test registers are gone afterwards (monkeypatch puts the dicts back)."""
    for reg in (ADVANTAGE_ESTIMATORS, DAA_RULES):
        monkeypatch.setattr(reg, "_entries", dict(reg._entries))


# --- Registry ---------------------------------------------------------------------------


def test_registry_register_get_names_contains():
    reg = Registry("thing")

    @reg.register("b")
    def b():
        return "b"

    assert b() == "b"  # the decorator returns the function
    a = lambda: "a"
    assert reg.register("a", a) is a
    assert reg.get("b") is b and reg.get("a") is a
    assert reg.names() == ("b", "a")  # registration order
    assert "a" in reg and "c" not in reg and 3 not in reg


def test_registry_unknown_name_lists_sorted_choices():
    reg = Registry("thing")
    reg.register("b", 1)
    reg.register("a", 2)
    with pytest.raises(ValueError) as e:
        reg.get("c")
    assert str(e.value) == "unknown thing 'c'; choices: ['a', 'b']"
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'"):
        ADVANTAGE_ESTIMATORS.get("nope")
    with pytest.raises(ValueError, match="unknown DAA rule 'nope'"):
        DAA_RULES.get("nope")


def test_registry_refuses_duplicates_unless_replace():
    reg = Registry("thing")
    reg.register("a", 1)
    with pytest.raises(ValueError, match="thing 'a' is already registered"):
        reg.register("a", 2)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(lambda: None)
    assert reg.get("a") == 1
    assert reg.register("a", 2, replace=True) == 2
    assert reg.get("a") == 2 and reg.names() == ("a",)
    with pytest.raises(ValueError, match="non-empty string"):
        reg.register("", 3)


def test_registry_check_and_unregister():
    reg = Registry("thing")
    reg.register("none", 0)
    reg.register("x", 1)
    reg.register("y", 2)
    assert reg.check("x") is None
    assert reg.check("z") == "must be one of ['none', 'x', 'y']"
    assert reg.check(["x"]) == "must be one of ['none', 'x', 'y']"  # unhashable: no crash
    assert reg.check("y", exclude=("none",)) is None
    assert reg.check("none", exclude=("none",)) == "must be one of ['x', 'y']"
    assert reg.unregister("x") == 1
    assert reg.names() == ("none", "y")
    with pytest.raises(ValueError, match="unknown thing 'x'"):
        reg.unregister("x")


def test_builtin_names():
    assert ADVANTAGE_ESTIMATORS.names() == ("grpo", "rloo")
    assert DAA_RULES.names() == ("none", "constant", "power", "bayes", "history")


# --- RLOO -------------------------------------------------------------------------------


def test_rloo_hand_values():
    r = jnp.array(
        [
            [1.0, 0.0, 0.5, 7.0],  # last response masked
            [0.1, 0.1, 0.1, 0.1],  # constant
            [0.3, 1.0, 2.0, 3.0],  # one valid response
            [1.0, 0.0, 0.0, 0.0],  # full group
        ]
    )
    v = jnp.array(
        [
            [True, True, True, False],
            [True, True, True, True],
            [False, True, False, False],
            [True, True, True, True],
        ]
    )
    expected = [
        # 1 - (0 + .5) / 2, 0 - (1 + .5) / 2, .5 - (1 + 0) / 2, masked
        [0.75, -0.75, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0],
        # 1 - 0, 0 - 1 / 3 (x3)
        [1.0, -1 / 3, -1 / 3, -1 / 3],
    ]
    adv = rloo_advantages(r, 4, valid=v)
    np.testing.assert_allclose(adv, expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(adv[1:3], 0.0)  # exactly 0, not round-off
    # flat layout, and through compute_advantages with estimator "rloo"
    flat = rloo_advantages(r.reshape(-1), 4, valid=v.reshape(-1))
    np.testing.assert_array_equal(flat, adv.reshape(-1))
    out, metrics = compute_advantages(
        r.reshape(-1),
        r.reshape(-1) > 0.5,
        4,
        config=AdvantageConfig(estimator="rloo"),
        valid=v.reshape(-1),
    )
    np.testing.assert_array_equal(out, flat)
    np.testing.assert_allclose(metrics["adv/zero_var_frac"], 0.5)  # constant + single


@pytest.mark.parametrize("g", [2, 4, 8])
def test_rloo_is_g_over_g_minus_1_times_centred(g):
    r = jax.random.normal(jax.random.PRNGKey(g), (6, g))
    centred = grpo_advantages(r, g, norm="none")
    np.testing.assert_allclose(rloo_advantages(r, g), g / (g - 1) * centred, rtol=1e-5, atol=1e-6)


def test_rloo_ignores_norm_and_jits_with_static_config():
    r = jax.random.uniform(jax.random.PRNGKey(0), (3 * 4,))
    f = jax.jit(lambda x, c: compute_advantages(x, x > 0.5, 4, config=c)[0], static_argnums=1)
    a = f(r, AdvantageConfig(estimator="rloo", norm="std"))
    b = f(r, AdvantageConfig(estimator="rloo", norm="none", std_ddof=0, eps=0.1))
    np.testing.assert_allclose(a, b, rtol=1e-6)
    np.testing.assert_allclose(a, rloo_advantages(r, 4), rtol=1e-6)


@pytest.mark.parametrize("norm, ddof", [("std", 1), ("std", 0), ("none", 1)])
def test_grpo_entry_is_grpo_advantages(norm, ddof):
    r = jax.random.uniform(jax.random.PRNGKey(1), (5 * 4,))
    v = jax.random.uniform(jax.random.PRNGKey(2), (5 * 4,)) > 0.2
    cfg = AdvantageConfig(norm=norm, std_ddof=ddof)
    assert cfg.estimator == "grpo"
    adv, _ = compute_advantages(r, r > 0.5, 4, config=cfg, valid=v)
    ref = grpo_advantages(r, 4, valid=v, norm=norm, std_ddof=ddof, eps=cfg.eps)
    np.testing.assert_array_equal(adv, ref)


def test_unknown_advantage_estimator_is_refused():
    with pytest.raises(ValueError) as e:
        AdvantageConfig(estimator="ppo")
    assert "AdvantageConfig.estimator='ppo' must be one of ['grpo', 'rloo']" in str(e.value)


# --- a custom advantage estimator -------------------------------------------------------


def _mean_baseline(rewards, valid, config):
    """A = R - mean over the group's valid responses (no constant-group rule)."""
    del config
    n = jnp.maximum(valid.sum(-1, keepdims=True), 1)
    mean = jnp.where(valid, rewards, 0).sum(-1, keepdims=True) / n
    return jnp.where(valid, rewards - mean, 0.0)


def test_custom_estimator_is_validated_and_dispatched(restore_registries):
    with pytest.raises(ValueError, match="must be one of"):
        AdvantageConfig(estimator="mean-baseline")
    ADVANTAGE_ESTIMATORS.register("mean-baseline", _mean_baseline)
    cfg = AdvantageConfig(estimator="mean-baseline")
    r = jnp.array([3.0, 1.0, 2.0, 9.0, 1.0, 0.0, 0.0, 0.0])
    v = jnp.array([True, True, True, False, True, True, True, True])
    adv, metrics = compute_advantages(r, r > 0.5, 4, config=cfg, valid=v)
    np.testing.assert_allclose(adv, [1.0, -1.0, 0.0, 0.0, 0.75, -0.25, -0.25, -0.25], rtol=1e-6)
    assert adv.shape == r.shape
    assert set(metrics) == {"adv/mean", "adv/abs_mean", "adv/zero_var_frac"}
    assert ADVANTAGE_ESTIMATORS.check("mean-baseline") is None  # what train/config.py asks


def test_custom_estimator_is_gone_after_the_test():
    assert "mean-baseline" not in ADVANTAGE_ESTIMATORS


def test_estimator_with_wrong_output_shape_is_refused(restore_registries):
    ADVANTAGE_ESTIMATORS.register("bad", lambda r, v, c: r.sum(-1))
    with pytest.raises(ValueError, match="returned shape"):
        compute_advantages(jnp.ones(8), jnp.ones(8), 4, config=AdvantageConfig(estimator="bad"))


# --- DAA rules --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, uses_prior, uses_history",
    [
        ("none", False, False),
        ("power", False, False),
        ("bayes", True, False),
        ("history", True, True),
    ],
)
def test_daa_rule_flags(name, uses_prior, uses_history):
    rule = DAA_RULES.get(name)
    assert isinstance(rule, DAARule)
    assert (rule.uses_prior, rule.uses_history) == (uses_prior, uses_history)
    cfg = DAAConfig(estimator=name)
    assert (cfg.uses_prior, cfg.uses_history) == (uses_prior, uses_history)


def test_unknown_daa_estimator_is_refused():
    with pytest.raises(ValueError) as e:
        DAAConfig(estimator="magic")
    names = "['none', 'constant', 'power', 'bayes', 'history']"
    msg = f"DAAConfig.estimator='magic' must be one of {names}"
    assert msg in str(e.value)


def _odds(x):
    return x / (1 - x)


N = np.array([8.0, 8.0, 8.0, 6.0, 5.0])
K = np.array([1.0, 2.0, 3.0, 1.0, 2.0])
MU = K / N
A, B = 0.7, 5.0  # Beta prior
S = np.array([0.0, 1.5, 0.5, 3.0, 0.25])  # decayed history counts
F = np.array([2.0, 0.0, 4.5, 1.0, 7.0])


def _numpy_lambda(name, tau, beta, gamma, cap):
    """The formulas of rl/daa.py's module docstring, in float64 numpy."""
    if name == "none":
        return np.ones_like(MU)
    if name == "power":
        return np.clip((_odds(tau) / _odds(MU)) ** beta, 1, cap)
    s, f = (S, F) if name == "history" else (0.0, 0.0)
    alpha, beta_ = A + K + s, B + N - K + f
    e_inv_odds = beta_ / np.maximum(alpha - 1, 1e-3)
    return np.clip(_odds(MU) * e_inv_odds, 1, cap) ** gamma


@pytest.mark.parametrize("name", ["none", "power", "bayes", "history"])
@pytest.mark.parametrize("tau, beta, gamma, cap", [(0.5, 0.5, 0.5, 4.0), (0.9, 1.0, 1.0, 1e3)])
def test_daa_lambda_matches_the_formulas(name, tau, beta, gamma, cap):
    cfg = DAAConfig(estimator=name, tau=tau, beta=beta, gamma=gamma, lambda_max=cap)
    prior = BetaPrior(jnp.asarray(A), jnp.asarray(B))
    hist = PromptHistory(jnp.asarray(S), jnp.asarray(F))
    lam = daa_lambda(jnp.asarray(MU), jnp.asarray(K), jnp.asarray(N), cfg, prior, hist)
    expected = _numpy_lambda(name, tau, beta, gamma, cap)
    np.testing.assert_allclose(lam, expected, rtol=1e-6)
    if cap == 1e3 and name != "none":
        assert (expected > 1).any()  # not everything clipped to 1


def test_daa_missing_prior_or_history_messages():
    mu, k, n = jnp.asarray(MU), jnp.asarray(K), jnp.asarray(N)
    prior = BetaPrior(jnp.asarray(A), jnp.asarray(B))
    for name in ("bayes", "history"):
        with pytest.raises(ValueError) as e:
            daa_lambda(mu, k, n, DAAConfig(estimator=name))
        assert str(e.value) == f"DAA estimator {name!r} needs a BetaPrior (prior=...)"
    with pytest.raises(ValueError) as e:
        daa_lambda(mu, k, n, DAAConfig(estimator="history"), prior)
    assert str(e.value) == "DAA estimator 'history' needs a PromptHistory (history=...)"


def test_custom_daa_rule_is_used_by_apply_daa(restore_registries):
    def double(mu, k, n, config, prior, history):
        return jnp.clip(jnp.full_like(mu, 2.0) * prior.a, 1.0, config.lambda_max)

    DAA_RULES.register("double", DAARule(double, uses_prior=True))
    cfg = DAAConfig(estimator="double", tau=0.5)
    assert cfg.uses_prior and not cfg.uses_history
    c = jnp.array([1.0, 0, 0, 0, 1, 1, 1, 0])  # group 0 hard (mu 1/4), group 1 not (3/4)
    adv = grpo_advantages(c, 4, norm="none")
    with pytest.raises(ValueError, match="'double' needs a BetaPrior"):
        apply_daa(adv, c, 4, config=cfg)
    prior = BetaPrior(jnp.asarray(1.0), jnp.asarray(1.0))
    new, metrics = apply_daa(adv, c, 4, config=cfg, prior=prior)
    np.testing.assert_allclose(new, [2 * 0.75, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75])
    np.testing.assert_allclose(metrics["daa/lambda_max"], 2.0)


def test_custom_daa_rule_is_gone_after_the_test():
    assert "double" not in DAA_RULES
    with pytest.raises(ValueError, match="DAAConfig.estimator='double' must be one of"):
        DAAConfig(estimator="double")
