"""Causal self-attention over segment ids: a naive reference and memory-efficient kernels.

Masking rule. Every implementation takes `segment_ids` [B, T] (int32): 0 marks padding,
a positive id names the sequence a slot belongs to. Query i may attend key j iff

    j <= i  and  segment_ids[b, i] == segment_ids[b, j]  and  segment_ids[b, j] != 0,

i.e. causal by slot index, never across sequences, never onto padding. A query with no
allowed key (a padding query) outputs exactly 0. One convention covers a left-padded batch
(`segment_ids_from_mask(mask)`), rows packing several sequences (ids 1, 2, 3, ... and 0 on
trailing padding) and mixes of both.

Why blockwise. The naive formulation materialises [B, kv_heads, groups, T, T] float32
scores (and keeps them for the backward pass), so its memory grows as T^2 and is what stops
long sequences. `"blockwise"` computes the same function FlashAttention-2 style: an online
softmax over key blocks in the forward, and a backward that recomputes each block's
probabilities from the saved per-query logsumexp (a `jax.custom_vjp`), so forward and
backward both hold O(T) memory.

Block skipping. Query block i only visits key blocks [lo_i, hi_i): lo_i is the block of the
earliest first slot of any segment present among the block's real queries, hi_i the block
just past the causal diagonal of its last real query (`key_block_ranges`). Every block
outside the range is fully masked, so a packed row of many short sequences costs about the
sum of their squared lengths, not T^2. The backward visits the same (query, key) block pairs.

`"cudnn"` (GPU) and `"splash"` (the Pallas TPU kernel) express the same rule through those
libraries; `"auto"` picks one per backend (`resolve_impl`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec

from da3po_jax.models.sharding import batch_axes

_NEG_INF = float(jnp.finfo(jnp.float32).min)
_F32 = jnp.float32
_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar("platform", default=None)


@contextlib.contextmanager
def compiling_for(platform: str) -> Iterator[None]:
    """Traces inside choose kernels for `platform` ("tpu", "gpu") instead of the running
    backend, and Pallas kernels are lowered for real rather than interpreted: for compiling
    a TPU program in a process that runs on CPU (`da3po_jax.compile`)."""
    token = _PLATFORM.set(platform)
    try:
        yield
    finally:
        _PLATFORM.reset(token)


def target_platform() -> str:
    """The platform the traced program is for: `compiling_for`'s, else the backend's."""
    return _PLATFORM.get() or jax.default_backend()


def segment_ids_from_mask(mask: jax.Array) -> jax.Array:
    """[B, T] token mask of a left-padded batch -> int32 segment ids (1 real, 0 padding)."""
    return (jnp.asarray(mask) != 0).astype(jnp.int32)


def allowed_mask(segment_ids: jax.Array) -> jax.Array:
    """[B, T] segment ids -> [B, T, T] bool, [b, i, j] = query i may attend key j."""
    t = segment_ids.shape[1]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return causal[None] & same & (segment_ids[:, None, :] != 0)


def attention_naive(q, k, v, segment_ids, *, block_q: int = 512, block_k: int = 512):
    """Reference attention; materialises [B, kv_heads, groups, T, T] float32 scores.

    Args:
      q: [B, T, kv_heads, groups, D]; k, v: [B, T, kv_heads, D]; segment_ids: [B, T].
      block_q, block_k: unused (uniform signature of the registry).

    Returns:
      [B, T, kv_heads, groups, D] in v.dtype; rows with no allowed key are 0.
    """
    del block_q, block_k
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=_F32)
    scores = scores / math.sqrt(q.shape[-1])
    allowed = allowed_mask(segment_ids)[:, None, None]  # [B, 1, 1, T, T]
    scores = jnp.where(allowed, scores, _NEG_INF)
    probs = jnp.where(allowed, jax.nn.softmax(scores, axis=-1), 0.0).astype(v.dtype)
    return jnp.einsum("bkgts,bskd->btkgd", probs, v)


def _first_occurrence(seg: jax.Array) -> jax.Array:
    """[T] ids -> [T] index of the first slot holding each slot's id (O(T log T))."""
    t = seg.shape[0]
    order = jnp.argsort(seg, stable=True)
    ids = seg[order]
    idx = jnp.arange(t)
    starts = jnp.where(jnp.concatenate([jnp.ones(1, bool), ids[1:] != ids[:-1]]), idx, 0)
    first = order[lax.cummax(starts)]
    return jnp.zeros_like(order).at[order].set(first)


