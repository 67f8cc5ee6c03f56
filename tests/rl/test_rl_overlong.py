"""Overlong soft punishment and truncation filtering against hand-computed values."""

import jax.numpy as jnp
import numpy as np
import pytest

from da3po_jax.rl import (
    OverlongConfig,
    apply_overlong,
    overlong_filter_mask,
    soft_overlong_punishment,
)


def test_soft_punishment_three_regions():
    # L_max = 20, L_buf = 5 -> L_exp = 15
    lengths = jnp.array([0, 10, 15, 16, 18, 20, 21, 40])
    r = soft_overlong_punishment(lengths, 20, 5)
    np.testing.assert_allclose(r, [0, 0, 0, -0.2, -0.6, -1.0, -1.0, -1.0], atol=1e-7)
    r = soft_overlong_punishment(lengths, 20, 5, penalty=0.5)
    np.testing.assert_allclose(r, [0, 0, 0, -0.1, -0.3, -0.5, -0.5, -0.5], atol=1e-7)


def test_soft_punishment_zero_buffer():
    r = soft_overlong_punishment(jnp.array([19, 20, 21]), 20, 0)
    np.testing.assert_allclose(r, [0, 0, -1.0])


def test_filter_mask_zeroes_truncated_rows():
    mask = jnp.array([[1, 1, 0], [1, 1, 1], [1, 0, 0]], jnp.int32)
    out = overlong_filter_mask(mask, jnp.array([False, True, False]))
    np.testing.assert_array_equal(out, [[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert out.dtype == mask.dtype
    np.testing.assert_array_equal(
        overlong_filter_mask(jnp.ones(3), jnp.array([1, 0, 1])), [0, 1, 0]
    )


def test_apply_overlong_adds_to_reward():
    cfg = OverlongConfig(max_len=20, buffer=5, penalty=1.0, filter=True)
    r, m = apply_overlong(
        jnp.array([1.0, 1.0, 0.0]),
        jnp.array([10, 18, 20]),
        jnp.array([False, False, True]),
        jnp.ones((3, 2)),
        cfg,
    )
    np.testing.assert_allclose(r, [1.0, 0.4, -1.0], atol=1e-6)
    np.testing.assert_array_equal(m, [[1, 1], [1, 1], [0, 0]])
    r, m = apply_overlong(
        jnp.array([1.0]),
        jnp.array([18]),
        jnp.array([True]),
        jnp.ones((1, 2)),
        OverlongConfig(max_len=20),
    )
    np.testing.assert_allclose(r, [1.0])
    np.testing.assert_array_equal(m, [[1, 1]])


def test_overlong_config_validation():
    with pytest.raises(ValueError, match="OverlongConfig.buffer=11 exceeds max_len=10"):
        OverlongConfig(max_len=10, buffer=11)
