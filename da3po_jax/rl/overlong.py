"""DAPO overlong handling: soft punishment of long responses and truncation filtering.

Lengths are in tokens (never characters). With L_max the response cap, L_buf the buffer and
L_exp = L_max - L_buf:

    R_len(L) = 0                      if L <= L_exp
             = (L_exp - L) / L_buf    if L_exp < L <= L_max
             = -1                     if L > L_max

multiplied by `penalty` and added to the reward R (never to the correctness c).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from da3po_jax.rl._utils import as_float
from da3po_jax.rl.fields import SettingError, check_fields, non_negative, positive, setting


@dataclasses.dataclass(frozen=True)
class OverlongConfig:
    """Overlong settings, the run's `overlong` section with the response cap `max_len`
    (hashable; usable as a static jit argument)."""

    max_len: int = setting(
        dataclasses.MISSING,
        "response cap L_max in tokens (the run's rollout.max_new_tokens)",
        positive,
        config=False,
    )

    _: dataclasses.KW_ONLY
    filter: bool = setting(False, "truncated responses get mask 0", preset=True)
    buffer: int = setting(
        0,
        "soft-punishment buffer L_buf in tokens (0: no soft punishment)",
        non_negative,
        preset=True,
    )
    penalty: float = setting(1.0, "multiplier of R_len", non_negative)

    def __post_init__(self):
        check_fields(self)
        if self.buffer > self.max_len:
            problem = f"exceeds max_len={self.max_len} (the response cap)"
            raise SettingError(type(self).__name__, "buffer", self.buffer, problem)


def soft_overlong_punishment(
    lengths: jax.Array, max_len: int, buffer_len: int, penalty: float = 1.0
) -> jax.Array:
    """Soft overlong punishment penalty * R_len(L) (see the module docstring).

    With `buffer_len = 0` the middle branch is empty: 0 up to L_max and -1 beyond.

    Args:
      lengths: `[B]` response lengths L in tokens.
      max_len: L_max.
      buffer_len: L_buf.
      penalty: multiplier.

    Returns:
      `[B]` reward shaping term (<= 0).
    """
    length = as_float(lengths)
    l_exp = max_len - buffer_len
    ramp = (l_exp - length) / max(buffer_len, 1)
    r = jnp.where(length <= l_exp, 0.0, jnp.where(length <= max_len, ramp, -1.0))
    return penalty * r


def overlong_filter_mask(mask: jax.Array, truncated: jax.Array) -> jax.Array:
    """Overlong filtering: m'_{b,t} = m_{b,t} * (1 - truncated_b).

    Args:
      mask: `[B, T]` response-token mask (or `[B]` per-response mask).
      truncated: `[B]` bool, hit the length cap without EOS.

    Returns:
      The mask with truncated responses zeroed, same shape and dtype as `mask`.
    """
    mask = jnp.asarray(mask)
    keep = ~jnp.asarray(truncated, bool)
    keep = keep.reshape(keep.shape + (1,) * (mask.ndim - keep.ndim))
    return jnp.where(keep, mask, jnp.zeros_like(mask))


def apply_overlong(
    rewards: jax.Array,
    lengths: jax.Array,
    truncated: jax.Array,
    mask: jax.Array,
    config: OverlongConfig,
) -> tuple[jax.Array, jax.Array]:
    """Applies both overlong mechanisms of `config`.

    Args:
      rewards: `[B]` rewards R.
      lengths: `[B]` response lengths in tokens.
      truncated: `[B]` truncation flags.
      mask: `[B, T]` response-token mask.
      config: `OverlongConfig`.

    Returns:
      `(R + penalty * R_len(L), mask')` (the mask filtered only if `config.filter`).
    """
    r = as_float(rewards)
    if config.buffer > 0:
        r = r + soft_overlong_punishment(lengths, config.max_len, config.buffer, config.penalty)
    if config.filter:
        mask = overlong_filter_mask(mask, truncated)
    return r, mask
