"""Dynamic sampling: keep mask, fixed-capacity order-preserving selection, buffer rounds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from da3po_jax.rl import (
    ds_add_round,
    ds_empty_buffer,
    ds_group_metrics,
    ds_keep_mask,
    ds_take,
    expand_group_mask,
    select_kept,
)


def test_keep_mask_by_accuracy_and_reward():
    correct = jnp.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0])
    rewards = jnp.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0.5, 0, 0, 0])
    np.testing.assert_array_equal(ds_keep_mask(correct, None, 4), [False, False, True, False])
    np.testing.assert_array_equal(
        ds_keep_mask(correct, rewards, 4, metric="reward"), [False, False, True, True]
    )
    # a group with a single valid response has no variance
    valid = jnp.array([1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1], bool)
    np.testing.assert_array_equal(
        ds_keep_mask(correct, None, 4, valid=valid), [False, False, False, False]
    )
    with pytest.raises(ValueError, match="metric"):
        ds_keep_mask(correct, rewards, 4, metric="length")


def test_group_metrics_hand_values():
    # 5 groups of 2: all-wrong, all-correct, mixed, mixed, all-wrong
    correct = jnp.array([0, 0, 1, 1, 1, 0, 0, 1, 0, 0])
    met = ds_group_metrics(correct, 2)
    np.testing.assert_allclose(met["ds/kept_frac"], 2 / 5)
    np.testing.assert_allclose(met["ds/all_correct_frac"], 1 / 5)
    np.testing.assert_allclose(met["ds/all_wrong_frac"], 2 / 5)
    met = ds_group_metrics(correct, 2, group_valid=jnp.array([1, 1, 1, 0, 0], bool))
    np.testing.assert_allclose(
        [met["ds/kept_frac"], met["ds/all_correct_frac"], met["ds/all_wrong_frac"]],
        [1 / 3, 1 / 3, 1 / 3],
    )
    np.testing.assert_array_equal(
        expand_group_mask(jnp.array([True, False]), 2), [True, True, False, False]
    )


def test_select_kept_hand_example():
    sel = select_kept(jnp.array([0, 1, 1, 0, 1, 1, 0, 1], bool), 3)
    np.testing.assert_array_equal(sel.indices, [1, 2, 4])
    np.testing.assert_array_equal(sel.valid, [True, True, True])
    assert int(sel.count) == 3 and int(sel.surplus_count) == 2
    np.testing.assert_array_equal(sel.surplus_indices[:2], [5, 7])
    np.testing.assert_array_equal(sel.surplus_valid, [1, 1, 0, 0, 0, 0, 0, 0])
    sel = select_kept(jnp.array([0, 1, 0], bool), 3)
    np.testing.assert_array_equal(sel.indices, [1, 0, 0])
    np.testing.assert_array_equal(sel.valid, [True, False, False])
    assert int(sel.count) == 1 and int(sel.surplus_count) == 0


_TRACES = []


def _select_traced(keep, capacity):
    _TRACES.append((keep.shape, capacity))
    return select_kept(keep, capacity)


_select_jit = jax.jit(_select_traced, static_argnums=1)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([(12, 5), (12, 16), (7, 3)]), st.floats(0.0, 1.0))
def test_select_kept_matches_numpy_reference(seed, shape, p_keep):
    n, cap = shape
    keep = np.random.default_rng(seed).random(n) < p_keep
    sel = _select_jit(jnp.asarray(keep), cap)
    kept = np.flatnonzero(keep)  # NumPy reference: kept indices in order
    first, rest = kept[:cap], kept[cap:]
    assert int(sel.count) == len(first)
    np.testing.assert_array_equal(np.asarray(sel.indices)[: len(first)], first)
    np.testing.assert_array_equal(sel.valid, np.arange(cap) < len(first))
    assert int(sel.surplus_count) == len(rest)
    np.testing.assert_array_equal(np.asarray(sel.surplus_indices)[: len(rest)], rest)
    np.testing.assert_array_equal(sel.surplus_valid, np.arange(n) < len(rest))
    assert sel.indices.shape == (cap,) and sel.surplus_indices.shape == (n,)


def test_select_kept_compiles_once_per_shape():
    before = len(_TRACES)
    for seed in range(5):
        keep = np.random.default_rng(seed).random(9) < 0.5
        _select_jit(jnp.asarray(keep), 4)
    assert len(_TRACES) - before == 1


def _round(ids, g=2):
    ids = np.asarray(ids, np.int32)
    return {"id": jnp.asarray(ids), "x": jnp.asarray(ids[:, None] * 10 + np.arange(g), jnp.float32)}


def test_buffer_rounds_hand_example():
    add = jax.jit(ds_add_round)
    buf = ds_empty_buffer(_round([0, 0, 0]), 4)
    buf, sur = add(buf, _round([1, 2, 3]), jnp.array([True, False, True]))
    np.testing.assert_array_equal(buf.items["id"], [1, 3, 0, 0])
    np.testing.assert_array_equal(buf.valid, [1, 1, 0, 0])
    assert int(buf.count) == 2 and int(sur.count) == 0
    buf, sur = add(buf, _round([4, 5, 6]), jnp.array([True, True, True]))
    np.testing.assert_array_equal(buf.items["id"], [1, 3, 4, 5])
    np.testing.assert_array_equal(buf.items["x"], [[10, 11], [30, 31], [40, 41], [50, 51]])
    assert int(buf.count) == 4
    np.testing.assert_array_equal(sur.items["id"], [6, 0, 0])
    np.testing.assert_array_equal(sur.items["x"], [[60, 61], [0, 0], [0, 0]])
    np.testing.assert_array_equal(sur.valid, [1, 0, 0])
    assert int(sur.count) == 1
    # next step: the surplus seeds an empty buffer
    nxt, _ = add(ds_empty_buffer(_round([0, 0, 0]), 4), sur.items, sur.valid)
    np.testing.assert_array_equal(nxt.items["id"], [6, 0, 0, 0])
    batch, rest = ds_take(buf, 3)
    np.testing.assert_array_equal(batch.items["id"], [1, 3, 4])
    np.testing.assert_array_equal(rest.items["id"], [5])
    assert int(batch.count) == 3 and int(rest.count) == 1


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.booleans(), min_size=5, max_size=5), min_size=1, max_size=4))
def test_buffer_rounds_match_numpy_reference(rounds):
    cap = 6
    add = jax.jit(ds_add_round)
    buf = ds_empty_buffer(_round(np.zeros(5)), cap)
    ref_buf = []
    next_id = 1
    for keep in rounds:
        ids = np.arange(next_id, next_id + 5)
        next_id += 5
        buf, sur = add(buf, _round(ids), jnp.asarray(keep))
        cand = ref_buf + [int(i) for i, k in zip(ids, keep) if k]
        ref_buf, ref_sur = cand[:cap], cand[cap:]
        np.testing.assert_array_equal(np.asarray(buf.items["id"])[: len(ref_buf)], ref_buf)
        np.testing.assert_array_equal(np.asarray(buf.items["id"])[len(ref_buf) :], 0)
        np.testing.assert_array_equal(buf.valid, np.arange(cap) < len(ref_buf))
        assert int(buf.count) == len(ref_buf)
        np.testing.assert_array_equal(np.asarray(sur.items["id"])[: len(ref_sur)], ref_sur)
        np.testing.assert_array_equal(sur.valid, np.arange(5) < len(ref_sur))
        assert int(sur.count) == len(ref_sur)
