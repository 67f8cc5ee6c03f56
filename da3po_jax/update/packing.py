"""Sequence packing for the update: the mini-batch's (prompt, response) sequences packed
into rows of a fixed token budget, so the training forward costs the real tokens, not the
padded [rows, prompt_len + max_new_tokens] rectangle.

A response row of the batch is the left-padded prompt followed by the right-padded
response ("concat layout", `C = Tp + Tn` columns). Its real tokens, the last `Lp` prompt
columns and the first `Ln` response columns, form one sequence of `Lp + Ln` tokens.

Host side (`plan_packing`, deterministic): per mini-batch, first-fit decreasing puts each
sequence into the first packed row of `PackConfig.length` tokens with room (longest first,
ties by row index); packed row k goes to micro-batch k // `PackConfig.rows`. The plan is
three ints per response row: micro-batch, packed row, offset. Rows with nothing to train
on (dynamic-sampling slots without a group) are not packed (micro-batch -1).

Device side (`pack_micro`): one micro-batch's packed tokens, RoPE positions (restarting
at 0 per sequence), segment ids (row index + 1; 0 on padding) and next-token targets,
built by a scatter from the concat layout, and `dest`, each concat column's flat index in
the packed micro-batch. `packed_response_logprobs` runs the model on that and gathers the
log-probs back to the [R, Tn] response layout, so the loss (every aggregation mode, GSPO,
KL, OPD teacher log-probs) is computed per original response exactly as without packing.

The number of micro-batch slots per mini-batch is static (`micro_slots`): enough for the
worst case (every sequence at its maximum length); the update skips the slots a batch
does not use, so their cost is one `lax.cond`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct


@dataclasses.dataclass(frozen=True)
class PackConfig:
    """Packed micro-batches of `rows` rows of `length` tokens (static, hashable); length 0
    stands for the batch's row length, prompt bucket + max_new_tokens (`resolve`)."""

    length: int
    rows: int

    def __post_init__(self):
        if self.length < 0 or self.rows < 1:
            raise ValueError(f"PackConfig needs length >= 0 and rows >= 1, got {self}")

    def resolve(self, row_len: int) -> PackConfig:
        """This config with length 0 replaced by `row_len` (the batch's Tp + Tn)."""
        return self if self.length else dataclasses.replace(self, length=row_len)


@struct.dataclass
class PackPlan:
    """Where each response row's sequence goes; [R] int32 each, indices local to the
    row's mini-batch.

    Attributes:
      micro: micro-batch slot (-1: not packed, nothing to train on).
      row: packed row within the micro-batch.
      offset: first column of the sequence in that row.
    """

    micro: jax.Array
    row: jax.Array
    offset: jax.Array


def micro_slots(mini_batch_rows: int, max_seq_len: int, config: PackConfig) -> int:
    """Micro-batch slots per mini-batch that hold the worst case, every sequence
    `max_seq_len` long: first-fit decreasing never opens a row while an open one has room,
    so each full row holds at least `length // max_seq_len` sequences."""
    per_row = config.length // max_seq_len
    if per_row < 1:
        raise ValueError(
            f"pack length {config.length} is shorter than the longest sequence the batch can "
            f"hold (prompt + response = {max_seq_len} tokens)"
        )
    return math.ceil(math.ceil(mini_batch_rows / per_row) / config.rows)


def plan_packing(seq_lens: np.ndarray, config: PackConfig, mini_batch_rows: int) -> PackPlan:
    """First-fit-decreasing plan of every mini-batch (host, numpy, deterministic).

    Args:
      seq_lens: [R] tokens of each response row's sequence (prompt + response; 0: not
        packed), rows in batch order; R a multiple of `mini_batch_rows`.
      config: the packed row length and rows per micro-batch.
      mini_batch_rows: response rows per mini-batch (rows never move across mini-batches).

    Returns:
      `PackPlan` of numpy int32 [R] arrays.

    Raises:
      ValueError: a sequence is longer than `config.length` (names the row).
    """
    seq_lens = np.asarray(seq_lens, np.int64)
    too_long = np.flatnonzero(seq_lens > config.length)
    if too_long.size:
        r = int(too_long[0])
        raise ValueError(
            f"response row {r}: its sequence of {seq_lens[r]} tokens (prompt + response) "
            f"does not fit the pack length {config.length}"
        )
    plan = empty_plan(seq_lens.size)
    micro, row, offset = plan.micro, plan.row, plan.offset
    for start in range(0, seq_lens.size, mini_batch_rows):
        lens = seq_lens[start : start + mini_batch_rows]
        fill: list[int] = []  # tokens used in each packed row so far
        for i in sorted(np.flatnonzero(lens > 0), key=lambda i: (-lens[i], i)):
            k = next((k for k, used in enumerate(fill) if used + lens[i] <= config.length), None)
            if k is None:
                k = len(fill)
                fill.append(0)
            micro[start + i], row[start + i] = divmod(k, config.rows)
            offset[start + i] = fill[k]
            fill[k] += int(lens[i])
    return plan


def empty_plan(num_rows: int) -> PackPlan:
    """A plan of `num_rows` response rows, none packed (numpy int32 [R] arrays, which
    `plan_packing` fills; the compile planner reads the shapes)."""
    return PackPlan(
        micro=np.full((num_rows,), -1, np.int32),
        row=np.zeros((num_rows,), np.int32),
        offset=np.zeros((num_rows,), np.int32),
    )


