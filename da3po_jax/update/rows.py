"""`ResponseRows`: the update's view of a `GroupBatch`, one row per response.

The update works on responses, not groups: every array is `[R, ...]` with R = N * G rows
(response g of group n at row n * G + g), each prompt repeated for its G responses. The
record is built once from the batch (`from_groups`), then filled in stage by stage: the
advantages, loss mask and amplification flags (`with_advantages`), the frozen forwards'
log-probs (recomputed old, reference, teacher), and on packed updates the packing plan.
It is a pytree, so mini-batches and micro-batches are `jax.tree.map` slices of it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from da3po_jax.rollout.batch import GroupBatch
from da3po_jax.update.packing import PackPlan


@struct.dataclass
class ResponseRows:
    """Per-response rows of a step's batch; Tp = prompt length, Tn = max_new_tokens.

    Attributes:
      prompt_tokens: [R, Tp] int32 left-padded prompts (each repeated G times).
      prompt_mask: [R, Tp] bool.
      tokens: [R, Tn] int32 responses.
      response_mask: [R, Tn] bool, response tokens up to and including EOS.
      logp_old: [R, Tn] float32 log-probs of the policy that sampled (or, with
        `rollout.logp_old = "recompute"`, of the step's starting weights).
      logp_sample: [R, Tn] float32 log mu under the sampling distribution (truncated
        importance sampling), or None.
      plan: where each row's sequence is packed (`PackPlan`, [R] each), or None (padded).
      adv: [R] or [R, Tn] float32 advantages (per token for OPD); None until computed.
      loss_mask: [R, Tn] tokens the loss counts (overlong filter, RA-OPD); None until
        computed.
      amplified: [R] bool, DAA raised the row's advantage (clip-fraction metrics).
      logp_ref: [R, Tn] float32 log-probs of the frozen reference (KL term), or None.
    """

    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    tokens: jax.Array
    response_mask: jax.Array
    logp_old: jax.Array
    logp_sample: jax.Array | None = None
    plan: PackPlan | None = None
    adv: jax.Array | None = None
    loss_mask: jax.Array | None = None
    amplified: jax.Array | None = None
    logp_ref: jax.Array | None = None

    @classmethod
    def from_groups(cls, batch: GroupBatch, plan: PackPlan | None = None) -> ResponseRows:
        """The rows of `batch`'s N groups of G (prompts repeated for their samples)."""
        n, g = batch.tokens.shape[:2]
        flat = lambda x: None if x is None else x.reshape(n * g, *x.shape[2:])  # noqa: E731
        return cls(
            prompt_tokens=jnp.repeat(batch.prompt_tokens, g, axis=0),
            prompt_mask=jnp.repeat(batch.prompt_mask, g, axis=0),
            tokens=flat(batch.tokens),
            response_mask=flat(batch.response_mask),
            logp_old=flat(batch.logp_old),
            logp_sample=flat(batch.logp_sample),
            plan=plan,
        )

    @property
    def num_rows(self) -> int:
        return self.tokens.shape[0]

    @property
    def seq_len(self) -> int:
        """Columns of a row's prompt ++ response: Tp + Tn."""
        return self.prompt_tokens.shape[1] + self.tokens.shape[1]

    def split(self, parts: int) -> ResponseRows:
        """The rows as `parts` equal consecutive blocks: a leading [parts] axis on every
        array (mini-batches, micro-batches; scanned over)."""
        return jax.tree.map(lambda x: x.reshape(parts, -1, *x.shape[1:]), self)

    def inputs(self) -> tuple[Any, ...]:
        """(prompt_tokens, prompt_mask, tokens, response_mask): what a forward reads."""
        return self.prompt_tokens, self.prompt_mask, self.tokens, self.response_mask
