"""DAPO dynamic sampling: keep mask and fixed-capacity, order-preserving group selection.

A group is kept iff the chosen metric (correctness c by default, or reward R) has non-zero
variance within the group. Kept groups of successive generation rounds accumulate in a
fixed-capacity buffer (`DSBuffer`); once it holds the training batch the step trains on it
(empty slots masked by `valid`), and kept groups that did not fit (the *surplus*) are
returned so the host can seed the next step's buffer with them. Every function here has
fixed output shapes and jits once per (capacity, round size); the loop over rounds, the
choice of new prompts and the `max_prompts` warning are host-side.

Groups are the leading axis of every leaf of an `items` pytree (e.g. tokens `[N, G, T]`,
rewards `[N, G]`, prompt ids `[N]`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from da3po_jax.rl._utils import safe_div, valid_or_ones
from da3po_jax.rl.groups import group_accuracy, group_stats

_METRICS = ("acc", "reward")


def ds_keep_mask(
    correct: jax.Array,
    rewards: jax.Array | None,
    group_size: int,
    *,
    metric: str = "acc",
    valid: jax.Array | None = None,
) -> jax.Array:
    """Keep mask of dynamic sampling: keep_g = (metric has non-zero variance in group g).

    Variance is tested exactly (max != min over the group's valid responses); a group with
    fewer than two valid responses is not kept.

    Args:
      correct: `[P * G]` or `[P, G]` correctness c_i.
      rewards: rewards R_i, same shape (needed only for `metric="reward"`).
      group_size: G.
      metric: `"acc"` (default) or `"reward"`.
      valid: optional per-response mask.

    Returns:
      `[P]` bool keep mask.
    """
    if metric not in _METRICS:
        raise ValueError(f"ds.metric must be one of {_METRICS}, got {metric!r}")
    values = correct if metric == "acc" else rewards
    if values is None:
        raise ValueError("metric='reward' needs rewards")
    return ~group_stats(values, group_size, valid, std_ddof=0).constant


def ds_group_metrics(
    correct: jax.Array,
    group_size: int,
    *,
    keep: jax.Array | None = None,
    valid: jax.Array | None = None,
    group_valid: jax.Array | None = None,
) -> dict[str, jax.Array]:
    """Accuracy statistics of the groups generated in a step.

    Args:
      correct: `[P * G]` or `[P, G]` correctness of all generated groups.
      group_size: G.
      keep: optional `[P]` keep mask (default: `ds_keep_mask` by accuracy).
      valid: optional per-response mask.
      group_valid: optional `[P]` mask of generated groups (default: groups with a response).

    Returns:
      Scalars `ds/kept_frac`, `ds/all_correct_frac`, `ds/all_wrong_frac` (fractions of
      valid generated groups) and `ds/num_groups`.
    """
    mu, _, n = group_accuracy(correct, group_size, valid)
    gv = valid_or_ones(group_valid, mu) & (n > 0)
    if keep is None:
        keep = ds_keep_mask(correct, None, group_size, valid=valid)
    total = gv.sum()
    return {
        "ds/kept_frac": safe_div((gv & keep).sum(), total),
        "ds/all_correct_frac": safe_div((gv & (mu >= 1)).sum(), total),
        "ds/all_wrong_frac": safe_div((gv & (mu <= 0)).sum(), total),
        "ds/num_groups": total,
    }


class Selection(NamedTuple):
    """Order-preserving selection of the kept entries of a mask into `capacity` slots."""

    indices: jax.Array  # [C] int32 source index of each slot (0 where empty)
    valid: jax.Array  # [C] bool: slot holds a kept entry
    count: jax.Array  # [] int32 number of filled slots = min(total kept, C)
    surplus_indices: jax.Array  # [N] int32 kept entries beyond capacity, in order (0-padded)
    surplus_valid: jax.Array  # [N] bool
    surplus_count: jax.Array  # [] int32 = max(total kept - C, 0)


def select_kept(keep: jax.Array, capacity: int) -> Selection:
    """Indices of the kept entries, in order, split into the first `capacity` and the rest.

    With pos_j = cumsum(keep)_j - 1 the rank of kept entry j, slot pos_j of the output gets
    j if pos_j < capacity, else slot pos_j - capacity of the surplus does. Implemented as
    scatters with out-of-range drops, so shapes are fixed and it jits.

    Args:
      keep: `[N]` bool mask.
      capacity: number of output slots C (static).

    Returns:
      A `Selection`.
    """
    keep = jnp.asarray(keep, bool)
    n = keep.shape[0]
    pos = jnp.cumsum(keep.astype(jnp.int32)) - 1
    src = jnp.arange(n, dtype=jnp.int32)
    slot = jnp.where(keep & (pos < capacity), pos, capacity)  # capacity -> dropped
    idx = jnp.zeros(capacity, jnp.int32).at[slot].set(src, mode="drop")
    sur_slot = jnp.where(keep & (pos >= capacity), pos - capacity, n)
    sur_idx = jnp.zeros(n, jnp.int32).at[sur_slot].set(src, mode="drop")
    total = keep.sum(dtype=jnp.int32)
    count = jnp.minimum(total, capacity)
    sur_count = jnp.maximum(total - capacity, 0)
    return Selection(
        indices=idx,
        valid=jnp.arange(capacity) < count,
        count=count,
        surplus_indices=sur_idx,
        surplus_valid=jnp.arange(n) < sur_count,
        surplus_count=sur_count,
    )


class DSBuffer(NamedTuple):
    """Fixed-capacity buffer of kept groups (a pytree; carry it across rounds and steps)."""

    items: Any  # pytree, every leaf [C, ...]; empty slots hold zeros
    valid: jax.Array  # [C] bool, a prefix: slots [0, count) are filled
    count: jax.Array  # [] int32


def ds_empty_buffer(items_like: Any, capacity: int) -> DSBuffer:
    """An empty buffer whose leaves are shaped `[capacity, *leaf.shape[1:]]`.

    Args:
      items_like: a pytree of one round's groups (only shapes and dtypes are used).
      capacity: C.
    """
    zeros = lambda x: jnp.zeros((capacity, *jnp.shape(x)[1:]), jnp.asarray(x).dtype)
    return DSBuffer(
        items=jax.tree.map(zeros, items_like),
        valid=jnp.zeros(capacity, bool),
        count=jnp.zeros((), jnp.int32),
    )


def _gather(tree: Any, indices: jax.Array, valid: jax.Array) -> Any:
    """tree[indices] along axis 0, with zeros where `valid` is False."""

    def take(x):
        g = jnp.take(x, indices, axis=0)
        return jnp.where(valid.reshape(-1, *([1] * (g.ndim - 1))), g, jnp.zeros_like(g))

    return jax.tree.map(take, tree)


def ds_add_round(buffer: DSBuffer, items: Any, keep: jax.Array) -> tuple[DSBuffer, DSBuffer]:
    """Appends a round's kept groups to the buffer, preserving order; returns the surplus.

    The candidates are the buffer's filled slots followed by the round's kept groups; the
    first C fill the new buffer and the rest form the surplus, a `DSBuffer` with one slot per
    group of the round (`[N, ...]`), for the host to carry over to the next step.

    Args:
      buffer: the current `DSBuffer` (capacity C).
      items: pytree of the round's N groups (leaves `[N, ...]`, same trailing shapes).
      keep: `[N]` keep mask (e.g. `ds_keep_mask`), may be combined with other filters.

    Returns:
      `(new_buffer, surplus)`.
    """
    cap = buffer.valid.shape[0]
    joined = jax.tree.map(
        lambda b, x: jnp.concatenate([b, jnp.asarray(x, b.dtype)], 0), buffer.items, items
    )
    sel = select_kept(jnp.concatenate([buffer.valid, jnp.asarray(keep, bool)]), cap)
    new = DSBuffer(_gather(joined, sel.indices, sel.valid), sel.valid, sel.count)
    n_new = jnp.shape(keep)[0]
    # Surplus has at most N entries because the buffer held at most C.
    sur_idx, sur_valid = sel.surplus_indices[:n_new], sel.surplus_valid[:n_new]
    surplus = DSBuffer(_gather(joined, sur_idx, sur_valid), sur_valid, sel.surplus_count)
    return new, surplus


def ds_take(buffer: DSBuffer, n: int) -> tuple[DSBuffer, DSBuffer]:
    """Splits a buffer into its first n slots (a training batch) and the rest (shifted).

    Useful when the buffer capacity exceeds the training batch P.

    Args:
      buffer: a `DSBuffer` with capacity C >= n.
      n: batch size (static).

    Returns:
      `(batch, rest)` with capacities n and C - n; both keep the prefix-valid layout.
    """
    head = jax.tree.map(lambda x: x[:n], buffer.items)
    tail = jax.tree.map(lambda x: x[n:], buffer.items)
    count_head = jnp.minimum(buffer.count, n)
    batch = DSBuffer(head, buffer.valid[:n], count_head)
    rest = DSBuffer(tail, buffer.valid[n:], buffer.count - count_head)
    return batch, rest


def expand_group_mask(group_mask: jax.Array, group_size: int) -> jax.Array:
    """`[P]` group mask -> `[P * G]` per-response mask (group-major)."""
    return jnp.repeat(jnp.asarray(group_mask, bool), group_size)
