"""Small array helpers shared by the `rl` modules (pure jnp, no package imports)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def as_float(x: jax.Array) -> jax.Array:
    """Casts to a floating dtype of at least float32 precision (keeps float64 under x64)."""
    x = jnp.asarray(x)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def to_groups(x: jax.Array, group_size: int) -> jax.Array:
    """Views per-response values as `[P, G]`.

    Args:
      x: `[P * G]` (group-major: response i of group g at index g * G + i) or `[P, G]`.
      group_size: G.

    Returns:
      The `[P, G]` view.
    """
    x = jnp.asarray(x)
    if x.ndim == 1:
        if x.shape[0] % group_size:
            raise ValueError(f"length {x.shape[0]} is not a multiple of group_size={group_size}")
        return x.reshape(-1, group_size)
    if x.ndim == 2:
        if x.shape[1] != group_size:
            raise ValueError(f"shape {x.shape} does not match group_size={group_size}")
        return x
    raise ValueError(f"expected a [P*G] or [P, G] array, got shape {x.shape}")


def valid_or_ones(valid: jax.Array | None, like: jax.Array) -> jax.Array:
    """Returns `valid` as a bool array shaped like `like`, or all-True when None."""
    if valid is None:
        return jnp.ones(like.shape, bool)
    return jnp.broadcast_to(jnp.asarray(valid, bool), like.shape)


def safe_div(num: jax.Array, den: jax.Array, default: float = 0.0) -> jax.Array:
    """`num / den` where `den != 0`, else `default`; gradient-safe (no NaN in either branch)."""
    ok = den != 0
    return jnp.where(ok, num / jnp.where(ok, den, 1), default)


def odds(x: jax.Array) -> jax.Array:
    """`odds(x) = x / (1 - x)` (inf at x = 1)."""
    return x / (1.0 - x)
