"""Direct Advantage Amplification: worked example, estimators, prior fit, Monte-Carlo checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from da3po_jax.rl import (
    AdvantageConfig,
    BetaPrior,
    DAAConfig,
    PromptHistory,
    accuracy_moments,
    apply_daa,
    beta_prior_from_moments,
    compute_advantages,
    daa_lambda,
    fit_beta_prior,
    grpo_advantages,
    init_prior_state,
    prior_from_state,
    update_history,
    update_prior_state,
)

POWER = DAAConfig(estimator="power")  # the default rule before the paper's constant one


def _odds(x):
    return x / (1 - x)


def test_worked_example_g8_p001_k1():
    """docs/algorithms.md: G = 8, p = 0.01, k = 1 -> incorrect amplified ~14x more than correct."""
    c = jnp.array([1.0, 0, 0, 0, 0, 0, 0, 0])
    adv = grpo_advantages(c, 8, norm="none")  # centred: 0.875 / -0.125
    np.testing.assert_allclose(adv, [0.875] + [-0.125] * 7, rtol=1e-6)
    p = 0.01
    amp_correct = 0.875 / (1 - p)  # relative to the ideal advantage R - p
    amp_incorrect = 0.125 / p
    ratio = amp_incorrect / amp_correct
    np.testing.assert_allclose(ratio, 99 / 7, rtol=1e-12)  # = odds(1/8) / odds(0.01)
    assert 14.0 < ratio < 14.2
    # The bayes estimator with a prior concentrated at p = 0.01 and gamma = 1, uncapped,
    # recovers that factor: odds(1/8) * (b + 7) / (a + 1 - 1) with a = 0.01 s, b = 0.99 s.
    s = 1e6
    prior = BetaPrior(jnp.asarray(0.01 * s), jnp.asarray(0.99 * s))
    cfg = DAAConfig(estimator="bayes", gamma=1.0, lambda_max=1e6)
    new, met = apply_daa(adv, c, 8, config=cfg, prior=prior)
    np.testing.assert_allclose(
        met["daa/lambda_max"], (1 / 7) * (0.99 * s + 7) / (0.01 * s), rtol=1e-5
    )
    np.testing.assert_allclose(met["daa/lambda_max"], 99 / 7, rtol=2e-3)
    # after DAA the correct response is amplified as much as the incorrect ones
    np.testing.assert_allclose((new[0] / (1 - p)) / (-new[1] / p), 1.0, rtol=2e-3)
    np.testing.assert_array_equal(new[1:], adv[1:])
    # with the default cap 4 the amplification is capped
    new, met = apply_daa(adv, c, 8, config=DAAConfig(estimator="bayes", gamma=1.0), prior=prior)
    np.testing.assert_allclose(new[0], 4 * 0.875, rtol=1e-6)


def test_constant_rule_is_the_default_with_factor_2():
    """The DA3PO paper's rule: lambda = 2 on every hard group, whatever its accuracy."""
    cfg = DAAConfig()
    assert (cfg.estimator, cfg.factor, cfg.tau) == ("constant", 2.0, 0.5)
    mu = jnp.array([1 / 16, 3 / 16, 7 / 16, 0.5, 0.75])
    lam = daa_lambda(mu, mu * 16, jnp.full(5, 16.0), cfg)
    np.testing.assert_array_equal(lam, [2.0] * 5)  # gating on hardness is apply_daa's
    # the cap of the other rules does not bind it
    lam = daa_lambda(mu, mu * 16, jnp.full(5, 16.0), DAAConfig(factor=3.0, lambda_max=1.0))
    np.testing.assert_array_equal(lam, [3.0] * 5)


