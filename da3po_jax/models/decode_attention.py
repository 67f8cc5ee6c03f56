"""Decode attention of the continuous engine: one query per slot against that slot's own
live keys in the slot cache [S, L, kv_heads, D], a pool of S * L / block pages of `block`
tokens whose page table is the identity (slot s owns pages s * L / block, ...).

- `decode_attention` ("blockwise"): block by block with an online softmax, every slot
  visiting the blocks below the *longest* live length (one long slot sets the work of all).
- `paged_decode_attention` ("paged"): only the live (slot, block) pairs, S pairs per
  iteration: the work follows the sum of the live lengths, not S x the longest.
- `decode_kernel.ragged_decode_attention` ("ragged"): the Pallas TPU kernel.

`model.decode_attention = "auto"` runs "ragged" on TPU and "paged" elsewhere. Under a mesh
the paged version runs per device on its own slots (`attention.per_shard`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

_NEG_INF = float(jnp.finfo(jnp.float32).min)


def decode_attention(q, k, v, lengths, block: int) -> jax.Array:
    """Softmax attention of one query per slot over the first `lengths[s]` keys of its row,
    block by block (online softmax), visiting only the blocks below the longest length: the
    cost follows the live lengths, not the cache capacity.

    This is the pure-JAX reference of a ragged (paged) decode kernel: the cache
    [S, L, kv_heads, D] is a pool of S * L / block pages of `block` tokens whose page table
    is the identity (slot s owns pages s * L / block, ...), the layout a paged kernel such
    as Pallas' TPU ragged paged attention reads (see docs/design.md).

    Args:
      q: [S, kv_heads, groups, D] queries; k, v: [S, L, kv_heads, D].
      lengths: [S] int32 keys per slot (0: the output is 0).
      block: keys per block; L must be a multiple of it.

    Returns:
      [S, kv_heads, groups, D] float32.
    """
    s, cap, kvh, d = k.shape
    if cap % block:
        raise ValueError(f"cache length {cap} is not a multiple of the block {block}")
    scale = 1.0 / math.sqrt(d)
    num_blocks = (jnp.max(lengths) + block - 1) // block
    offsets = jnp.arange(block)

    def body(i, carry):
        m, denom, acc = carry
        kb = jax.lax.dynamic_slice_in_dim(k, i * block, block, axis=1)
        vb = jax.lax.dynamic_slice_in_dim(v, i * block, block, axis=1)
        sc = jnp.einsum("skgd,sbkd->skgb", q, kb, preferred_element_type=jnp.float32) * scale
        valid = (i * block + offsets)[None, :] < lengths[:, None]  # [S, block]
        sc = jnp.where(valid[:, None, None], sc, _NEG_INF)
        m_new = jnp.maximum(m, jnp.max(sc, axis=-1))
        p = jnp.exp(sc - m_new[..., None]) * valid[:, None, None]
        corr = jnp.exp(m - m_new)
        pv = jnp.einsum(
            "skgb,sbkd->skgd", p.astype(vb.dtype), vb, preferred_element_type=jnp.float32
        )
        return m_new, denom * corr + jnp.sum(p, axis=-1), acc * corr[..., None] + pv

    groups = q.shape[2]
    init = (
        jnp.full((s, kvh, groups), _NEG_INF, jnp.float32),
        jnp.zeros((s, kvh, groups), jnp.float32),
        jnp.zeros((s, kvh, groups, d), jnp.float32),
    )
    _, denom, acc = jax.lax.fori_loop(0, num_blocks, body, init)
    return acc / jnp.maximum(denom, 1e-30)[..., None]


def paged_decode_attention(q, k, v, lengths, block: int) -> jax.Array:
    """`decode_attention`'s result (to float rounding) visiting only live (slot, block)
    pairs: the pairs are listed slot by slot (slot s has ceil(lengths[s] / block)), and
    each iteration takes the next S of them, gathers their pages, scores them against
    their slots' queries and merges the partial softmaxes into their slots (max, then
    rescaled sums). Iterations: ceil(live pairs / S) instead of the longest slot's blocks.
    Same contract as `decode_attention`; under a mesh each device runs its own slots."""
    if k.shape[1] % block:
        raise ValueError(f"cache length {k.shape[1]} is not a multiple of the block {block}")
    from da3po_jax.models.attention import per_shard

    def specs(rows, heads):
        kv = PartitionSpec(rows, None, heads)
        return (PartitionSpec(rows, heads), kv, kv, PartitionSpec(rows)), PartitionSpec(rows, heads)

    run = lambda q, k, v, lengths: _paged(q, k, v, lengths, block)  # noqa: E731
    return per_shard(run, (q, k, v, lengths), specs, q.shape[0], q.shape[1])


def _paged(q, k, v, lengths, block: int) -> jax.Array:
    s, cap, kvh, d = k.shape
    groups, per_slot = q.shape[2], cap // block
    pages_k = k.reshape(s * per_slot, block, kvh, d)
    pages_v = v.reshape(s * per_slot, block, kvh, d)
    blocks = (lengths + block - 1) // block  # [S] live blocks per slot
    ends = jnp.cumsum(blocks)  # pair j belongs to the first slot with ends > j
    total = ends[-1]
    scale, offsets, lanes = 1.0 / math.sqrt(d), jnp.arange(block), jnp.arange(s)

    def body(i, carry):
        m, denom, acc = carry
        pair = i * s + lanes
        slot = jnp.minimum(jnp.searchsorted(ends, pair, side="right"), s - 1)
        blk = pair - (ends[slot] - blocks[slot])
        page = slot * per_slot + jnp.clip(blk, 0, per_slot - 1)
        kb, vb = pages_k[page], pages_v[page]  # [S pairs, block, kv_heads, D]
        sc = jnp.einsum("skgd,sbkd->skgb", q[slot], kb, preferred_element_type=jnp.float32)
        valid = (pair < total)[:, None] & (blk[:, None] * block + offsets < lengths[slot, None])
        sc = jnp.where(valid[:, None, None], sc * scale, _NEG_INF)
        vb = jnp.where(valid[:, :, None, None], vb, 0)  # what lies past a length is never used
        m_pair = jnp.max(sc, axis=-1)  # [pairs, kv_heads, groups]
        m_new = jnp.maximum(m, jnp.full_like(m, _NEG_INF).at[slot].max(m_pair))
        p = jnp.exp(sc - m_new[slot][..., None]) * valid[:, None, None]
        pv = jnp.einsum(
            "skgb,sbkd->skgd", p.astype(vb.dtype), vb, preferred_element_type=jnp.float32
        )
        corr = jnp.exp(m - m_new)
        denom = denom * corr + jnp.zeros_like(denom).at[slot].add(jnp.sum(p, axis=-1))
        return m_new, denom, acc * corr[..., None] + jnp.zeros_like(acc).at[slot].add(pv)

    init = (
        jnp.full((s, kvh, groups), _NEG_INF, jnp.float32),
        jnp.zeros((s, kvh, groups), jnp.float32),
        jnp.zeros((s, kvh, groups, d), jnp.float32),
    )
    _, denom, acc = jax.lax.fori_loop(0, (total + s - 1) // s, body, init)
    return acc / jnp.maximum(denom, 1e-30)[..., None]


def resolve_decode(impl: str, platform: str) -> str:
    """The decode attention `impl` ("auto": "ragged" on TPU, else "paged") runs."""
    return ("ragged" if platform == "tpu" else "paged") if impl == "auto" else impl


def _ragged(q, k, v, lengths, block):
    from da3po_jax.models.decode_kernel import ragged_decode_attention

    return ragged_decode_attention(q, k, v, lengths, block)


DECODE = {"blockwise": decode_attention, "paged": paged_decode_attention, "ragged": _ragged}
