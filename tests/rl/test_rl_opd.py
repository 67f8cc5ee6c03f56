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