def test_constant_rule_hand_values_g4():
    # G = 4, Dr.GRPO advantages R - mean: group 0 mu = 1/4 (hard), group 1 mu = 3/4 (easy),
    # group 2 mu = 0 (nothing to amplify), group 3 mu = 1/2 (= tau: not hard)
    c = jnp.array([1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0])
    adv = grpo_advantages(c, 4, norm="none")
    new, met = apply_daa(adv, c, 4, config=DAAConfig())
    want = np.array(
        [1.5, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75, 0, 0, 0, 0, 0.5, 0.5, -0.5, -0.5]
    )
    np.testing.assert_allclose(new, want, rtol=1e-6)
    np.testing.assert_allclose(met["daa/frac_hard"], 1 / 3, rtol=1e-6)  # 3 kept groups
    np.testing.assert_allclose(met["daa/lambda_mean"], 2.0)
    np.testing.assert_allclose(met["daa/lambda_max"], 2.0)
    # positive share: before (0.75 + 0.75 + 1) / (1.5 + 1.5 + 2); after, group 0's
    # positive 0.75 -> 1.5 and its |A| 1.5 -> 2.25
    np.testing.assert_allclose(met["daa/pos_share_before"], 2.5 / 5.0, rtol=1e-6)
    np.testing.assert_allclose(met["daa/pos_share_after"], 3.25 / 5.75, rtol=1e-6)
    # factor 1 leaves everything as it was; tau 0.8 makes group 1 (mu 3/4) hard too
    same, _ = apply_daa(adv, c, 4, config=DAAConfig(factor=1.0))
    np.testing.assert_array_equal(same, adv)
    wider, _ = apply_daa(adv, c, 4, config=DAAConfig(tau=0.8))
    np.testing.assert_allclose(wider[4:7], [0.5, 0.5, 0.5], rtol=1e-6)
    np.testing.assert_allclose(wider[7], -0.75, rtol=1e-6)
    # the control amplifies both signs of the hard group by the same 2
    both, _ = apply_daa(adv, c, 4, config=DAAConfig(apply_to="both"))
    np.testing.assert_allclose(both[:4], [1.5, -0.5, -0.5, -0.5], rtol=1e-6)


def test_constant_factor_below_one_is_refused():
    with pytest.raises(ValueError, match="factor"):
        DAAConfig(factor=0.5)


def test_power_hand_values():
    cfg = DAAConfig(estimator="power", tau=0.5, beta=0.5, lambda_max=4.0)
    n = jnp.full(5, 8.0)
    mu = jnp.array([1 / 8, 2 / 8, 3 / 8, 0.49, 0.5])
    lam = daa_lambda(mu, mu * 8, n, cfg)
    # sqrt(odds(.5) / odds(mu)): sqrt(7), sqrt(3), sqrt(5/3), sqrt(.51/.49), 1
    np.testing.assert_allclose(
        lam, [np.sqrt(7), np.sqrt(3), np.sqrt(5 / 3), np.sqrt(51 / 49), 1.0], rtol=1e-5
    )
    lam = daa_lambda(mu, mu * 8, n, DAAConfig(estimator="power", beta=1.0, lambda_max=4.0))
    np.testing.assert_allclose(lam, [4.0, 3.0, 5 / 3, 51 / 49, 1.0], rtol=1e-5)


def test_power_is_identity_at_tau_and_for_easy_groups():
    # G = 4: groups with mu = 0.5 (= tau), 0.75, 1.0, 0.25
    c = jnp.array([1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0])
    adv = grpo_advantages(c, 4)
    new, met = apply_daa(adv, c, 4, config=POWER)
    np.testing.assert_array_equal(new[:12], adv[:12])
    np.testing.assert_allclose(new[12], adv[12] * np.sqrt(3), rtol=1e-6)
    np.testing.assert_array_equal(new[13:], adv[13:])
    np.testing.assert_allclose(met["daa/frac_hard"], 1 / 3, rtol=1e-6)  # 3 kept groups
    np.testing.assert_allclose(
        daa_lambda(
            jnp.array([0.5]),
            jnp.array([2.0]),
            jnp.array([4.0]),
            DAAConfig(estimator="power", beta=3.0),
        ),
        [1.0],
    )