def key_block_ranges(segment_ids: jax.Array, block_q: int, block_k: int):
    """Key blocks [lo, hi) each query block must visit; all other blocks are fully masked.

    Args:
      segment_ids: [B, T] with T a multiple of both block sizes.
      block_q, block_k: query and key block sizes.

    Returns:
      (lo, hi), each [B, T // block_q] int32; (0, 0) for a block without real queries.
    """
    b, t = segment_ids.shape
    if t % block_q or t % block_k:
        raise ValueError(f"T={t} must be a multiple of block_q={block_q} and block_k={block_k}")
    valid = (segment_ids != 0).reshape(b, -1, block_q)
    first = jax.vmap(_first_occurrence)(segment_ids).reshape(b, -1, block_q)
    pos = jnp.arange(t).reshape(-1, block_q)
    lo = jnp.where(valid, first, t).min(-1) // block_k
    hi = jnp.where(valid, pos, 0).max(-1) // block_k + 1
    any_valid = valid.any(-1)
    return (
        jnp.where(any_valid, lo, 0).astype(jnp.int32),
        jnp.where(any_valid, hi, 0).astype(jnp.int32),
    )


def _block_sizes(t: int, block_q: int, block_k: int) -> tuple[int, int, int]:
    """Clip the blocks to T and return (block_q, block_k, padded T)."""
    bq, bk = min(block_q, t), min(block_k, t)
    step = math.lcm(bq, bk)
    return bq, bk, -(-t // step) * step


def _pad_time(x: jax.Array, length: int, axis: int) -> jax.Array:
    """Zero-pad `axis` of x up to `length` (padding slots get segment id 0)."""
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, length - x.shape[axis])
    return jnp.pad(x, widths)


def _block_scores(qi, kj, seg, i, j, bq, bk):
    """Scaled f32 scores [kv, g, bq, bk] of query block i vs key block j, and their mask."""
    s = jnp.einsum("kgqd,ksd->kgqs", qi, kj, preferred_element_type=_F32)
    s = s / math.sqrt(qi.shape[-1])
    qpos, kpos = i * bq + jnp.arange(bq), j * bk + jnp.arange(bk)
    qseg = lax.dynamic_slice_in_dim(seg, i * bq, bq)
    kseg = lax.dynamic_slice_in_dim(seg, j * bk, bk)
    allowed = (kpos[None] <= qpos[:, None]) & (qseg[:, None] == kseg[None]) & (kseg[None] != 0)
    return s, allowed


