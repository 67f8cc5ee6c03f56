"""Teacher-forced forwards of the update: the log-probs (and entropies) of the sampled
responses under some parameters, padded or on packed micro-batches, and the frozen
forwards that take no gradient (recomputed old log-probs, the KL reference, the OPD
teacher).

A response row is its left-padded prompt followed by the response; the log-prob of
response token t is read at the position before it, so positions match the sampler's
(prompt length + t).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from da3po_jax.models import positions_from_mask
from da3po_jax.update.packing import (
    PackConfig,
    micro_slots,
    packed_response_logprobs,
    when_used,
)
from da3po_jax.update.rows import ResponseRows


def response_logprobs(
    graphdef, params, prompt_tokens, prompt_mask, tokens, response_mask, temperature=1.0
):
    """Teacher-forced log-probs and entropies of responses [R, Tn] given their prompts,
    under the policy softmax(logits / temperature)."""
    model = nnx.merge(graphdef, params)
    tp = prompt_tokens.shape[1]
    full = jnp.concatenate([prompt_tokens, tokens], axis=1)
    attn = jnp.concatenate([prompt_mask, response_mask], axis=1)
    targets = jnp.concatenate([full[:, 1:], jnp.zeros_like(full[:, :1])], axis=1)
    logp, ent = model.token_logprobs(full, positions_from_mask(attn), attn, targets, temperature)
    tn = tokens.shape[1]
    return logp[:, tp - 1 : tp - 1 + tn], ent[:, tp - 1 : tp - 1 + tn]


def num_slots(rows: ResponseRows, mini_batch_rows: int, pack: PackConfig) -> int:
    """Packed micro-batch slots per mini-batch of `mini_batch_rows` rows (the worst case)."""
    return micro_slots(mini_batch_rows, rows.seq_len, pack)


def packed_logprobs(
    graphdef,
    params,
    rows: ResponseRows,
    mini_batch_rows: int,
    pack: PackConfig,
    sharding,
    temperature: float = 1.0,
) -> jax.Array:
    """`response_logprobs(...)[0]` of every response row [R, Tn], computed on the packed
    micro-batches of each mini-batch (unused slots skipped; rows not packed get 0)."""
    r, tn = rows.tokens.shape
    n_slots = num_slots(rows, mini_batch_rows, pack)
    inputs = ResponseRows(*rows.inputs(), logp_old=None, plan=rows.plan)
    mbs = inputs.split(r // mini_batch_rows)
    slots = jnp.arange(n_slots, dtype=jnp.int32)

    def per_minibatch(_, mb: ResponseRows):
        empty = jnp.zeros((mini_batch_rows, tn), jnp.float32)
        fwd = lambda m: packed_response_logprobs(  # noqa: E731
            graphdef, params, mb, m, pack, sharding, temperature
        )[0]
        step = when_used(fwd, mb.plan.micro, empty)

        def body(acc, m):  # every row is in one slot: the slots' values add up
            return acc + step(m), None

        return None, jax.lax.scan(body, empty, slots)[0]

    return jax.lax.scan(per_minibatch, None, mbs)[1].reshape(r, tn)


def frozen_logprobs(
    graphdef, params, rows: ResponseRows, pack_args, temperature: float = 1.0
) -> jax.Array:
    """Log-probs [R, Tn] of the rows' responses under `params` at `temperature` with no
    gradient, on the update's layout: padded (`pack_args` None) or packed
    (`(mini_batch_rows, pack, sharding)`)."""
    if pack_args is None:
        logp = response_logprobs(graphdef, params, *rows.inputs(), temperature)[0]
    else:
        logp = packed_logprobs(graphdef, params, rows, *pack_args, temperature)
    return jax.lax.stop_gradient(logp)
