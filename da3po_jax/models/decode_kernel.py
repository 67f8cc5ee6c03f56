"""Ragged paged decode attention: a Pallas TPU kernel that reads only each slot's live pages.

The continuous engine's cache (`transformer.SlotCache`) holds, per layer, keys and values
[S, L, kv_heads, D]: slot s owns the run of L / block pages [s * L / block, ...) of
`block` keys each (an identity page table), and its first `lengths[s]` keys are live. One
decode step attends one query per slot over those keys.

`ragged_decode_attention` runs a grid (slot, page), each step over all KV heads of the
slot (TPU blocks keep the two minor dimensions, [kv_heads, D], whole). A page's keys and values are
copied into VMEM only while the page is live: the pages past a slot's last live one map to
that same last page, and Pallas skips the copy when consecutive grid steps name the same
block, so a slot holding 100 keys reads one page of 128 whatever L is; a dead page's grid
step also skips its compute. Within a slot the pages run in order with an online softmax
(running max, denominator and accumulator in VMEM scratch), as `decode_attention`, the
pure-JAX version of the same function, does over blocks. Pallas kernels are not
partitioned by XLA: under a mesh the kernel runs per shard of slots and KV heads
(`shard_map`, as splash in `models/attention.py`).

Off TPU the kernel runs in Pallas interpret mode (for tests; slow). It compiles for TPU
with Mosaic (`da3po_jax.compile`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec

_NEG_INF = float(jnp.finfo(jnp.float32).min)
_LANES = 128  # the softmax statistics are kept broadcast over a full vector lane row


def _kernel(lengths_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, block, scale):
    s, page = pl.program_id(0), pl.program_id(1)
    n = lengths_ref[s]

    @pl.when(page == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, _NEG_INF, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    @pl.when(page * block < n)
    def _page():
        for h in range(q_ref.shape[0]):  # KV heads, each with its G query heads
            q = q_ref[h].astype(jnp.float32) * scale  # [G, D]
            k = k_ref[:, h, :].astype(jnp.float32)  # [block, D]
            scores = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())))  # [G, block]
            pos = page * block + jax.lax.broadcasted_iota(jnp.int32, scores.shape, 1)
            scores = jnp.where(pos < n, scores, _NEG_INF)
            m_prev = m_ref[h][:, :1]  # [G, 1]
            m_new = jnp.maximum(m_prev, jnp.max(scores, axis=-1, keepdims=True))
            p = jnp.exp(scores - m_new)  # 0 where masked: m_new is finite on a live page
            corr = jnp.exp(m_prev - m_new)
            v = v_ref[:, h, :].astype(jnp.float32)  # [block, D]
            live = page * block + jax.lax.broadcasted_iota(jnp.int32, v.shape, 0) < n
            v = jnp.where(live, v, 0.0)  # whatever a dead row holds, it adds nothing
            pv = jax.lax.dot_general(p, v, (((1,), (0,)), ((), ())))  # [G, D]
            l_new = l_ref[h][:, :1] * corr + jnp.sum(p, axis=-1, keepdims=True)
            acc_ref[h] = acc_ref[h] * corr + pv
            m_ref[h] = jnp.broadcast_to(m_new, m_ref.shape[1:])
            l_ref[h] = jnp.broadcast_to(l_new, l_ref.shape[1:])

    @pl.when(page == pl.num_programs(1) - 1)
    def _out():
        denom = jnp.maximum(l_ref[...][:, :, :1], 1e-30)
        o_ref[...] = (acc_ref[...] / denom).astype(o_ref.dtype)


def _kv_index(s, page, lengths_ref, *, block):
    """The page a grid step reads: the step's own while live, else the slot's last live
    page (the same block as the step before: no copy)."""
    last = jnp.maximum((lengths_ref[s] + block - 1) // block - 1, 0)
    return (s, jnp.minimum(page, last), 0, 0)


@functools.partial(jax.jit, static_argnames=("block", "interpret"))
def _ragged(q, k, v, lengths, *, block: int, interpret: bool):
    s, kvh, g, d = q.shape
    cap = k.shape[1]
    q_spec = pl.BlockSpec((None, kvh, g, d), lambda s, page, lens: (s, 0, 0, 0))
    kv_spec = pl.BlockSpec((None, block, kvh, d), functools.partial(_kv_index, block=block))
    kernel = functools.partial(_kernel, block=block, scale=1.0 / math.sqrt(d))
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(s, cap // block),
            in_specs=[q_spec, kv_spec, kv_spec],
            out_specs=q_spec,
            scratch_shapes=[
                pltpu.VMEM((kvh, g, _LANES), jnp.float32),
                pltpu.VMEM((kvh, g, _LANES), jnp.float32),
                pltpu.VMEM((kvh, g, d), jnp.float32),
            ],
        ),
        out_shape=jax.ShapeDtypeStruct((s, kvh, g, d), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=pltpu.InterpretParams() if interpret else False,
    )(lengths.astype(jnp.int32), q, k, v)


def ragged_decode_attention(q, k, v, lengths, block: int, *, interpret: bool | None = None):
    """Softmax attention of one query per slot over its first `lengths[s]` keys, reading
    only live pages (module docstring). Same contract as `transformer.decode_attention`.

    Args:
      q: [S, kv_heads, groups, D] queries; k, v: [S, L, kv_heads, D], L a multiple of
        `block` (a multiple of 8).
      lengths: [S] int32 live keys per slot (0: the output is 0).
      interpret: Pallas interpret mode; default: off TPU (`attention.target_platform`).

    Returns:
      [S, kv_heads, groups, D] float32.
    """
    from da3po_jax.models.attention import per_shard, target_platform

    if k.shape[1] % block or block % 8:
        raise ValueError(
            f"cache length {k.shape[1]} and block {block}: need L % block == 0 and block % 8 == 0"
        )
    if interpret is None:
        interpret = target_platform() != "tpu"
    run = functools.partial(_ragged, block=block, interpret=interpret)

    def specs(rows, heads):
        kv = PartitionSpec(rows, None, heads)
        return (PartitionSpec(rows, heads), kv, kv, PartitionSpec(rows)), PartitionSpec(rows, heads)

    return per_shard(run, (q, k, v, lengths), specs, q.shape[0], q.shape[1])