def test_metrics_hand_values():
    c = jnp.array([1, 0, 0, 0, 1, 1, 1, 0])
    adv = grpo_advantages(c, 4, norm="none")  # [.75, -.25 x3], [.25 x3, -.75]
    new, met = apply_daa(adv, c, 4, config=POWER)
    s3 = np.sqrt(3)
    np.testing.assert_allclose(met["daa/frac_hard"], 0.5)
    np.testing.assert_allclose(met["daa/lambda_mean"], s3, rtol=1e-6)
    np.testing.assert_allclose(met["daa/lambda_max"], s3, rtol=1e-6)
    np.testing.assert_allclose(met["daa/pos_share_before"], 1.5 / 3.0, rtol=1e-6)
    np.testing.assert_allclose(
        met["daa/pos_share_after"], (0.75 * s3 + 0.75) / (0.75 * s3 + 0.75 + 1.5), rtol=1e-6
    )


def test_control_apply_to_both():
    c = jnp.array([1, 0, 0, 0, 1, 1, 1, 0])
    adv = grpo_advantages(c, 4, norm="none")
    new, _ = apply_daa(adv, c, 4, config=DAAConfig(estimator="power", apply_to="both"))
    np.testing.assert_allclose(
        new[:4], np.sqrt(3) * np.array([0.75, -0.25, -0.25, -0.25]), rtol=1e-6
    )
    np.testing.assert_array_equal(new[4:], adv[4:])


def test_group_valid_and_response_mask():
    c = jnp.array([1, 0, 0, 0, 1, 0, 0, 0])
    adv = grpo_advantages(c, 4)
    kept = jnp.array([True, False])
    new, met = apply_daa(adv, c, 4, config=POWER, group_valid=kept)
    np.testing.assert_allclose(new[0], adv[0] * np.sqrt(3), rtol=1e-6)
    np.testing.assert_array_equal(new[4:], adv[4:])  # group not kept: unchanged
    np.testing.assert_allclose(met["daa/frac_hard"], 1.0)
    # masked-out responses: group 0 has valid [1, 0, 0] (mu = 1/3) -> sqrt(odds(.5)/odds(1/3))
    v = jnp.array([1, 1, 1, 0, 1, 1, 1, 1], bool)
    new, _ = apply_daa(adv, c, 4, config=POWER, valid=v)
    np.testing.assert_allclose(new[0], adv[0] * np.sqrt(2), rtol=1e-6)


def test_bayes_and_history_hand_values():
    c = jnp.array([1, 0, 0, 0])
    prior = BetaPrior(jnp.asarray(1.0), jnp.asarray(3.0))
    # bayes: posterior Beta(2, 6): E[(1-p)/p] = 6 / 1; lambda = odds(1/4) * 6 = 2
    lam = daa_lambda(
        jnp.array([0.25]),
        jnp.array([1.0]),
        jnp.array([4.0]),
        DAAConfig(estimator="bayes", gamma=1.0),
        prior,
    )
    np.testing.assert_allclose(lam, [2.0], rtol=1e-6)
    lam = daa_lambda(
        jnp.array([0.25]),
        jnp.array([1.0]),
        jnp.array([4.0]),
        DAAConfig(estimator="bayes", gamma=0.5),
        prior,
    )
    np.testing.assert_allclose(lam, [np.sqrt(2.0)], rtol=1e-6)
    # history s = 2, f = 6: Beta(4, 12): E = 12 / 3 = 4, lambda = 4 / 3
    hist = PromptHistory(jnp.array([2.0]), jnp.array([6.0]))
    adv = grpo_advantages(c, 4)
    new, _ = apply_daa(
        adv, c, 4, config=DAAConfig(estimator="history", gamma=1.0), prior=prior, history=hist
    )
    np.testing.assert_allclose(new[0], adv[0] * 4 / 3, rtol=1e-6)
    # denominator a + k - 1 clamped at 1e-3: a = 5e-4, b = 1 -> E = (1 + 3) / 1e-3
    tiny = BetaPrior(jnp.asarray(5e-4), jnp.asarray(1.0))
    lam = daa_lambda(
        jnp.array([0.25]),
        jnp.array([1.0]),
        jnp.array([4.0]),
        DAAConfig(estimator="bayes", gamma=1.0, lambda_max=1e5),
        tiny,
    )
    np.testing.assert_allclose(lam, [4.0 / 1e-3 / 3], rtol=1e-4)
    # decayed counts: s = 0.5 * 2 + 1, f = 0.5 * 6 + 3
    h2 = update_history(hist, c, 4, decay=0.5)
    np.testing.assert_allclose(h2.success, [2.0])
    np.testing.assert_allclose(h2.failure, [6.0])
    with pytest.raises(ValueError, match="BetaPrior"):
        apply_daa(adv, c, 4, config=DAAConfig(estimator="bayes"))


