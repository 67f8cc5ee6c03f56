"""On-policy distillation (OPD) advantages and the RA-OPD alignment mask (docs/algorithms.md).

Student = the policy being trained, teacher = a frozen model with the same tokenizer. Per
sampled token, k_t = logp_student_old(y_t) - logp_teacher(y_t) (a reverse-KL estimate) and
the per-token advantage is A_t = -coef * k_t, optionally discounted,
A_t = sum_{s >= t} gamma^(s - t) (-coef k_s), plus the response's GRPO outcome advantage
when `with_outcome` is set. The loss is `da3po_loss` with these `[B, T]` advantages.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from da3po_jax.rl._utils import as_float, safe_div, to_groups, valid_or_ones
from da3po_jax.rl.fields import check_fields, choice, non_negative, positive, setting, unit

_BASELINES = ("none", "group_mean")


@dataclasses.dataclass(frozen=True)
class OPDConfig:
    """OPD settings, the run's `opd` section (hashable)."""

    coef: float = setting(
        1.0, "A_t = -coef * (logp_student_old - logp_teacher), per token", positive
    )
    gamma: float = setting(0.0, "discount of the per-token return (0: no discounting)", unit)
    with_outcome: bool = setting(
        False, "add the GRPO outcome advantage of the response to every token"
    )

    def __post_init__(self):
        check_fields(self)


@dataclasses.dataclass(frozen=True)
class RAOPDConfig:
    """RA-OPD settings, the run's `ra_opd` section (hashable)."""

    delta: float = setting(
        0.0, "margin: aligned iff (c = 1 and D > delta) or (c = 0 and D < -delta)", non_negative
    )
    baseline: str = setting(
        "none", "none (compare D with 0) | group_mean (with its group mean)", choice(*_BASELINES)
    )

    def __post_init__(self):
        check_fields(self)


def _discounted_reverse_cumsum(r: jax.Array, gamma: float) -> jax.Array:
    """G_t = r_t + gamma G_{t+1} along the last axis (a reverse `lax.scan` over T)."""

    def step(carry, r_t):
        g = r_t + gamma * carry
        return g, g

    _, out = jax.lax.scan(
        step, jnp.zeros(r.shape[:-1], r.dtype), jnp.moveaxis(r, -1, 0), reverse=True
    )
    return jnp.moveaxis(out, 0, -1)


def opd_advantages(
    logp_student_old: jax.Array,
    logp_teacher: jax.Array,
    mask: jax.Array,
    *,
    config: OPDConfig | None = None,
    outcome_advantages: jax.Array | None = None,
) -> jax.Array:
    """Per-token OPD advantages.

    A_t = sum_{s >= t} gamma^(s - t) m_s (-coef k_s) with k_s = logp_student_old - logp_teacher
    (A_t = -coef k_t for gamma = 0), plus `outcome_advantages[b]` on every token when
    `config.with_outcome`; 0 on masked positions.

    Args:
      logp_student_old: `[B, T]` log-probs of the sampled tokens under the sampling student.
      logp_teacher: `[B, T]` teacher log-probs of the same tokens.
      mask: `[B, T]` response mask.
      config: `OPDConfig`.
      outcome_advantages: `[B]` GRPO advantages (required when `with_outcome`).

    Returns:
      `[B, T]` advantages for `da3po_loss`.
    """
    config = config or OPDConfig()
    m = jnp.asarray(mask) > 0
    k = jnp.where(m, as_float(logp_student_old) - as_float(logp_teacher), 0.0)
    adv = -config.coef * k
    if config.gamma > 0:
        adv = _discounted_reverse_cumsum(adv, config.gamma)
    if config.with_outcome:
        if outcome_advantages is None:
            raise ValueError("OPDConfig.with_outcome needs outcome_advantages")
        adv = adv + as_float(outcome_advantages)[:, None]
    return jnp.where(m, adv, 0.0)


def distillation_return(
    logp_student_old: jax.Array, logp_teacher: jax.Array, mask: jax.Array
) -> jax.Array:
    """D = sum_t m_t (logp_teacher(y_t) - logp_student_old(y_t)), `[B, T] -> [B]`."""
    m = jnp.asarray(mask) > 0
    return jnp.where(m, as_float(logp_teacher) - as_float(logp_student_old), 0.0).sum(-1)


def ra_opd_mask(
    d_return: jax.Array,
    correct: jax.Array,
    *,
    config: RAOPDConfig | None = None,
    group_size: int | None = None,
    valid: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Reward-aligned OPD: keep trajectories whose distillation return agrees with c.

    With D' = D (baseline "none") or D - mean_group(D) (baseline "group_mean"), a trajectory
    is aligned iff (c = 1 and D' > delta) or (c = 0 and D' < -delta); misaligned ones get
    mask 0 (multiply the token mask by the result).

    Args:
      d_return: `[B]` distillation returns D (B = P * G, group-major for "group_mean").
      correct: `[B]` correctness.
      config: `RAOPDConfig`.
      group_size: G, required for the "group_mean" baseline.
      valid: optional `[B]` mask of real trajectories.

    Returns:
      `(keep, metrics)`: `[B]` bool keep mask; `ra_opd/kept_frac`,
      `ra_opd/aligned_frac_correct`, `ra_opd/aligned_frac_incorrect` over valid trajectories.
    """
    config = config or RAOPDConfig()
    d = as_float(d_return)
    v = valid_or_ones(valid, d)
    if config.baseline == "group_mean":
        if group_size is None:
            raise ValueError("baseline='group_mean' needs group_size")
        dg, vg = to_groups(d, group_size), to_groups(v, group_size)
        mean = safe_div(jnp.where(vg, dg, 0).sum(-1), vg.sum(-1))
        d = (dg - mean[:, None]).reshape(d.shape)
    c = jnp.asarray(correct) > 0
    aligned = jnp.where(c, d > config.delta, d < -config.delta)
    keep = aligned & v
    metrics = {
        "ra_opd/kept_frac": safe_div(keep.sum(), v.sum()),
        "ra_opd/aligned_frac_correct": safe_div((keep & c).sum(), (v & c).sum()),
        "ra_opd/aligned_frac_incorrect": safe_div((keep & ~c).sum(), (v & ~c).sum()),
    }
    return keep, metrics
