"""Per-group statistics of per-response values (pure jnp).

Per-response arrays are either flat `[P * G]`, group-major (response i of group g sits at
index `g * G + i`), or already grouped `[P, G]`. Variable group sizes are expressed with a
per-response `valid` mask.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from da3po_jax.rl._utils import as_float, safe_div, to_groups, valid_or_ones


class GroupStats(NamedTuple):
    """Per-group statistics of a per-response value; every field is `[P]`."""

    mean: jax.Array  # [P] mean over valid responses (0 for an empty group)
    std: jax.Array  # [P] std with the requested ddof (0 for fewer than ddof + 1 responses)
    count: jax.Array  # [P] number of valid responses
    constant: jax.Array  # [P] bool: zero variance or fewer than 2 valid responses


def group_stats(
    values: jax.Array, group_size: int, valid: jax.Array | None = None, *, std_ddof: int = 1
) -> GroupStats:
    """Masked per-group mean, std and zero-variance flag.

    mean_g = sum_i v_i x_i / n_g, std_g = sqrt(sum_i v_i (x_i - mean_g)^2 / max(n_g - ddof, 1)),
    with v the validity mask and n_g = sum_i v_i. A group is `constant` when all its valid
    values are exactly equal (max == min, so float round-off in the mean cannot make a
    constant group look variable) or when it has fewer than 2 valid responses.

    Args:
      values: `[P * G]` or `[P, G]` per-response values.
      group_size: G.
      valid: optional per-response mask of the same shape.
      std_ddof: 0 or 1.

    Returns:
      A `GroupStats` of `[P]` arrays.
    """
    x = to_groups(as_float(values), group_size)
    v = to_groups(valid_or_ones(valid, jnp.asarray(values)), group_size)
    n = v.sum(-1)
    mean = safe_div(jnp.where(v, x, 0).sum(-1), n)
    sq = jnp.where(v, (x - mean[:, None]) ** 2, 0).sum(-1)
    std = jnp.sqrt(sq / jnp.maximum(n - std_ddof, 1))
    hi = jnp.where(v, x, -jnp.inf).max(-1)
    lo = jnp.where(v, x, jnp.inf).min(-1)
    constant = (n < 2) | (hi == lo)
    return GroupStats(mean=mean, std=jnp.where(n > std_ddof, std, 0.0), count=n, constant=constant)


def group_accuracy(
    correct: jax.Array, group_size: int, valid: jax.Array | None = None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Group accuracy mu_g = k_g / n_g.

    Args:
      correct: `[P * G]` or `[P, G]` correctness c_i in {0, 1}.
      group_size: G.
      valid: optional per-response mask.

    Returns:
      `(mu, k, n)`, each `[P]`: accuracy, number correct and number of valid responses.
    """
    c = to_groups(as_float(correct), group_size)
    v = to_groups(valid_or_ones(valid, jnp.asarray(correct)), group_size)
    k = jnp.where(v, c, 0).sum(-1)
    n = v.sum(-1).astype(k.dtype)
    return safe_div(k, n), k, n
