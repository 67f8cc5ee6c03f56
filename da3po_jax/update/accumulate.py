"""Gradient accumulation: one mini-batch's gradient summed over its micro-batches, the
same code for padded and packed micro-batches.

Every micro-batch's loss is divided by the normaliser of the whole mini-batch
(`rl.loss_normalizer`), so the summed micro-batch gradients are the mini-batch gradient
whatever the split (docs/algorithms.md, "Loss aggregation").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def accumulate_grads(
    loss_fn: Callable[[Any, Any], tuple[jax.Array, dict]],
    params: Any,
    micro: Any,
    used: Callable[[Any], jax.Array] | None = None,
) -> tuple[Any, jax.Array, dict[str, jax.Array]]:
    """Sums `value_and_grad(loss_fn)(params, m)` over the micro-batches `m` of `micro` (a
    pytree with a leading micro-batch axis: padded slices of rows, or packed slot ids)
    in one `lax.scan`.

    Args:
      loss_fn: `(params, m) -> (loss, metrics)`.
      used: `m -> bool`; a micro-batch it rejects is skipped (a `lax.cond`: no forward,
        the sums left as they are, zero metrics), e.g. a packed slot the batch leaves
        empty.

    Returns:
      (summed gradients, summed loss, metrics stacked [micro-batches]).
    """

    def grads_of(m):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, m)
        return grads, loss, metrics

    def add(acc, m):
        grads, loss, metrics = grads_of(m)
        acc_grads, acc_loss = acc
        return (jax.tree.map(jnp.add, acc_grads, grads), acc_loss + loss), metrics

    body = add
    if used is not None:
        one = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), micro)
        shapes = jax.eval_shape(grads_of, one)[2]

        def skip(acc, m):
            return acc, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

        # the condition around the sum, not around the gradients: a skipped micro-batch
        # leaves the sum as it is instead of adding a parameter-sized buffer of zeros
        body = lambda acc, m: jax.lax.cond(used(m), add, skip, acc, m)  # noqa: E731

    zeros = jax.tree.map(jnp.zeros_like, params)
    (grads, loss), metrics = jax.lax.scan(body, (zeros, jnp.zeros(())), micro)
    return grads, loss, metrics
