"""The update's metrics, one value per step from the values of every micro-batch,
mini-batch and pass."""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Micro-batch metrics that are not token means of their own micro-batch: the partial sums
# of the mini-batch loss, and means over a subset of tokens (weighted by its own count).
_SUMMED_OVER_MICRO = ("loss/pg",)
_WEIGHTED_BY = {"loss/clipfrac_high_amplified": "loss/num_amplified_tokens"}


def combine_metrics(metrics: dict[str, jax.Array], num_iterations: int) -> dict[str, jax.Array]:
    """One value per step from the metrics stacked `[iterations, mini-batches, micro]`.

    Token means are weighted by their micro-batch's token count (an empty micro-batch
    does not drag them towards 0) and means over a subset of tokens by that subset's
    count; `loss/pg`, whose micro-batch values are partial sums of the mini-batch loss
    (they share its normaliser), is summed over micro-batches and averaged over the
    mini-batches that had tokens; token counts are those of one pass over the batch.
    """
    counts = ("loss/num_tokens", *_WEIGHTED_BY.values())
    nonempty = (metrics["loss/num_tokens"].sum(-1) > 0).astype(jnp.float32)  # [iters, mbs]
    out = {}
    for k, v in metrics.items():
        if k in counts:
            out[k] = v.sum() / num_iterations
        elif k == "loss/ratio_max":
            out[k] = v.max()
        elif k in _SUMMED_OVER_MICRO:
            out[k] = (v.sum(-1) * nonempty).sum() / jnp.maximum(nonempty.sum(), 1.0)
        else:
            w = metrics[_WEIGHTED_BY.get(k, "loss/num_tokens")]
            out[k] = (v * w).sum() / jnp.maximum(w.sum(), 1e-9)
    return out


def mean_over_applied(x: jax.Array, applied: jax.Array) -> jax.Array:
    a = applied.astype(jnp.float32)
    return jnp.where(applied, x, 0.0).sum() / jnp.maximum(a.sum(), 1.0)