@settings(max_examples=15, deadline=None)
@given(
    st.integers(2, 8),
    st.integers(1, 6),
    st.sampled_from(["power", "bayes", "history"]),
    st.floats(1.0, 8.0),
    st.integers(0, 2**31 - 1),
)
def test_incorrect_unchanged_and_lambda_bounds(g, p, estimator, cap, seed):
    rng = np.random.default_rng(seed)
    c = rng.integers(0, 2, (p, g))
    adv = rng.normal(0, 1, (p, g)).astype(np.float32)
    cfg = DAAConfig(estimator=estimator, lambda_max=cap, gamma=1.0, tau=float(rng.uniform(0.1, 1)))
    prior = BetaPrior(jnp.asarray(rng.uniform(0.01, 3)), jnp.asarray(rng.uniform(0.01, 3)))
    hist = PromptHistory(jnp.asarray(rng.uniform(0, 5, p)), jnp.asarray(rng.uniform(0, 5, p)))
    new, met = apply_daa(jnp.asarray(adv), jnp.asarray(c), g, config=cfg, prior=prior, history=hist)
    new = np.asarray(new)
    np.testing.assert_array_equal(new[c == 0], adv[c == 0])
    lam = new[c == 1] / np.where(adv[c == 1] == 0, 1, adv[c == 1])
    assert np.all(lam >= 1 - 1e-6) and np.all(lam <= cap * (1 + 1e-6))
    assert 1.0 <= float(met["daa/lambda_max"]) <= cap * (1 + 1e-6)
    mu = c.mean(1)
    not_hard = (mu >= cfg.tau) | (mu == 0)
    np.testing.assert_array_equal(new[not_hard], adv[not_hard])


@pytest.mark.parametrize("a,b", [(0.5, 2.0), (2.0, 3.0)])
def test_bayes_prior_fit_recovers_beta_binomial(a, b):
    rng = np.random.default_rng(123)
    g = 8
    p = rng.beta(a, b, 20_000)
    k = rng.binomial(g, p)
    prior = fit_beta_prior(jnp.asarray(k / g, jnp.float32), g)
    np.testing.assert_allclose(float(prior.a), a, rtol=0.10)
    np.testing.assert_allclose(float(prior.b), b, rtol=0.10)
    # a plain Beta moment fit of k / G (ignoring the binomial noise) would be far off
    m, v = (k / g).mean(), (k / g).var()
    naive_s = m * (1 - m) / v - 1
    assert abs(naive_s / (a + b) - 1) > 0.3


def test_beta_prior_from_moments_hand_values():
    # Beta(1, 3), G = 8: m = .25, Var(k/G) = m (1-m) (s + G) / (G (s + 1)) = .1875 * 12 / 40
    prior = beta_prior_from_moments(jnp.asarray(0.25), jnp.asarray(0.05625), 8)
    np.testing.assert_allclose([prior.a, prior.b], [1.0, 3.0], rtol=1e-5)
    # filtered groups count: all-wrong / all-correct accuracies enter the moments
    m, v = accuracy_moments(jnp.array([0.0, 0.5, 1.0, 0.5, 0.3]), jnp.array([1, 1, 1, 1, 0], bool))
    np.testing.assert_allclose([m, v], [0.5, 1 / 6], rtol=1e-6)


