"""Decoupled-clip policy loss: hand-computed values, gradients, micro-batching invariance."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from da3po_jax.rl import AGG_MODES, LossConfig, da3po_loss, loss_normalizer

RHOS = np.array([0.5, 0.9, 1.5, 4.0])


def _rho_batch(adv_row_values):
    """Rows of tokens with ratios RHOS (logp_old = -1, logp_new = log(rho) - 1)."""
    b = len(adv_row_values)
    logp_old = -np.ones((b, 4), np.float32)
    logp_new = (np.log(RHOS) - 1.0)[None].repeat(b, 0).astype(np.float32)
    return jnp.asarray(logp_new), jnp.asarray(logp_old), jnp.asarray(adv_row_values, jnp.float32)


def test_clip_at_both_bounds_and_dual_clip_only_negative():
    # eps_low 0.2, eps_high 0.28, c = 3; per token l = max(-A rho, -A clip(rho, .8, 1.28)),
    # then min(l, -A c) only for A < 0.
    # A = +1: rho .5 -> -.5, .9 -> -.9, 1.5 -> -1.28, 4 -> -1.28
    # A = -1: rho .5 -> .8, .9 -> .9, 1.5 -> 1.5, 4 -> min(4, 3) = 3
    # A = +2: rho 4 -> -2.56 (no dual clip: -A c = -6 would be smaller)
    new, old, adv = _rho_batch([1.0, -1.0, 2.0])
    mask = jnp.ones((3, 4))
    cfg = LossConfig(agg="token-mean")
    expected_rows = np.array(
        [[-0.5, -0.9, -1.28, -1.28], [0.8, 0.9, 1.5, 3.0], [-1.0, -1.8, -2.56, -2.56]]
    )
    for r in range(3):
        loss, met = da3po_loss(
            new[r : r + 1], old[r : r + 1], adv[r : r + 1], mask[r : r + 1], config=cfg
        )
        np.testing.assert_allclose(loss, expected_rows[r].mean(), rtol=1e-6)
    loss, met = da3po_loss(new, old, adv, mask, config=cfg)
    np.testing.assert_allclose(loss, expected_rows.mean(), rtol=1e-6)
    np.testing.assert_allclose(met["loss/clipfrac_high"], 4 / 12, rtol=1e-6)  # A>0, rho>1.28
    np.testing.assert_allclose(met["loss/clipfrac_low"], 1 / 12, rtol=1e-6)  # A<0, rho<0.8
    np.testing.assert_allclose(met["loss/clipfrac_dual"], 1 / 12, rtol=1e-6)  # A<0, rho>3
    np.testing.assert_allclose(met["loss/ratio_mean"], RHOS.mean(), rtol=1e-6)
    np.testing.assert_allclose(met["loss/ratio_max"], 4.0, rtol=1e-6)
    kl = RHOS - 1 - np.log(RHOS)  # k3 estimate of KL(old || new)
    np.testing.assert_allclose(met["loss/approx_kl"], kl.mean(), rtol=1e-5)


def test_gradient_of_clip_cases_hand_values():
    # d l / d logp_new = -A rho where the unclipped branch is active, else 0; / N = 4
    new, old, adv = _rho_batch([1.0, -1.0])
    mask = jnp.ones((2, 4))
    g = jax.grad(lambda x: da3po_loss(x, old, adv, mask)[0])(new)
    np.testing.assert_allclose(
        g, np.array([[-0.5, -0.9, 0, 0], [0, 0.9, 1.5, 0]]) / 8, rtol=1e-6, atol=1e-8
    )


def test_dual_clip_disabled_with_inf():
    new, old, adv = _rho_batch([-1.0, 1.0])
    loss, _ = da3po_loss(new[:1], old[:1], adv[:1], jnp.ones((1, 4)), clip_ratio_c=float("inf"))
    np.testing.assert_allclose(loss, np.mean([0.8, 0.9, 1.5, 4.0]), rtol=1e-6)
    g = jax.grad(lambda x: da3po_loss(x, old, adv, jnp.ones((2, 4)), clip_ratio_c=float("inf"))[0])(
        new
    )
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g[0], np.array([0, 0.9, 1.5, 4.0]) / 8, rtol=1e-6)


def _agg_batch():
    """rho = 1 everywhere so l = -A. Rows: 3 tokens, 1 token, empty, 2 tokens."""
    mask = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]], jnp.float32)
    nan = np.nan  # advantages on padding are ignored
    adv = jnp.array([[1.0, 2, 3, nan], [4, 99, 99, 99], [nan, 99, 99, 99], [-1, -3, 99, 99]])
    logp = jnp.where(mask > 0, -1.0, -jnp.inf)  # garbage on padding must not leak
    return logp, adv, mask


# sum(m l) = -6 - 4 + 4 = -6; N = 6, B = 3 non-empty rows, T = 4; row means -2, -4, 2
AGG_EXPECTED = {
    "token-mean": -6 / 6,
    "seq-mean-token-mean": (-2 - 4 + 2) / 3,
    "seq-mean-token-sum": -6 / 3,
    "seq-mean-token-sum-norm": -6 / 12,
}
NORM_EXPECTED = {
    "token-mean": 6,
    "seq-mean-token-mean": 3,
    "seq-mean-token-sum": 3,
    "seq-mean-token-sum-norm": 12,
}


@pytest.mark.parametrize("agg", AGG_MODES)
def test_aggregation_modes_hand_values(agg):
    logp, adv, mask = _agg_batch()
    loss, met = da3po_loss(logp, logp, adv, mask, agg=agg)
    np.testing.assert_allclose(loss, AGG_EXPECTED[agg], rtol=1e-6)
    np.testing.assert_allclose(loss_normalizer(mask, agg), NORM_EXPECTED[agg])
    g = jax.grad(lambda x: da3po_loss(x, logp, adv, mask, agg=agg)[0])(logp)
    assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[2] == 0)
    assert all(np.isfinite(v) for v in met.values())


@pytest.mark.parametrize("agg", AGG_MODES)
def test_empty_mask_gives_zero_not_nan(agg):
    z = jnp.zeros((2, 3))
    loss, met = da3po_loss(z, z, jnp.ones(2), z, agg=agg)
    assert float(loss) == 0.0
    assert all(np.isfinite(v) for v in met.values())
    g = jax.grad(lambda x: da3po_loss(x, z, jnp.ones(2), z, agg=agg)[0])(z)
    np.testing.assert_array_equal(g, np.zeros((2, 3)))


def test_kl_k1_k3_hand_values():
    new = jnp.array([[-1.0, -2.0]])
    ref = jnp.array([[-1.5, -1.0]])
    mask = jnp.ones((1, 2))
    # A = 0 so only the KL term remains; k1 = new - ref = [0.5, -1.0]
    loss, met = da3po_loss(
        new, new, jnp.zeros(1), mask, logp_ref=ref, kl_coef=0.1, kl_estimator="k1"
    )
    np.testing.assert_allclose(loss, 0.1 * (0.5 - 1.0) / 2, rtol=1e-6)
    np.testing.assert_allclose(met["loss/pg"], 0.0, atol=1e-8)
    # k3 with x = ref - new = [-0.5, 1.0]: e^-0.5 + 0.5 - 1 = 0.1065307, e - 2 = 0.7182818
    loss, met = da3po_loss(new, new, jnp.zeros(1), mask, logp_ref=ref, kl_coef=0.1)
    np.testing.assert_allclose(loss, 0.1 * (0.1065307 + 0.7182818) / 2, rtol=1e-6)
    np.testing.assert_allclose(met["loss/kl_ref"], (0.1065307 + 0.7182818) / 2, rtol=1e-6)
    # k3 clamped at 10: x = 5 gives e^5 - 6 = 142.4
    loss, _ = da3po_loss(new, new, jnp.zeros(1), mask, logp_ref=new + 5.0, kl_coef=1.0)
    np.testing.assert_allclose(loss, 10.0, rtol=1e-6)
    # gradient of k3: d/dlogp [e^(ref - logp) - (ref - logp) - 1] = 1 - e^(ref - logp)
    g = jax.grad(lambda x: da3po_loss(x, new, jnp.zeros(1), mask, logp_ref=ref, kl_coef=0.1)[0])(
        new
    )
    np.testing.assert_allclose(g, 0.1 * (1 - np.exp([[-0.5, 1.0]])) / 2, rtol=1e-5)


def test_sequence_level_ratio_gspo():
    # d = [0.1, 0.5, (pad)] -> sequence d = 0.3 for both tokens; rho = e^0.3 = 1.3498588
    old = jnp.zeros((1, 3))
    new = jnp.array([[0.1, 0.5, 7.0]])
    mask = jnp.array([[1.0, 1.0, 0.0]])
    loss, met = da3po_loss(new, old, jnp.ones(1), mask, ratio_level="sequence", eps_high=1.0)
    np.testing.assert_allclose(loss, -np.exp(0.3), rtol=1e-6)
    np.testing.assert_allclose(met["loss/ratio_max"], np.exp(0.3), rtol=1e-6)
    g = jax.grad(
        lambda x: da3po_loss(x, old, jnp.ones(1), mask, ratio_level="sequence", eps_high=1.0)[0]
    )(new)
    np.testing.assert_allclose(g, [[-np.exp(0.3) / 2, -np.exp(0.3) / 2, 0.0]], rtol=1e-6)
    # clipped at 1.28 for every token (token level would give mean(-e^0.1, -1.28))
    loss, _ = da3po_loss(new, old, jnp.ones(1), mask, ratio_level="sequence")
    np.testing.assert_allclose(loss, -1.28, rtol=1e-6)
    loss_tok, _ = da3po_loss(new, old, jnp.ones(1), mask)
    np.testing.assert_allclose(loss_tok, -(np.exp(0.1) + 1.28) / 2, rtol=1e-6)


def test_log_ratio_clamped_at_20():
    loss, met = da3po_loss(
        jnp.array([[30.0]]), jnp.zeros((1, 1)), -jnp.ones(1), jnp.ones((1, 1)), clip_ratio_c=1e12
    )
    np.testing.assert_allclose(loss, np.exp(20.0), rtol=1e-5)


def test_entropy_metric_from_logits_or_array():
    mask = jnp.array([[1.0, 1.0]])
    logits = jnp.array([[[0.0, 0, 0, 0], [0.0, np.log(3.0), -np.inf, -np.inf]]])
    _, met = da3po_loss(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.ones(1), mask, logits=logits)
    h2 = -(0.25 * np.log(0.25) + 0.75 * np.log(0.75))  # 0.5623351
    np.testing.assert_allclose(met["loss/entropy"], (np.log(4.0) + h2) / 2, rtol=1e-6)
    _, met = da3po_loss(
        jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.ones(1), mask, entropy=jnp.array([[1.0, 3.0]])
    )
    np.testing.assert_allclose(met["loss/entropy"], 2.0)


def test_amplified_clip_fraction_metric():
    new, old, adv = _rho_batch([1.0, 1.0])
    _, met = da3po_loss(new, old, adv, jnp.ones((2, 4)), amplified=jnp.array([True, False]))
    np.testing.assert_allclose(met["loss/clipfrac_high_amplified"], 2 / 4)


def test_config_and_overrides():
    with pytest.raises(ValueError, match="agg"):
        LossConfig(agg="mean")
    with pytest.raises(ValueError, match="clip_ratio_c"):
        LossConfig(clip_ratio_c=0.5)
    with pytest.raises(TypeError, match="eps_hi"):
        da3po_loss(jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.ones(1), jnp.ones((1, 1)), eps_hi=1)
    cfg = LossConfig(eps_high=0.5)
    assert dataclasses.replace(cfg, eps_high=0.5) == cfg and hash(cfg) == hash(
        LossConfig(eps_high=0.5)
    )
    new, old, adv = _rho_batch([1.0])
    a, _ = da3po_loss(new, old, adv, jnp.ones((1, 4)), config=cfg)
    b, _ = da3po_loss(new, old, adv, jnp.ones((1, 4)), eps_high=0.5)
    np.testing.assert_allclose(a, b)
    np.testing.assert_allclose(a, np.mean([-0.5, -0.9, -1.5, -1.5]), rtol=1e-6)


def test_works_inside_user_jit_and_vmap_normalizer():
    logp, adv, mask = _agg_batch()
    f = jax.jit(lambda x: jax.value_and_grad(lambda y: da3po_loss(y, logp, adv, mask)[0])(x))
    loss, g = f(logp)
    np.testing.assert_allclose(loss, AGG_EXPECTED["token-mean"], rtol=1e-6)
    # data parallel: psum over a mapped axis equals the whole-batch normaliser
    shards = mask.reshape(2, 2, 4)
    for agg in AGG_MODES:
        n = jax.vmap(lambda m, a=agg: loss_normalizer(m, a, axis_name="dp"), axis_name="dp")(shards)
        np.testing.assert_allclose(n, [NORM_EXPECTED[agg]] * 2)


# ---------------------------------------------------------------------------------------
# Independent NumPy implementation of the formula, for value and gradient checks.


def _np_loss(new, old, adv, mask, ref, cfg: LossConfig, normalizer=None):
    m = mask.astype(np.float64)
    d = np.clip(new - old, -cfg.log_ratio_clamp, cfg.log_ratio_clamp) * m
    if cfg.ratio_level == "sequence":
        d = np.repeat((d.sum(1) / np.maximum(m.sum(1), 1))[:, None], d.shape[1], 1)
    rho = np.exp(d)
    a = adv[:, None] * np.ones_like(m)
    l1, l2 = -a * rho, -a * np.clip(rho, 1 - cfg.eps_low, 1 + cfg.eps_high)
    loss = np.maximum(l1, l2)
    loss = np.where(a < 0, np.minimum(loss, -a * cfg.clip_ratio_c), loss)
    if ref is not None:
        if cfg.kl_estimator == "k1":
            kl = new - ref
        else:
            kl = np.clip(np.exp(ref - new) - (ref - new) - 1, -10, 10)
        loss = loss + cfg.kl_coef * kl
    rows = m.sum(1) > 0
    if cfg.agg == "seq-mean-token-mean":
        total = ((m * loss).sum(1)[rows] / m.sum(1)[rows]).sum()
    else:
        total = (m * loss).sum()
    if normalizer is None:
        normalizer = {
            "token-mean": m.sum(),
            "seq-mean-token-mean": rows.sum(),
            "seq-mean-token-sum": rows.sum(),
            "seq-mean-token-sum-norm": rows.sum() * m.shape[1],
        }[cfg.agg]
    return total / normalizer


GRAD_CONFIGS = [
    LossConfig(),
    LossConfig(agg="seq-mean-token-mean", kl_coef=0.05, kl_estimator="k1"),
    LossConfig(agg="seq-mean-token-sum", kl_coef=0.1, clip_ratio_c=2.0),
    LossConfig(agg="seq-mean-token-sum-norm", ratio_level="sequence", kl_coef=0.02),
    LossConfig(ratio_level="sequence", eps_low=0.1, eps_high=0.1),
]


@pytest.mark.parametrize("cfg", GRAD_CONFIGS, ids=lambda c: f"{c.agg}-{c.ratio_level}")
def test_gradient_matches_numpy_finite_differences(cfg):
    rng = np.random.default_rng(0)
    b, t = 5, 6
    old = rng.normal(-1.5, 0.5, (b, t))
    new = old + rng.normal(0, 0.4, (b, t))
    ref = old + rng.normal(0, 0.3, (b, t))
    adv = rng.normal(0, 1.0, b)
    mask = (np.arange(t)[None] < np.array([6, 3, 0, 1, 5])[:, None]).astype(np.float64)
    with jax.enable_x64(True):
        args = [jnp.asarray(x, jnp.float64) for x in (new, old, adv, mask, ref)]
        loss, _ = da3po_loss(args[0], args[1], args[2], args[3], logp_ref=args[4], config=cfg)
        grad = np.asarray(
            jax.grad(
                lambda x: da3po_loss(x, args[1], args[2], args[3], logp_ref=args[4], config=cfg)[0]
            )(args[0])
        )
    np.testing.assert_allclose(loss, _np_loss(new, old, adv, mask, ref, cfg), rtol=1e-12)
    h = 1e-6
    fd = np.zeros_like(new)
    for i in range(b):
        for j in range(t):
            e = np.zeros_like(new)
            e[i, j] = h
            fd[i, j] = (
                _np_loss(new + e, old, adv, mask, ref, cfg)
                - _np_loss(new - e, old, adv, mask, ref, cfg)
            ) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-9)
    assert np.abs(grad).max() > 1e-3  # the check is not vacuous


# ---------------------------------------------------------------------------------------
# Micro-batching invariance.


@pytest.mark.parametrize("agg", AGG_MODES)
def test_micro_batching_invariance(agg):
    rng = np.random.default_rng(1)
    b, t = 8, 6
    lengths = np.array([6, 0, 2, 4, 1, 5, 6, 3])  # micro-batch 1 has an empty row
    mask = jnp.asarray((np.arange(t)[None] < lengths[:, None]).astype(np.float32))
    old = jnp.asarray(rng.normal(-1.0, 0.3, (b, t)), jnp.float32)
    new = old + jnp.asarray(rng.normal(0, 0.1, (b, t)), jnp.float32)
    adv = jnp.asarray(rng.normal(0, 1, b), jnp.float32)
    cfg = LossConfig(agg=agg)

    def grad_of(lo, hi, normalizer):
        f = lambda x: da3po_loss(
            x, old[lo:hi], adv[lo:hi], mask[lo:hi], config=cfg, normalizer=normalizer
        )
        return jax.value_and_grad(lambda x: f(x)[0])(new[lo:hi])

    full_loss, full_grad = grad_of(0, b, None)
    n_global = loss_normalizer(mask, agg)
    n_parts = [loss_normalizer(mask[:4], agg), loss_normalizer(mask[4:], agg)]
    np.testing.assert_allclose(sum(n_parts), n_global)  # every mode is a sum over rows
    parts = [grad_of(0, 4, n_global), grad_of(4, 8, n_global)]
    np.testing.assert_allclose(parts[0][0] + parts[1][0], full_loss, rtol=1e-5)
    np.testing.assert_allclose(
        jnp.concatenate([parts[0][1], parts[1][1]]), full_grad, rtol=1e-5, atol=1e-7
    )
    # each micro-batch with its own normaliser (averaged over micro-batches) is different
    assert float(n_parts[0]) != float(n_parts[1])
    local = [grad_of(0, 4, n_parts[0]), grad_of(4, 8, n_parts[1])]
    local_grad = jnp.concatenate([local[0][1], local[1][1]]) / 2
    assert np.abs(local_grad - full_grad).max() > 1e-3


def test_approx_kl_uses_token_ratio_at_sequence_level():
    # token d = [0.1, 0.5]: approx KL = mean(e^d - 1 - d), not that of the sequence mean 0.3
    new, old, mask = jnp.array([[0.1, 0.5]]), jnp.zeros((1, 2)), jnp.ones((1, 2))
    _, met = da3po_loss(new, old, jnp.ones(1), mask, ratio_level="sequence")
    expected = np.mean(np.expm1([0.1, 0.5]) - np.array([0.1, 0.5]))
    np.testing.assert_allclose(met["loss/approx_kl"], expected, rtol=1e-5)


def test_k3_gradient_finite_when_reference_far_above_policy():
    """ref - logp = 99: exp(99) overflows float32, so without clamping the log-ratio before
    the exp the forward is the clamp value 10 but the gradient is inf * 0 = NaN."""
    new = jnp.asarray([[-100.0, -1.0]])
    ref = jnp.asarray([[-1.0, -1.0]])
    mask = jnp.ones((1, 2))

    def f(x):
        return da3po_loss(x, x, jnp.zeros(1), mask, logp_ref=ref, kl_coef=1.0)[0]

    loss, grad = jax.value_and_grad(f)(new)
    # token 1: x = clamp(99, +-20) = 20 -> k3 = e^20 - 21 -> clamped to 10; token 2: k3 = 0
    np.testing.assert_allclose(loss, (10.0 + 0.0) / 2, rtol=1e-6)
    assert np.all(np.isfinite(np.asarray(grad)))
    np.testing.assert_array_equal(np.asarray(grad), 0.0)  # both tokens on a flat part


def test_truncated_importance_weights_hand_values():
    """w = min(pi_old / mu, C) per token multiplies the clipped policy term only."""
    old = jnp.log(jnp.asarray([[0.2, 0.5, 0.9]]))
    mu = jnp.log(jnp.asarray([[0.4, 0.1, 0.9]]))  # pi_old / mu = 0.5, 5 (-> C = 2), 1
    new = old  # rho = 1: the clipped term is -A per token
    mask = jnp.ones((1, 3))
    adv = jnp.asarray([1.0])
    loss, met = da3po_loss(new, old, adv, mask, logp_behavior=mu, tis_cap=2.0)
    np.testing.assert_allclose(loss, -(0.5 + 2.0 + 1.0) / 3, rtol=1e-6)
    np.testing.assert_allclose(met["loss/tis_weight_mean"], 3.5 / 3, rtol=1e-6)
    np.testing.assert_allclose(met["loss/tis_capped_frac"], 1 / 3, rtol=1e-6)
    # the gradient is -A * w * rho / N per token (w is not differentiated)
    g = jax.grad(lambda x: da3po_loss(x, old, adv, mask, logp_behavior=mu, tis_cap=2.0)[0])(new)
    np.testing.assert_allclose(g, -np.array([[0.5, 2.0, 1.0]]) / 3, rtol=1e-6)
    # tis_cap = 0 (the default) or no behaviour log-probs: no weighting
    for kwargs in ({"logp_behavior": mu}, {"tis_cap": 2.0}):
        loss0, met0 = da3po_loss(new, old, adv, mask, **kwargs)
        np.testing.assert_allclose(loss0, -1.0, rtol=1e-6)
        assert "loss/tis_weight_mean" not in met0
    # the KL term is not weighted
    ref = old - 1.0
    lk, _ = da3po_loss(
        new, old, jnp.zeros(1), mask, logp_ref=ref, kl_coef=1.0, logp_behavior=mu, tis_cap=2.0
    )
    np.testing.assert_allclose(lk, np.exp(-1.0) + 1.0 - 1.0, rtol=1e-6)
    with pytest.raises(ValueError, match="tis_cap"):
        LossConfig(tis_cap=-1.0)


def test_amplified_clip_fraction_counts_amplified_tokens():
    new, old, adv = _rho_batch([1.0, 1.0])
    mask = jnp.ones((2, 4))
    _, met = da3po_loss(new, old, adv, mask, amplified=jnp.array([True, False]))
    np.testing.assert_allclose(met["loss/num_amplified_tokens"], 4.0)


def test_decoupled_objective_hand_values():
    """Partial rollouts (docs/algorithms.md, "Partial rollouts"): the ratio and its clip
    are against the proximal policy (logp_old = the step's weights), the behaviour policy
    that sampled (older weights) enters only through w = min(pi_prox / mu, C)."""
    prox = jnp.log(jnp.asarray([[0.5, 0.5, 0.4]]))
    mu = jnp.log(jnp.asarray([[0.25, 0.5, 0.8]]))  # w = 2, 1, 0.5
    new = jnp.log(jnp.asarray([[0.6, 0.8, 0.4]]))  # rho = 1.2, 1.6 (-> 1.28), 1.0
    mask, adv = jnp.ones((1, 3)), jnp.asarray([1.0])
    loss, _ = da3po_loss(new, prox, adv, mask, logp_behavior=mu, tis_cap=2.0)
    np.testing.assert_allclose(loss, -(2 * 1.2 + 1 * 1.28 + 0.5 * 1.0) / 3, rtol=1e-6)
    # clipping against the behaviour policy instead (the coupled objective) differs:
    # rho = 2.4 (-> 1.28), 1.6 (-> 1.28), 0.5, unweighted
    coupled, _ = da3po_loss(new, mu, adv, mask)
    np.testing.assert_allclose(coupled, -(1.28 + 1.28 + 0.5) / 3, rtol=1e-6)