@struct.dataclass
class PackedMicro:
    """One packed micro-batch, [rows, length] each, and the way back.

    Attributes:
      tokens, positions, targets: int32 inputs, RoPE positions and next-token targets.
      segment_ids: int32, row index + 1 of the response row whose sequence a slot holds
        (0: padding).
      dest: [R, C] int32 flat index (row * length + column) of each concat-layout column
        of the mini-batch in this micro-batch; `rows * length` where the column is not in
        it (padding, or the row is packed elsewhere).
    """

    tokens: jax.Array
    positions: jax.Array
    targets: jax.Array
    segment_ids: jax.Array
    dest: jax.Array


def pack_micro(
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    tokens: jax.Array,
    response_mask: jax.Array,
    plan: PackPlan,
    m: jax.Array,
    config: PackConfig,
) -> PackedMicro:
    """Micro-batch slot `m` of a mini-batch (device; `plan` holds its rows' entries).

    Args:
      prompt_tokens, prompt_mask: [R, Tp] left-padded prompts, one per response row.
      tokens, response_mask: [R, Tn] responses.
      plan: the rows' `PackPlan` ([R] each).
      m: [] int32 micro-batch slot.
    """
    r, tp = prompt_tokens.shape
    full = jnp.concatenate([prompt_tokens, tokens], axis=1)  # [R, C]
    nxt = jnp.concatenate([full[:, 1:], jnp.zeros_like(full[:, :1])], axis=1)
    lp = prompt_mask.sum(-1, dtype=jnp.int32)[:, None]
    ln = response_mask.sum(-1, dtype=jnp.int32)[:, None]
    rel = jnp.arange(full.shape[1], dtype=jnp.int32)[None, :] - (tp - lp)  # position in seq
    size = config.rows * config.length
    here = (rel >= 0) & (rel < lp + ln) & (plan.micro == m)[:, None]
    dest = plan.row[:, None] * config.length + plan.offset[:, None] + rel
    dest = jnp.where(here, dest, size)

    def scatter(values):
        flat = (
            jnp.zeros((size,), jnp.int32)
            .at[dest.reshape(-1)]
            .set(values.reshape(-1).astype(jnp.int32), mode="drop")
        )
        return flat.reshape(config.rows, config.length)

    seg = jnp.broadcast_to(jnp.arange(1, r + 1, dtype=jnp.int32)[:, None], full.shape)
    return PackedMicro(
        tokens=scatter(full),
        positions=scatter(jnp.maximum(rel, 0)),
        targets=scatter(nxt),
        segment_ids=scatter(seg),
        dest=dest,
    )


def unpack(values: jax.Array, dest: jax.Array) -> jax.Array:
    """Packed [rows, length] values -> the concat layout [R, C] (0 where not packed here)."""
    flat = values.reshape(-1)
    inside = dest < flat.shape[0]
    return jnp.where(inside, flat[jnp.minimum(dest, flat.shape[0] - 1)], 0.0)


def packed_response_logprobs(
    graphdef: Any,
    params: Any,
    rows: Any,
    m: jax.Array,
    config: PackConfig,
    sharding: Any = None,
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Teacher-forced log-probs and entropies [R, Tn] of the responses packed in micro-batch
    slot `m` (0 on the rows packed elsewhere), as `response_logprobs` gives them unpacked.

    Args:
      rows: the mini-batch's `update.rows.ResponseRows` (its inputs and `plan`).
      sharding: where the packed [rows, length] arrays live (batch axes), or None.
      temperature: of the policy softmax(logits / temperature).
    """
    packed = pack_micro(
        rows.prompt_tokens, rows.prompt_mask, rows.tokens, rows.response_mask, rows.plan, m, config
    )
    if sharding is not None:
        packed = jax.lax.with_sharding_constraint(packed, sharding)
    model = nnx.merge(graphdef, params)
    seg = packed.segment_ids
    logp, ent = model.token_logprobs(
        packed.tokens, packed.positions, seg > 0, packed.targets, temperature, segment_ids=seg
    )
    tp, tn = rows.prompt_tokens.shape[1], rows.tokens.shape[1]
    cut = lambda x: unpack(x, packed.dest)[:, tp - 1 : tp - 1 + tn]  # noqa: E731
    return cut(logp), cut(ent)


def sequence_lengths(batch, valid) -> np.ndarray:
    """Host [N * G] sequence lengths (prompt + response tokens) of a `GroupBatch`'s
    response rows, 0 for the rows of groups that `valid` [N] marks empty (not packed)."""
    lp, ln, valid = jax.device_get(
        (
            batch.prompt_mask.sum(-1, dtype=jnp.int32),
            batch.response_mask.sum(-1, dtype=jnp.int32),
            valid,
        )
    )
    lens = np.where(np.asarray(ln) > 0, np.asarray(lp)[:, None] + ln, 0)
    return np.where(np.asarray(valid, bool)[:, None], lens, 0).reshape(-1)


def when_used(fn, plan_micro: jax.Array, empty: Any):
    """`fn(m)` for a packed slot `m`, except that a slot no row is packed into
    (`plan_micro` [R]: each row's slot) gives `empty` through a `lax.cond`: a scan over
    the static worst-case slots costs only those a batch uses."""
    return lambda m: jax.lax.cond(jnp.any(plan_micro == m), fn, lambda _: empty, m)
