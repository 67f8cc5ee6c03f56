"""The ragged paged decode kernel (Pallas, interpret mode on CPU) against the reference
`decode_attention`, alone and inside the model's decode step."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from da3po_jax.models.decode_kernel import ragged_decode_attention
from da3po_jax.models.transformer import decode_attention, resolve_decode

TOL = dict(rtol=1e-5, atol=1e-5)


def _inputs(s, cap, kv, g, d, seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((s, kv, g, d)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((s, cap, kv, d)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((s, cap, kv, d)), jnp.float32)
    return q, k, v


@pytest.mark.parametrize("kv, g", [(2, 3), (1, 4)])
def test_ragged_kernel_equals_the_reference(kv, g):
    # lengths: empty, inside the first page, a page boundary, the whole cache, mid-page
    lengths = jnp.asarray([0, 5, 16, 64, 33, 1], jnp.int32)
    q, k, v = _inputs(6, 64, kv, g, 32)
    got = ragged_decode_attention(q, k, v, lengths, 16)
    want = decode_attention(q, k, v, lengths, 16)
    np.testing.assert_allclose(got, want, **TOL)
    assert np.all(np.asarray(got)[0] == 0)  # no keys: exactly 0


def test_ragged_kernel_reads_nothing_past_the_live_keys():
    """Keys and values past each slot's length (NaN here) never reach the output."""
    q, k, v = _inputs(3, 48, 2, 2, 16, seed=1)
    lengths = jnp.asarray([7, 16, 30], jnp.int32)
    col = jnp.arange(48)[None, :, None, None]
    poison = col >= lengths[:, None, None, None]
    k_bad, v_bad = (jnp.where(poison, jnp.nan, x) for x in (k, v))
    got = ragged_decode_attention(q, k_bad, v_bad, lengths, 8)
    np.testing.assert_allclose(got, decode_attention(q, k, v, lengths, 8), **TOL)


def test_bad_block_is_refused():
    q, k, v = _inputs(2, 24, 1, 1, 8)
    with pytest.raises(ValueError, match="block"):
        ragged_decode_attention(q, k, v, jnp.asarray([1, 2]), 12)


def test_auto_resolves_to_ragged_on_tpu_only():
    assert resolve_decode("auto", "tpu") == "ragged"
    assert resolve_decode("auto", "cpu") == "paged"
    assert resolve_decode("auto", "gpu") == "paged"
    assert resolve_decode("ragged", "cpu") == "ragged"


def test_the_models_decode_step_through_the_kernel_and_paged_equals_blockwise():
    from flax import nnx

    from da3po_jax.models import Transformer, get_preset
    from da3po_jax.models.transformer import SlotCache

    cfg = get_preset("tiny-qwen2", dtype="float32")
    model = Transformer(dataclasses.replace(cfg, decode_attention="blockwise"), rngs=nnx.Rngs(0))
    ragged = Transformer(dataclasses.replace(cfg, decode_attention="ragged"), rngs=nnx.Rngs(0))
    paged = Transformer(dataclasses.replace(cfg, decode_attention="paged"), rngs=nnx.Rngs(0))
    s, block = 4, 16
    cache = SlotCache.init(cfg, s, 40, block)
    rng = np.random.default_rng(2)
    cache = cache.replace(
        k=tuple(jnp.asarray(rng.standard_normal(x.shape), jnp.float32) for x in cache.k),
        v=tuple(jnp.asarray(rng.standard_normal(x.shape), jnp.float32) for x in cache.v),
    )
    tokens = jnp.asarray([3, 7, 11, 5], jnp.int32)
    lengths = jnp.asarray([9, 1, 32, 20], jnp.int32)
    write = jnp.where(lengths > 1, lengths - 1, cache.max_len)  # slot 1: no write
    want, want_cache = model.decode_slots(tokens, lengths - 1, cache, write, lengths)
    got, got_cache = ragged.decode_slots(tokens, lengths - 1, cache, write, lengths)
    np.testing.assert_allclose(got, want, **TOL)
    for a, b in zip(jax.tree.leaves(got_cache), jax.tree.leaves(want_cache)):
        np.testing.assert_array_equal(a, b)
    # the pure-JAX live-pair version (the default off TPU): equal to float rounding
    got, got_cache = paged.decode_slots(tokens, lengths - 1, cache, write, lengths)
    np.testing.assert_allclose(got, want, **TOL)
    for a, b in zip(jax.tree.leaves(got_cache), jax.tree.leaves(want_cache)):
        np.testing.assert_allclose(a, b, **TOL)
