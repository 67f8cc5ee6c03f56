"""Self-attention implementations (models/attention.py) agree with the reference and with an
independent per-sequence computation; blockwise memory grows linearly and skips blocks."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from da3po_jax.models import attention as attn

TOL = dict(rtol=1e-5, atol=1e-5)  # float32 parity
# bfloat16 keeps 8 mantissa bits (relative rounding 2^-8 ~ 4e-3 per value); sums of a few
# dozen rounded products stay within 2e-2 of each other.
BF16_TOL = 2e-2
T = 45  # not a multiple of any block below


def _layout(name: str, t: int = T) -> np.ndarray:
    """[B, t] segment ids of a named batch layout."""
    if name == "left_padded":
        seg = np.zeros((3, t), np.int32)
        for b, pad in enumerate((0, 7, 30)):
            seg[b, pad:] = 1
    elif name == "packed":  # several sequences per row, trailing padding, rows differ
        seg = np.zeros((2, t), np.int32)
        seg[0, :10], seg[0, 10:30], seg[0, 30:40] = 1, 2, 3
        seg[1, :3], seg[1, 3:4], seg[1, 4:33] = 1, 2, 3
    elif name == "mixed":  # left-padded, packed and full rows in one batch
        seg = np.zeros((3, t), np.int32)
        seg[0, 12:] = 1
        seg[1, :20], seg[1, 20:41] = 1, 2
        seg[2, :] = 1
    else:
        raise KeyError(name)
    return seg


def _inputs(seg: np.ndarray, kv: int = 2, groups: int = 3, d: int = 8, dtype=jnp.float32, seed=0):
    b, t = seg.shape
    r = np.random.default_rng(seed)
    q = jnp.asarray(r.normal(size=(b, t, kv, groups, d)), dtype)
    k = jnp.asarray(r.normal(size=(b, t, kv, d)), dtype)
    v = jnp.asarray(r.normal(size=(b, t, kv, d)), dtype)
    w = jnp.asarray(r.normal(size=(b, t, kv, groups, d)), jnp.float32)
    return q, k, v, jnp.asarray(seg), w


def _value_and_grads(fn, q, k, v, seg, w, **kw):
    """Output and d(sum(out * w))/d(q, k, v), jitted."""

    def loss(q, k, v):
        out = fn(q, k, v, seg, **kw)
        return jnp.sum(out.astype(jnp.float32) * w), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return out, grads


def _assert_parity(fn, q, k, v, seg, w, tol=TOL, **kw):
    out, grads = _value_and_grads(fn, q, k, v, seg, w, **kw)
    ref, ref_grads = _value_and_grads(attn.attention_naive, q, k, v, seg, w)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), **tol)
    for name, g, rg in zip("qkv", grads, ref_grads):
        np.testing.assert_allclose(np.asarray(g), np.asarray(rg), **tol, err_msg=f"d{name}")


def _per_sequence_reference(q, k, v, seg):
    """Each segment alone through plain causal softmax attention in numpy; padding -> 0."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    out = np.zeros(q.shape)
    for b in range(seg.shape[0]):
        for s in set(seg[b].tolist()) - {0}:
            idx = np.flatnonzero(seg[b] == s)
            qs, ks, vs = q[b, idx], k[b, idx], v[b, idx]  # [n, kv, g, d], [n, kv, d]
            scores = np.einsum("tkgd,skd->kgts", qs, ks) / math.sqrt(q.shape[-1])
            n = len(idx)
            scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
            p = np.exp(scores - scores.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            out[b, idx] = np.einsum("kgts,skd->tkgd", p, vs)
    return out


@pytest.mark.parametrize("impl", ["naive", "blockwise"])
@pytest.mark.parametrize("layout", ["left_padded", "packed", "mixed"])
def test_matches_independent_per_sequence_attention(impl, layout):
    seg = _layout(layout)
    q, k, v, seg_j, _ = _inputs(seg)
    fn = jax.jit(lambda q, k, v, s: attn.attention(q, k, v, s, impl=impl, block_q=16, block_k=16))
    out = fn(q, k, v, seg_j)
    np.testing.assert_allclose(np.asarray(out), _per_sequence_reference(q, k, v, seg), **TOL)


@pytest.mark.parametrize(
    "layout,groups,block_q,block_k",
    [
        ("left_padded", 1, 16, 16),
        ("left_padded", 3, 16, 8),
        ("packed", 1, 8, 16),
        ("packed", 3, 16, 16),
        ("mixed", 2, 16, 8),
        ("mixed", 3, 512, 512),  # clipped to T
    ],
)
def test_blockwise_matches_naive_forward_and_backward(layout, groups, block_q, block_k):
    q, k, v, seg, w = _inputs(_layout(layout), groups=groups)
    _assert_parity(attn.attention_blockwise, q, k, v, seg, w, block_q=block_q, block_k=block_k)


def test_blockwise_under_checkpoint_and_lcm_padding():
    """jit(grad(checkpoint(.))) and blocks whose lcm pads T=45 to 48 (12 and 16)."""
    q, k, v, seg, w = _inputs(_layout("mixed"))
    remat = jax.checkpoint(lambda q, k, v, s: attn.attention_blockwise(q, k, v, s, block_q=12))
    _assert_parity(lambda q, k, v, s: remat(q, k, v, s), q, k, v, seg, w)


def test_padding_queries_output_exactly_zero():
    seg = _layout("mixed")
    q, k, v, seg_j, w = _inputs(seg)
    for impl in ("naive", "blockwise"):
        out, (dq, _, _) = _value_and_grads(
            attn.IMPLEMENTATIONS[impl], q, k, v, seg_j, w, block_q=16, block_k=16
        )
        assert np.all(np.asarray(out)[seg == 0] == 0), impl
        assert np.all(np.asarray(dq)[seg == 0] == 0), impl
    out = attn.attention_cudnn(q, k, v, seg_j, implementation="xla")
    assert np.all(np.asarray(out)[seg == 0] == 0)


def test_key_block_ranges_hand_computed():
    packed = np.array([[1] * 3 + [2] * 6 + [3] * 3 + [0] * 4], np.int32)
    aligned = np.repeat(np.arange(1, 5), 4)[None].astype(np.int32)
    left = np.array([[0] * 6 + [1] * 10], np.int32)
    lo, hi = attn.key_block_ranges(jnp.asarray(np.concatenate([packed, aligned, left])), 4, 4)
    np.testing.assert_array_equal(lo, [[0, 0, 0, 0], [0, 1, 2, 3], [0, 1, 1, 1]])
    np.testing.assert_array_equal(hi, [[1, 2, 3, 0], [1, 2, 3, 4], [0, 2, 3, 4]])
    lo, hi = attn.key_block_ranges(jnp.asarray(left), 8, 4)  # block_q != block_k
    np.testing.assert_array_equal(lo, [[1, 1]])
    np.testing.assert_array_equal(hi, [[2, 4]])
    with pytest.raises(ValueError, match="multiple"):
        attn.key_block_ranges(jnp.asarray(left), 5, 4)


def test_block_skipping_costs_sum_of_squares_not_t_squared():
    """16 sequences of 64 in T=1024, blocks of 64: 16 key blocks visited, not 136."""
    seg = jnp.asarray(np.repeat(np.arange(1, 17), 64)[None].astype(np.int32))
    lo, hi = attn.key_block_ranges(seg, 64, 64)
    assert int(jnp.sum(hi - lo)) == 16
    full = jnp.ones((1, 1024), jnp.int32)
    lo, hi = attn.key_block_ranges(full, 64, 64)
    assert int(jnp.sum(hi - lo)) == 16 * 17 // 2


def test_non_contiguous_segment_ids_still_exact():
    """An id reused later in the row is still one sequence: lo reaches its first slot."""
    seg = np.zeros((1, 40), np.int32)
    seg[0, :8], seg[0, 8:30], seg[0, 30:38] = 1, 2, 1
    q, k, v, seg_j, w = _inputs(seg)
    _assert_parity(attn.attention_blockwise, q, k, v, seg_j, w, block_q=8, block_k=8)


def _fwd_bwd_temp_bytes(fn, t: int, **kw) -> int:
    q = jax.ShapeDtypeStruct((1, t, 1, 2, 16), jnp.float32)
    kv = jax.ShapeDtypeStruct((1, t, 1, 16), jnp.float32)
    seg = jax.ShapeDtypeStruct((1, t), jnp.int32)
    loss = lambda q, k, v, s: jnp.sum(fn(q, k, v, s, **kw))
    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    return grad.lower(q, kv, kv, seg).compile().memory_analysis().temp_size_in_bytes


def test_blockwise_memory_grows_linearly_naive_quadratically():
    block = dict(block_q=256, block_k=256)
    blockwise = [_fwd_bwd_temp_bytes(attn.attention_blockwise, t, **block) for t in (2048, 4096)]
    naive = [_fwd_bwd_temp_bytes(attn.attention_naive, t) for t in (2048, 4096)]
    assert blockwise[1] / blockwise[0] < 2.6, blockwise
    assert naive[1] / naive[0] > 3.5, naive
    assert blockwise[1] * 20 < naive[1], (blockwise, naive)


def test_bfloat16_blockwise_close_to_naive():
    q, k, v, seg, w = _inputs(_layout("packed"), dtype=jnp.bfloat16)
    out, grads = _value_and_grads(attn.attention_blockwise, q, k, v, seg, w, block_q=16)
    ref, ref_grads = _value_and_grads(attn.attention_naive, q, k, v, seg, w)
    assert out.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in grads)
    for a, b in zip((out, *grads), (ref, *ref_grads)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.abs(a - b).max() <= BF16_TOL * max(1.0, np.abs(b).max())


def test_cudnn_arguments_through_xla_match_naive():
    """The cuDNN path's mask/causal/padding arguments, run by XLA (odd T is padded)."""
    q, k, v, seg, w = _inputs(_layout("mixed"))
    args = attn.cudnn_arguments(q, k, v, seg)
    assert args["is_causal"] and args["mask"].shape == (3, 1, T + 1, T + 1)
    _assert_parity(attn.attention_cudnn, q, k, v, seg, w, implementation="xla")


def test_splash_interpret_mode_matches_naive():
    """The Pallas TPU splash kernel in interpret mode on CPU (tiny shapes)."""
    if jax.default_backend() == "tpu":
        pytest.skip("covered natively on TPU")
    q, k, v, seg, w = _inputs(_layout("packed"), groups=2)
    _assert_parity(attn.attention_splash, q, k, v, seg, w)
    # The kernel is cached per shape: a second trace must not see the first one's tracers.
    twice = jax.jit(lambda q, k, v, s: 2 * attn.attention_splash(q, k, v, s))(q, k, v, seg)
    np.testing.assert_allclose(twice, 2 * attn.attention_naive(q, k, v, seg), **TOL)


@pytest.mark.tpu
@pytest.mark.skipif(jax.default_backend() != "tpu", reason="needs a TPU")
def test_splash_on_tpu_matches_naive():
    q, k, v, seg, w = _inputs(_layout("mixed", t=300), d=128, dtype=jnp.bfloat16)
    out = attn.attention(q, k, v, seg, impl="splash", block_q=128, block_k=128)
    ref = attn.attention_naive(q, k, v, seg)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), atol=5e-2)


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
def test_cudnn_on_gpu_matches_naive():
    q, k, v, seg, w = _inputs(_layout("mixed", t=64), d=64, dtype=jnp.bfloat16)
    out, grads = _value_and_grads(attn.attention_cudnn, q, k, v, seg, w)
    ref, ref_grads = _value_and_grads(attn.attention_naive, q, k, v, seg, w)
    for a, b in zip((out, *grads), (ref, *ref_grads)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.abs(a - b).max() <= 5e-2 * max(1.0, np.abs(b).max())


def test_resolve_impl_choices():
    bf16, f32 = jnp.bfloat16, jnp.float32
    assert attn.resolve_impl("auto", "gpu", bf16, 128) == "cudnn"
    assert attn.resolve_impl("auto", "gpu", f32, 128) == "blockwise"  # cuDNN: bf16/fp16 only
    assert attn.resolve_impl("auto", "gpu", bf16, 100) == "blockwise"  # not a multiple of 8
    assert attn.resolve_impl("auto", "gpu", bf16, 512) == "blockwise"
    assert attn.resolve_impl("auto", "tpu", bf16, 128) == "splash"
    assert attn.resolve_impl("auto", "cpu", bf16, 128) == "blockwise"
    for name in attn.IMPLEMENTATIONS:
        assert attn.resolve_impl(name, "cpu", f32, 64) == name
    with pytest.raises(ValueError, match="blockwise"):
        attn.resolve_impl("flash", "cpu", f32, 64)
    q, k, v, seg, _ = _inputs(_layout("left_padded"))
    with pytest.raises(ValueError, match="naive"):
        attn.attention(q, k, v, seg, impl="flash")


def test_auto_on_cpu_is_blockwise_and_shapes_are_checked():
    q, k, v, seg, _ = _inputs(_layout("left_padded"))
    out = attn.attention(q, k, v, seg, block_q=16, block_k=16)
    ref = attn.attention_blockwise(q, k, v, seg, block_q=16, block_k=16)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))
    with pytest.raises(ValueError, match="segment_ids"):
        attn.attention(q, k, v, seg[:, :-1])


def test_segment_ids_from_mask():
    mask = jnp.array([[0, 0, 1, 1], [1, 1, 1, 1]], dtype=bool)
    seg = attn.segment_ids_from_mask(mask)
    assert seg.dtype == jnp.int32
    np.testing.assert_array_equal(seg, [[0, 0, 1, 1], [1, 1, 1, 1]])
