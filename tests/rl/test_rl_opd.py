"""On-policy distillation advantages and the RA-OPD mask against hand-computed values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from da3po_jax.rl import (
    OPDConfig,
    RAOPDConfig,
    da3po_loss,
    distillation_return,
    opd_advantages,
    ra_opd_mask,
)

STUDENT = jnp.array([[-1.0, -2.0, -3.0]])
TEACHER = jnp.array([[-1.5, -1.0, -9.0]])
MASK = jnp.array([[1.0, 1.0, 0.0]])


def test_opd_advantages_undiscounted():
    # k = student - teacher = [0.5, -1.0]; A = -coef k with coef 2
    adv = opd_advantages(STUDENT, TEACHER, MASK, config=OPDConfig(coef=2.0))
    np.testing.assert_allclose(adv, [[-1.0, 2.0, 0.0]])


def test_opd_advantages_discounted_with_outcome():
    # r = [-1, 2, 0], gamma 0.5: A_1 = 2, A_0 = -1 + 0.5 * 2 = 0; + outcome 0.3 on tokens
    adv = opd_advantages(
        STUDENT,
        TEACHER,
        MASK,
        config=OPDConfig(coef=2.0, gamma=0.5, with_outcome=True),
        outcome_advantages=jnp.array([0.3]),
    )
    np.testing.assert_allclose(adv, [[0.3, 2.3, 0.0]], rtol=1e-6)
    with pytest.raises(ValueError, match="outcome"):
        opd_advantages(STUDENT, TEACHER, MASK, config=OPDConfig(with_outcome=True))


def test_opd_discount_matches_loop_reference():
    rng = np.random.default_rng(0)
    s, t = rng.normal(-1, 1, (3, 7)), rng.normal(-1, 1, (3, 7))
    m = (np.arange(7)[None] < np.array([7, 4, 0])[:, None]).astype(np.float32)
    adv = jax.jit(opd_advantages, static_argnames="config")(
        jnp.asarray(s), jnp.asarray(t), jnp.asarray(m), config=OPDConfig(coef=0.5, gamma=0.9)
    )
    r = -0.5 * (s - t) * m
    ref = np.zeros_like(r)
    for b in range(3):
        acc = 0.0
        for j in reversed(range(7)):
            acc = r[b, j] + 0.9 * acc
            ref[b, j] = acc
    np.testing.assert_allclose(adv, ref * m, rtol=1e-5, atol=1e-6)
    loss, _ = da3po_loss(
        jnp.asarray(s, jnp.float32), jnp.asarray(s, jnp.float32), adv, jnp.asarray(m)
    )
    np.testing.assert_allclose(loss, -(ref * m).sum() / m.sum(), rtol=1e-5)


def test_distillation_return():
    # D = (-1.5 + 1) + (-1 + 2) = 0.5; the masked position is ignored
    np.testing.assert_allclose(distillation_return(STUDENT, TEACHER, MASK), [0.5])


def test_ra_opd_mask_hand_values():
    d = jnp.array([1.0, -1.0, 0.5, -0.2])
    c = jnp.array([1, 1, 0, 0])
    keep, met = ra_opd_mask(d, c)
    np.testing.assert_array_equal(keep, [True, False, False, True])
    np.testing.assert_allclose(
        [
            met["ra_opd/kept_frac"],
            met["ra_opd/aligned_frac_correct"],
            met["ra_opd/aligned_frac_incorrect"],
        ],
        [0.5, 0.5, 0.5],
    )
    keep, _ = ra_opd_mask(d, c, config=RAOPDConfig(delta=0.3))
    np.testing.assert_array_equal(keep, [True, False, False, False])
    # group mean (G = 2): [1, -1] - 0 and [0.5, -0.2] - 0.15 = [0.35, -0.35]
    keep, _ = ra_opd_mask(
        d, jnp.array([0, 1, 1, 0]), config=RAOPDConfig(baseline="group_mean"), group_size=2
    )
    np.testing.assert_array_equal(keep, [False, False, True, True])
    keep, _ = ra_opd_mask(
        d,
        jnp.array([0, 1, 1, 0]),
        config=RAOPDConfig(baseline="group_mean", delta=0.4),
        group_size=2,
    )
    np.testing.assert_array_equal(keep, [False, False, False, False])
    with pytest.raises(ValueError, match="baseline"):
        RAOPDConfig(baseline="median")


def test_ra_opd_mask_boundaries_and_valid():
    # D exactly at the margin is not aligned (strict inequalities), for both verdicts
    d = jnp.array([0.0, 0.0, 0.3, -0.3])
    c = jnp.array([1, 0, 1, 0])
    keep, _ = ra_opd_mask(d, c)
    np.testing.assert_array_equal(keep, [False, False, True, True])
    keep, _ = ra_opd_mask(d, c, config=RAOPDConfig(delta=0.3))
    np.testing.assert_array_equal(keep, [False, False, False, False])
    # invalid trajectories are never kept and do not count in the fractions
    keep, met = ra_opd_mask(d, c, valid=jnp.array([True, True, True, False]))
    np.testing.assert_array_equal(keep, [False, False, True, False])
    np.testing.assert_allclose(met["ra_opd/kept_frac"], 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(met["ra_opd/aligned_frac_correct"], 0.5)
    np.testing.assert_allclose(met["ra_opd/aligned_frac_incorrect"], 0.0)
    # nothing valid: empty keep, metrics 0 (not NaN)
    keep, met = ra_opd_mask(d, c, valid=jnp.zeros(4, bool))
    assert not keep.any()
    assert all(float(v) == 0.0 for v in met.values())
    # group mean over valid members only: group 0 = {2.0, 1.0} (mean 1.5), group 1 = {-1.0}
    keep, _ = ra_opd_mask(
        jnp.array([2.0, 1.0, -1.0, 9.0]),
        jnp.array([1, 1, 0, 1]),
        config=RAOPDConfig(baseline="group_mean"),
        group_size=2,
        valid=jnp.array([True, True, True, False]),
    )
    np.testing.assert_array_equal(keep, [True, False, False, False])


def test_opd_advantages_degenerate():
    # teacher = student: all zero; empty mask: zero; coef 0 (no teacher signal) is refused
    zeros = opd_advantages(STUDENT, STUDENT, MASK, config=OPDConfig(gamma=0.7))
    np.testing.assert_array_equal(zeros, np.zeros((1, 3)))
    with pytest.raises(ValueError, match=r"OPDConfig.coef=0.0 must be > 0"):
        OPDConfig(coef=0.0)
    np.testing.assert_array_equal(
        opd_advantages(STUDENT, TEACHER, jnp.zeros((1, 3))), np.zeros((1, 3))
    )
    np.testing.assert_array_equal(distillation_return(STUDENT, TEACHER, jnp.zeros((1, 3))), [0])
    # gamma = 1: the undiscounted reward-to-go
    adv = opd_advantages(STUDENT, TEACHER, MASK, config=OPDConfig(gamma=1.0))
    # r = -(student - teacher) = [-0.5, 1.0]: A_1 = 1.0, A_0 = -0.5 + 1.0
    np.testing.assert_allclose(adv, [[0.5, 1.0, 0.0]])


def test_per_token_advantages_in_the_loss():
    """[B, T] advantages that are constant per row give the loss and gradient of the [B]
    form; and with a shared normaliser, micro-batches sum to the full-batch gradient."""
    rng = np.random.default_rng(1)
    lp_old = jnp.asarray(rng.normal(-1.0, 0.3, (4, 5)), jnp.float32)
    lp_new = lp_old + jnp.asarray(rng.normal(0.0, 0.2, (4, 5)), jnp.float32)
    m = jnp.asarray(np.arange(5)[None] < np.array([5, 3, 1, 4])[:, None], jnp.float32)
    a_row = jnp.array([1.0, -0.5, 2.0, -1.5])
    grad = jax.grad(lambda x, a: da3po_loss(x, lp_old, a, m)[0])
    np.testing.assert_allclose(
        grad(lp_new, a_row), grad(lp_new, jnp.broadcast_to(a_row[:, None], (4, 5))), rtol=1e-6
    )
    a_tok = jnp.asarray(rng.normal(0.0, 1.0, (4, 5)), jnp.float32)
    full = jax.grad(lambda x: da3po_loss(x, lp_old, a_tok, m)[0])(lp_new)
    norm = m.sum()
    parts = [
        jax.grad(lambda x, s=s: da3po_loss(x, lp_old[s], a_tok[s], m[s], normalizer=norm)[0])(
            lp_new[s]
        )
        for s in (slice(0, 2), slice(2, 4))
    ]
    np.testing.assert_allclose(jnp.concatenate(parts), full, rtol=1e-6, atol=1e-7)


def test_exported_from_rl_and_lazily_from_the_top_level():
    import da3po_jax
    import da3po_jax.rl as rl

    for name in (
        "OPDConfig",
        "RAOPDConfig",
        "distillation_return",
        "opd_advantages",
        "ra_opd_mask",
    ):
        assert name in rl.__all__ and name in da3po_jax.__all__
        assert getattr(da3po_jax, name) is getattr(rl, name)