def _fwd_row(q, k, v, seg, lo, hi, bq, bk):
    """Online-softmax forward of one row (head-major, padded).

    Args:
      q: [kv, g, Tp, D]; k, v: [kv, Tp, D]; seg: [Tp]; lo, hi: [Tp // bq] key-block ranges.

    Returns:
      out [kv, g, Tp, D] (v.dtype) and per-query logsumexp [kv, g, Tp] f32 (0 if no key).
    """
    kv, g, tp, _ = q.shape

    def q_block(i, carry):
        out, lse = carry
        qi = lax.dynamic_slice_in_dim(q, i * bq, bq, axis=2)

        def k_block(j, state):
            m, denom, acc = state
            kj, vj = (lax.dynamic_slice_in_dim(x, j * bk, bk, axis=1) for x in (k, v))
            s, allowed = _block_scores(qi, kj, seg, i, j, bq, bk)
            s = jnp.where(allowed, s, -jnp.inf)
            m_new = jnp.maximum(m, s.max(-1))
            m_safe = jnp.where(jnp.isneginf(m_new), 0.0, m_new)
            p = jnp.exp(s - m_safe[..., None])
            corr = jnp.exp(m - m_safe)
            pv = jnp.einsum("kgqs,ksd->kgqd", p.astype(v.dtype), vj, preferred_element_type=_F32)
            return m_new, denom * corr + p.sum(-1), acc * corr[..., None] + pv

        init = (
            jnp.full((kv, g, bq), -jnp.inf, _F32),
            jnp.zeros((kv, g, bq), _F32),
            jnp.zeros((kv, g, bq, v.shape[-1]), _F32),
        )
        m, denom, acc = lax.fori_loop(lo[i], hi[i], k_block, init)
        seen = denom > 0
        d_safe = jnp.where(seen, denom, 1.0)
        o = jnp.where(seen[..., None], acc / d_safe[..., None], 0.0).astype(out.dtype)
        row_lse = jnp.where(seen, m + jnp.log(d_safe), 0.0)
        out = lax.dynamic_update_slice_in_dim(out, o, i * bq, axis=2)
        return out, lax.dynamic_update_slice_in_dim(lse, row_lse, i * bq, axis=2)

    init = (jnp.zeros((kv, g, tp, v.shape[-1]), v.dtype), jnp.zeros((kv, g, tp), _F32))
    return lax.fori_loop(0, tp // bq, q_block, init)


def _add_block(acc, update, start, size):
    """acc[:, start:start + size] += update along axis 1."""
    cur = lax.dynamic_slice_in_dim(acc, start, size, axis=1)
    return lax.dynamic_update_slice_in_dim(acc, cur + update, start, axis=1)


def _bwd_row(q, k, v, seg, out, lse, dout, lo, hi, bq, bk):
    """Flash backward of one row: recomputes block probabilities from the logsumexp.

    Shapes as in `_fwd_row`; dout like out. Returns (dq, dk, dv) in the input dtypes.
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    delta = jnp.sum(dout.astype(_F32) * out.astype(_F32), axis=-1)  # [kv, g, Tp]

    def q_block(i, carry):
        dq, dk, dv = carry
        qi, doi = (lax.dynamic_slice_in_dim(x, i * bq, bq, axis=2) for x in (q, dout))
        lse_i, delta_i = (lax.dynamic_slice_in_dim(x, i * bq, bq, axis=2) for x in (lse, delta))

        def k_block(j, state):
            dqi, dk, dv = state
            kj, vj = (lax.dynamic_slice_in_dim(x, j * bk, bk, axis=1) for x in (k, v))
            s, allowed = _block_scores(qi, kj, seg, i, j, bq, bk)
            p = jnp.where(allowed, jnp.exp(s - lse_i[..., None]), 0.0)
            dvj = jnp.einsum(
                "kgqs,kgqd->ksd", p.astype(doi.dtype), doi, preferred_element_type=_F32
            )
            dp = jnp.einsum("kgqd,ksd->kgqs", doi, vj, preferred_element_type=_F32)
            ds = (p * (dp - delta_i[..., None]) * scale).astype(q.dtype)
            dqi = dqi + jnp.einsum("kgqs,ksd->kgqd", ds, kj, preferred_element_type=_F32)
            dkj = jnp.einsum("kgqs,kgqd->ksd", ds, qi, preferred_element_type=_F32)
            return dqi, _add_block(dk, dkj, j * bk, bk), _add_block(dv, dvj, j * bk, bk)

        dqi = jnp.zeros(qi.shape, _F32)
        dqi, dk, dv = lax.fori_loop(lo[i], hi[i], k_block, (dqi, dk, dv))
        return lax.dynamic_update_slice_in_dim(dq, dqi, i * bq, axis=2), dk, dv

    init = (jnp.zeros(q.shape, _F32), jnp.zeros(k.shape, _F32), jnp.zeros(v.shape, _F32))
    dq, dk, dv = lax.fori_loop(0, q.shape[2] // bq, q_block, init)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _flash(q, k, v, seg, bq, bk):
    """Head-major padded blockwise attention: q [B, kv, g, Tp, D], k, v [B, kv, Tp, D]."""
    return _flash_fwd(q, k, v, seg, bq, bk)[0]


def _flash_fwd(q, k, v, seg, bq, bk):
    lo, hi = key_block_ranges(seg, bq, bk)
    out, lse = lax.map(lambda a: _fwd_row(*a, bq, bk), (q, k, v, seg, lo, hi))
    return out, (q, k, v, seg, out, lse)


def _flash_bwd(bq, bk, residuals, dout):
    q, k, v, seg, out, lse = residuals
    lo, hi = key_block_ranges(seg, bq, bk)
    rows = (q, k, v, seg, out, lse, dout, lo, hi)
    dq, dk, dv = lax.map(lambda a: _bwd_row(*a, bq, bk), rows)
    return dq, dk, dv, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def attention_blockwise(q, k, v, segment_ids, *, block_q: int = 512, block_k: int = 512):
    """Memory-efficient attention (O(T) forward and backward), pure JAX, any backend.

    Batch rows run one after another (`lax.map`), each with its own key-block ranges.

    Args:
      q: [B, T, kv_heads, groups, D]; k, v: [B, T, kv_heads, D]; segment_ids: [B, T].
      block_q, block_k: query/key block sizes, clipped to T; T is padded internally to a
        multiple of both (padding is segment 0) and the padding is stripped again.

    Returns:
      [B, T, kv_heads, groups, D] in v.dtype, equal to `attention_naive`.
    """
    t = segment_ids.shape[1]
    bq, bk, tp = _block_sizes(t, block_q, block_k)
    qh = _pad_time(q.transpose(0, 2, 3, 1, 4), tp, axis=3)
    kh, vh = (_pad_time(x.transpose(0, 2, 1, 3), tp, axis=2) for x in (k, v))
    seg = _pad_time(segment_ids.astype(jnp.int32), tp, axis=1)
    out = _flash(qh, kh, vh, seg, bq, bk)
    return out[:, :, :, :t].transpose(0, 3, 1, 2, 4)


def cudnn_arguments(q, k, v, segment_ids) -> dict:
    """Keyword arguments of `jax.nn.dot_product_attention` expressing the masking rule.

    cuDNN takes `is_causal=True` plus a boolean [B, 1, T, T] mask (same segment, key not
    padding), which it turns into an additive bias; T is padded to even (cuDNN wants an
    even length with a bias in training). Padding queries are zeroed by the caller. The
    mask costs B * T^2 bytes (a bias in q.dtype inside cuDNN): far less than the naive
    per-head float32 scores, but not O(T).

    Returns:
      dict with query [B, Tp, heads, D], key, value [B, Tp, kv_heads, D], mask, is_causal.
    """
    b, t, kv, g, d = q.shape
    tp = t + t % 2
    seg = _pad_time(segment_ids.astype(jnp.int32), tp, axis=1)
    mask = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] != 0)
    return dict(
        query=_pad_time(q.reshape(b, t, kv * g, d), tp, axis=1),
        key=_pad_time(k, tp, axis=1),
        value=_pad_time(v, tp, axis=1),
        mask=mask[:, None],
        is_causal=True,
    )


def attention_cudnn(
    q, k, v, segment_ids, *, block_q: int = 512, block_k: int = 512, implementation="cudnn"
):
    """cuDNN fused attention (GPU, bf16/fp16, head_dim a multiple of 8 and <= 128).

    `implementation="xla"` runs the same arguments through XLA (used to test the mask).
    Shapes as in `attention_naive`; block sizes are unused.
    """
    del block_q, block_k
    t = segment_ids.shape[1]
    out = jax.nn.dot_product_attention(
        **cudnn_arguments(q, k, v, segment_ids), implementation=implementation
    )
    out = out[:, :t].reshape(q.shape[:-1] + v.shape[-1:])
    return jnp.where((segment_ids != 0)[:, :, None, None, None], out, 0).astype(v.dtype)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


@functools.lru_cache(maxsize=32)
def _splash_kernel(heads: int, tp: int, bq: int, bk: int, interpret: bool):
    """A causal splash-attention kernel for [heads, Tp, D] queries (built once per shape)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    mask = sa.MultiHeadMask([sa.CausalMask((tp, tp)) for _ in range(heads)])
    sizes = sa.BlockSizes(
        block_q=bq, block_kv=bk, block_kv_compute=bk,
        block_q_dkv=bq, block_kv_dkv=bk, block_kv_dkv_compute=bk,
        block_q_dq=bq, block_kv_dq=bk,
    )  # fmt: skip
    with jax.ensure_compile_time_eval():  # concrete mask arrays: safe to cache across traces
        return sa.make_splash_mha(
            mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret
        )


def attention_splash(q, k, v, segment_ids, *, block_q: int = 512, block_k: int = 512):
    """Pallas TPU splash attention (interpret mode off TPU: slow, for tests only).

    Splash wants head-major [B, heads, T, D], blocks that are multiples of 128 and divide
    T, and no padding query row without keys: T is padded (segment 0, whose causal rows
    always see themselves), queries are pre-scaled and padding queries are zeroed after.
    Under a mesh (`parallel.mesh.kernel_mesh`) the kernel runs per shard (`per_shard`).
    Shapes as in
    `attention_naive`.
    """
    b, t, kv, g, d = q.shape
    bq = min(_round_up(block_q, 128), _round_up(t, 128))
    bk = min(_round_up(block_k, 128), _round_up(t, 128))
    tp = _round_up(t, math.lcm(bq, bk))
    qh = (q / math.sqrt(d)).astype(q.dtype).reshape(b, t, kv * g, d).transpose(0, 2, 1, 3)
    qh = _pad_time(qh, tp, axis=2)
    kh, vh = (_pad_time(x.transpose(0, 2, 1, 3), tp, axis=2) for x in (k, v))
    seg = _pad_time(segment_ids.astype(jnp.int32), tp, axis=1)
    interpret = target_platform() != "tpu"

    def run(qh, kh, vh, seg):  # one shard: [b, heads, Tp, D], its own heads
        from jax.experimental.pallas.ops.tpu import splash_attention as sa

        kernel = _splash_kernel(qh.shape[1], tp, bq, bk, interpret)
        return jax.vmap(kernel)(qh, kh, vh, sa.SegmentIds(q=seg, kv=seg))

    def specs(rows, heads):
        qkv = PartitionSpec(rows, heads)
        return (qkv, qkv, qkv, PartitionSpec(rows)), qkv

    out = per_shard(run, (qh, kh, vh, seg), specs, b, kv)
    out = out[:, :, :t].transpose(0, 2, 1, 3).reshape(b, t, kv, g, v.shape[-1])
    return jnp.where((segment_ids != 0)[:, :, None, None, None], out, 0).astype(v.dtype)


def per_shard(fn, args: tuple, specs, batch_size: int, kv_heads: int):
    """`fn(*args)` under `shard_map` over the ambient mesh: a Pallas kernel is not
    partitioned by XLA, so each device runs it on its own rows (split over the batch axes
    `data`, `fsdp` when they divide `batch_size`) and its own heads (split over `tensor`
    when it divides `kv_heads`; query heads h = kv * groups + g stay with their KV head).
    `specs(rows, heads)` gives (in_specs, out_specs) from those axes (None: whole). With
    no mesh set `fn` runs as it is. A one-device mesh runs it under `shard_map` too: the
    kernel then reads its chip from the mesh, which is how a one-chip TPU program compiles
    on a CPU host (`da3po_jax.compile`; outside it Pallas asks the default device)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return fn(*args)
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    batch = batch_axes(sizes, batch_size)
    tensor = sizes.get("tensor", 1)
    heads = "tensor" if tensor > 1 and kv_heads % tensor == 0 else None
    in_specs, out_specs = specs(batch or None, heads)
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)(
        *args
    )


IMPLEMENTATIONS: dict[str, Callable[..., jax.Array]] = {
    "naive": attention_naive,
    "blockwise": attention_blockwise,
    "cudnn": attention_cudnn,
    "splash": attention_splash,
}


def cudnn_supported(dtype, head_dim: int) -> bool:
    """Whether cuDNN flash attention takes this dtype/head_dim on every supported GPU."""
    return jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and head_dim % 8 == 0 and head_dim <= 128


def resolve_impl(impl: str, backend: str, dtype, head_dim: int) -> str:
    """Name of the implementation to run.

    Args:
      impl: "auto" or a key of `IMPLEMENTATIONS`.
      backend: `jax.default_backend()` ("cpu", "gpu", "tpu", ...).
      dtype: dtype of q/k/v; head_dim: D.

    Returns:
      `impl` itself, or for "auto": "cudnn" on gpu when `cudnn_supported`, "splash" on tpu,
      else "blockwise".
    """
    if impl != "auto":
        if impl not in IMPLEMENTATIONS:
            raise ValueError(
                f"attention impl {impl!r}: expected one of {['auto', *IMPLEMENTATIONS]}"
            )
        return impl
    if backend in ("gpu", "cuda") and cudnn_supported(dtype, head_dim):
        return "cudnn"
    if backend == "tpu":
        return "splash"
    return "blockwise"


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array,
    *,
    impl: str = "auto",
    block_q: int = 512,
    block_k: int = 512,
) -> jax.Array:
    """Causal grouped-query self-attention under the segment-id masking rule (module doc).

    Args:
      q: [B, T, kv_heads, groups, D] queries (query head h = kv * groups + g).
      k, v: [B, T, kv_heads, D].
      segment_ids: [B, T] int, 0 on padding.
      impl: "auto", "naive", "blockwise", "cudnn" or "splash".
      block_q, block_k: block sizes of the blockwise/splash kernels.

    Returns:
      [B, T, kv_heads, groups, D] in v.dtype; padding queries are exactly 0.
    """
    b, t, kv, _, d = q.shape
    if k.shape[:3] != (b, t, kv) or v.shape[:3] != (b, t, kv) or k.shape[-1] != d:
        raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape} do not match")
    if segment_ids.shape != (b, t):
        raise ValueError(f"segment_ids {segment_ids.shape} must be {(b, t)}")
    name = resolve_impl(impl, target_platform(), q.dtype, d)
    fn = IMPLEMENTATIONS[name]
    return fn(q, k, v, segment_ids.astype(jnp.int32), block_q=block_q, block_k=block_k)