def test_prior_ema_state():
    state = init_prior_state()
    state = update_prior_state(state, jnp.array([0.0, 0.5, 1.0, 0.5]), decay=0.9)
    np.testing.assert_allclose([state.mean, state.var], [0.5, 1 / 6], rtol=1e-6)
    state = update_prior_state(state, jnp.array([0.0, 0.0, 0.25, 0.25]), decay=0.9)
    # mean .9 * .5 + .1 * .125; var .9 / 6 + .1 * (4 * .125**2 / 3)
    np.testing.assert_allclose(
        [state.mean, state.var], [0.4625, 0.15 + 0.1 * 0.0625 / 3], rtol=1e-6
    )
    same = update_prior_state(state, jnp.zeros(4), valid=jnp.zeros(4, bool))
    np.testing.assert_allclose([same.mean, same.var], [state.mean, state.var])
    jitted = jax.jit(update_prior_state, static_argnames="decay")
    s2 = jitted(state, jnp.array([0.0, 0.0, 0.25, 0.25]), decay=0.9)
    assert bool(s2.initialized)
    prior = prior_from_state(s2, 8)
    assert float(prior.a) > 0 and float(prior.b) > 0


def test_bayes_gamma1_equalises_amplification_monte_carlo():
    """With gamma = 1 and the true prior, E[odds(mu)/odds(p) | k] / lambda_k = 1.

    odds(mu)/odds(p) is how much more the incorrect responses of a group are amplified than
    its correct ones (relative to the ideal advantage R - p); lambda equalises it in
    expectation over the prompts that produce each k. Without DAA (lambda = 1) the ratio is
    far above 1.
    """
    rng = np.random.default_rng(7)
    # hard prompts (mean p = 0.068); a + k > 2 keeps the variance of 1 / p finite
    a, b, g = 2.2, 30.0, 8
    p = rng.beta(a, b, 2_000_000)
    k = rng.binomial(g, p)
    cfg = DAAConfig(estimator="bayes", gamma=1.0, lambda_max=1e9, tau=0.5)
    prior = BetaPrior(jnp.asarray(a), jnp.asarray(b))
    ks = np.array([1, 2, 3])  # the hard kept groups (mu < tau = 0.5)
    lam = np.asarray(
        daa_lambda(
            jnp.asarray(ks / g), jnp.asarray(ks, jnp.float32), jnp.full(3, float(g)), cfg, prior
        )
    )
    # closed form: odds(k/G) * (b + G - k) / (a + k - 1)
    np.testing.assert_allclose(lam, _odds(ks / g) * (b + g - ks) / (a + ks - 1), rtol=1e-5)
    hard = (k >= 1) & (k < g / 2)
    k, p = k[hard], p[hard]
    rel = _odds(k / g) / _odds(p)  # per prompt: incorrect / correct amplification
    for i, kk in enumerate(ks):
        np.testing.assert_allclose(rel[k == kk].mean() / lam[i], 1.0, rtol=0.01)
    np.testing.assert_allclose((rel / lam[k - 1]).mean(), 1.0, rtol=0.01)
    assert rel.mean() > 2.5  # without DAA (lambda = 1) the incorrect responses dominate


def test_daa_inside_compute_advantages_with_bayes_jit():
    r = jnp.array([1.0, 0, 0, 0, 1, 1, 0, 0])
    prior = BetaPrior(jnp.asarray(1.0), jnp.asarray(3.0))
    f = jax.jit(compute_advantages, static_argnames=("group_size", "config", "daa"))
    adv, met = f(
        r,
        r,
        group_size=4,
        config=AdvantageConfig(norm="none"),
        daa=DAAConfig(estimator="bayes", gamma=1.0),
        prior=prior,
    )
    np.testing.assert_allclose(adv[:4], [0.75 * 2.0, -0.25, -0.25, -0.25], rtol=1e-6)
    np.testing.assert_allclose(adv[4:], [0.5, 0.5, -0.5, -0.5], rtol=1e-6)


def test_daa_config_validation():
    with pytest.raises(ValueError, match="estimator"):
        DAAConfig(estimator="magic")
    with pytest.raises(ValueError, match="lambda_max"):
        DAAConfig(lambda_max=0.5)
    with pytest.raises(ValueError, match="apply_to"):
        DAAConfig(apply_to="wrong")
