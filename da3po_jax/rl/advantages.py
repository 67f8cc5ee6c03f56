"""Outcome advantages: GRPO / Dr.GRPO and RLOO (docs/algorithms.md, "GRPO advantages").

Per-response arrays are either flat `[P * G]`, group-major (response i of group g sits at
index `g * G + i`), or already grouped `[P, G]`; every function returns the layout it was
given. Variable group sizes are expressed with a per-response `valid` mask.

`AdvantageConfig.estimator` names an entry of `ADVANTAGE_ESTIMATORS`: a function
`fn(rewards [P, G] float, valid [P, G] bool, config) -> advantages [P, G]` (0 for invalid
responses). A new stateless estimator is one such function plus
`ADVANTAGE_ESTIMATORS.register("name", fn)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from da3po_jax.rl._utils import as_float, safe_div, to_groups, valid_or_ones
from da3po_jax.rl.daa import BetaPrior, DAAConfig, PromptHistory, apply_daa
from da3po_jax.rl.fields import check_fields, choice, non_negative, setting
from da3po_jax.rl.groups import group_stats
from da3po_jax.rl.registry import Registry

_NORMS = ("std", "none")

AdvantageEstimator = Callable[[jax.Array, jax.Array, "AdvantageConfig"], jax.Array]
ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
    """Config of the outcome advantage, the run's `adv` section (hashable; usable as a
    static jit argument)."""

    estimator: str = setting(
        "grpo",
        "a name in ADVANTAGE_ESTIMATORS: grpo (group-normalised, see norm) | rloo "
        "(leave-one-out; ignores norm, std_ddof, eps)",
        ADVANTAGE_ESTIMATORS.check,  # a bound method: registrations count at check time
    )
    norm: str = setting(
        "std", "std (GRPO: divide by the group std) | none (Dr.GRPO)", choice(*_NORMS)
    )
    std_ddof: int = setting(
        1, "delta degrees of freedom of the group std (1: sample std)", choice(0, 1)
    )
    eps: float = setting(1e-6, "added to the group std in the denominator", non_negative)

    def __post_init__(self):
        check_fields(self)


def grpo_advantages(
    rewards: jax.Array,
    group_size: int,
    *,
    valid: jax.Array | None = None,
    norm: str = "std",
    std_ddof: int = 1,
    eps: float = 1e-6,
) -> jax.Array:
    """GRPO (or Dr.GRPO) outcome advantages.

    A_i = (R_i - mean_g R) / (std_g R + eps) for `norm="std"`, A_i = R_i - mean_g R for
    `norm="none"` (Dr.GRPO). A group with zero reward variance, or with fewer than two valid
    responses, gets A = 0 for all its responses; invalid responses get 0.

    Args:
      rewards: `[P * G]` or `[P, G]` outcome rewards R_i.
      group_size: G.
      valid: optional per-response mask (same shape).
      norm: `"std"` or `"none"`.
      std_ddof: 0 or 1 (default 1, sample std, as verl and TRL).
      eps: added to the std.

    Returns:
      Advantages with the shape of `rewards`.
    """
    shape = jnp.shape(rewards)
    x = to_groups(as_float(rewards), group_size)
    v = to_groups(valid_or_ones(valid, jnp.asarray(rewards)), group_size)
    st = group_stats(x, group_size, v, std_ddof=std_ddof)
    centred = x - st.mean[:, None]
    if norm == "std":
        centred = centred / (st.std[:, None] + eps)
    elif norm != "none":
        raise ValueError(f"norm must be one of {_NORMS}, got {norm!r}")
    adv = jnp.where(v & ~st.constant[:, None], centred, 0.0)
    return adv.reshape(shape)


def rloo_advantages(
    rewards: jax.Array, group_size: int, *, valid: jax.Array | None = None
) -> jax.Array:
    """RLOO (leave-one-out) outcome advantages.

    A_i = R_i - mean_{j != i, valid_j} R_j = n_g / (n_g - 1) * (R_i - mean_g R) over the
    group's n_g valid responses. A group with zero reward variance, or with fewer than two
    valid responses, gets A = 0 for all its responses; invalid responses get 0.

    Args:
      rewards: `[P * G]` or `[P, G]` outcome rewards R_i.
      group_size: G.
      valid: optional per-response mask (same shape).

    Returns:
      Advantages with the shape of `rewards`.
    """
    shape = jnp.shape(rewards)
    x = to_groups(as_float(rewards), group_size)
    v = to_groups(valid_or_ones(valid, jnp.asarray(rewards)), group_size)
    st = group_stats(x, group_size, v)
    total = jnp.where(v, x, 0.0).sum(-1, keepdims=True)
    others = (total - x) / jnp.maximum(st.count - 1, 1)[:, None]
    adv = jnp.where(v & ~st.constant[:, None], x - others, 0.0)
    return adv.reshape(shape)


@ADVANTAGE_ESTIMATORS.register("grpo")
def _grpo_estimator(rewards: jax.Array, valid: jax.Array, config: AdvantageConfig) -> jax.Array:
    return grpo_advantages(
        rewards,
        rewards.shape[1],
        valid=valid,
        norm=config.norm,
        std_ddof=config.std_ddof,
        eps=config.eps,
    )


@ADVANTAGE_ESTIMATORS.register("rloo")
def _rloo_estimator(rewards: jax.Array, valid: jax.Array, config: AdvantageConfig) -> jax.Array:
    del config  # RLOO has no settings
    return rloo_advantages(rewards, rewards.shape[1], valid=valid)


def _advantage_metrics(adv, rewards, group_size: int, valid, std_ddof: int):
    """Mean and mean |A| over valid responses, and the fraction of non-empty groups whose
    rewards are constant (zero advantage)."""
    v = valid_or_ones(valid, jnp.asarray(rewards))
    st = group_stats(rewards, group_size, valid, std_ddof=std_ddof)
    nonempty = st.count > 0
    return {
        "adv/mean": safe_div(jnp.where(v, adv, 0).sum(), v.sum()),
        "adv/abs_mean": safe_div(jnp.where(v, jnp.abs(adv), 0).sum(), v.sum()),
        "adv/zero_var_frac": safe_div((st.constant & nonempty).sum(), nonempty.sum()),
    }


def compute_advantages(
    rewards: jax.Array,
    correct: jax.Array,
    group_size: int,
    *,
    config: AdvantageConfig | None = None,
    valid: jax.Array | None = None,
    daa: DAAConfig | None = None,
    group_valid: jax.Array | None = None,
    prior: BetaPrior | None = None,
    history: PromptHistory | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Outcome advantages of one training batch: the configured estimator, then optionally DAA.

    A_i from `ADVANTAGE_ESTIMATORS.get(config.estimator)`; for `"grpo"`,
    A_i = (R_i - mean_g R) / (std_g R + eps) (or centred only), zero for constant groups;
    then, if `daa` is a `DAAConfig`, A'_i = lambda_g A_i for correct responses of hard kept
    groups (see `apply_daa`). Correctness c_i drives the group accuracy and DAA; the reward
    R_i (which may include overlong shaping) drives the advantage.

    Args:
      rewards: `[P * G]` (group-major) or `[P, G]` rewards.
      correct: correctness c_i in {0, 1}, same shape.
      group_size: G.
      config: `AdvantageConfig` (default estimator `"grpo"`, norm `"std"`, ddof 1, eps 1e-6).
      valid: optional per-response mask (e.g. empty dynamic-sampling slots).
      daa: optional `DAAConfig`; None (or estimator "none") skips amplification.
      group_valid: optional `[P]` mask of kept groups, forwarded to DAA.
      prior: `BetaPrior` for the `bayes` / `history` estimators.
      history: `PromptHistory` for the `history` estimator.

    Returns:
      `(advantages, metrics)`: advantages shaped like `rewards`; scalar metrics
      (`adv/mean`, `adv/abs_mean`, `adv/zero_var_frac`, plus `daa/*` when DAA runs).
    """
    config = config or AdvantageConfig()
    shape = jnp.shape(rewards)
    x = to_groups(as_float(rewards), group_size)
    vg = to_groups(valid_or_ones(valid, jnp.asarray(rewards)), group_size)
    adv = ADVANTAGE_ESTIMATORS.get(config.estimator)(x, vg, config)
    if jnp.shape(adv) != x.shape:
        raise ValueError(
            f"advantage estimator {config.estimator!r} returned shape {jnp.shape(adv)}, "
            f"expected {x.shape}"
        )
    adv = adv.reshape(shape)
    metrics = _advantage_metrics(adv, rewards, group_size, valid, config.std_ddof)
    if daa is not None and daa.estimator != "none":
        adv, daa_metrics = apply_daa(
            adv,
            correct,
            group_size,
            config=daa,
            valid=valid,
            group_valid=group_valid,
            prior=prior,
            history=history,
        )
        metrics.update(daa_metrics)
    return adv, metrics
