"""On-policy distillation inside the update: the teacher's log-probs of the sampled
responses turn into per-token advantages (OPD) and, for RA-OPD, a filter of the
trajectories whose distillation return disagrees with their outcome (docs/algorithms.md,
"OPD" / "RA-OPD")."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from da3po_jax.rl import (
    OPDConfig,
    RAOPDConfig,
    distillation_return,
    opd_advantages,
    ra_opd_mask,
)
from da3po_jax.update.rows import ResponseRows


def masked_stats(x: jax.Array, valid: jax.Array, prefix: str) -> dict[str, jax.Array]:
    """Mean, std, min and max of `x` over `valid` entries (0 when there are none)."""
    n = valid.sum()
    mean = jnp.where(valid, x, 0.0).sum() / jnp.maximum(n, 1)
    var = jnp.where(valid, (x - mean) ** 2, 0.0).sum() / jnp.maximum(n, 1)
    lo = jnp.where(valid, x, jnp.inf).min()
    hi = jnp.where(valid, x, -jnp.inf).max()
    return {
        f"{prefix}_mean": mean,
        f"{prefix}_std": jnp.sqrt(var),
        f"{prefix}_min": jnp.where(n > 0, lo, 0.0),
        f"{prefix}_max": jnp.where(n > 0, hi, 0.0),
    }


def distillation_advantages(
    rows: ResponseRows,
    logp_teacher: jax.Array,
    correct: jax.Array,
    opd: OPDConfig,
    ra_opd: RAOPDConfig | None,
    group_size: int,
):
    """Per-token OPD advantages `[R, Tn]` (the rows' outcome advantages added when
    `opd.with_outcome`), the loss mask after the RA-OPD filter, and metrics: mean reverse
    KL per token, the distribution of the distillation return D over trajectories, and
    (RA-OPD) kept / aligned fractions."""
    lp_old = rows.logp_old
    m = rows.loss_mask > 0
    adv = opd_advantages(lp_old, logp_teacher, m, config=opd, outcome_advantages=rows.adv)
    d_return = distillation_return(lp_old, logp_teacher, m)
    has_tokens = m.any(-1)
    kl = jnp.where(m, lp_old - logp_teacher, 0.0).sum() / jnp.maximum(m.sum(), 1)
    metrics = {"opd/reverse_kl": kl, **masked_stats(d_return, has_tokens, "opd/return")}
    if ra_opd is not None:
        keep, ra_metrics = ra_opd_mask(
            d_return, correct, config=ra_opd, group_size=group_size, valid=has_tokens
        )
        m = m & keep[:, None]
        metrics.update(ra_metrics)
    metrics["opd/adv_token_mean"] = jnp.where(m, adv, 0.0).sum() / jnp.maximum(m.sum(), 1)
    return adv, m, metrics
