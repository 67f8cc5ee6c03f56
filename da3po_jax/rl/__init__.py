"""Pure-jnp RL math of da3po_jax: advantages, dynamic sampling, DAA, overlong, loss, OPD.

This package imports nothing from the rest of `da3po_jax` (only jax / numpy / stdlib), so
other JAX codebases can use it on its own::

    from da3po_jax.rl import da3po_loss, compute_advantages, apply_daa
"""

from da3po_jax.rl.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageConfig,
    compute_advantages,
    grpo_advantages,
    rloo_advantages,
)
from da3po_jax.rl.daa import (
    DAA_RULES,
    BetaPrior,
    DAAConfig,
    DAARule,
    PriorState,
    PromptHistory,
    accuracy_moments,
    apply_daa,
    beta_prior_from_moments,
    daa_lambda,
    fit_beta_prior,
    init_prior_state,
    prior_from_state,
    update_history,
    update_prior_state,
)
from da3po_jax.rl.dynamic_sampling import (
    DSBuffer,
    Selection,
    ds_add_round,
    ds_empty_buffer,
    ds_group_metrics,
    ds_keep_mask,
    ds_take,
    expand_group_mask,
    select_kept,
)
from da3po_jax.rl.groups import GroupStats, group_accuracy, group_stats
from da3po_jax.rl.loss import AGG_MODES, LossConfig, da3po_loss, loss_normalizer, tis_weights
from da3po_jax.rl.opd import (
    OPDConfig,
    RAOPDConfig,
    distillation_return,
    opd_advantages,
    ra_opd_mask,
)
from da3po_jax.rl.overlong import (
    OverlongConfig,
    apply_overlong,
    overlong_filter_mask,
    soft_overlong_punishment,
)
from da3po_jax.rl.registry import Registry

__all__ = [
    # registries
    "Registry",
    # advantages / group statistics
    "ADVANTAGE_ESTIMATORS",
    "AdvantageConfig",
    "GroupStats",
    "compute_advantages",
    "group_accuracy",
    "group_stats",
    "grpo_advantages",
    "rloo_advantages",
    # DAA
    "DAA_RULES",
    "BetaPrior",
    "DAAConfig",
    "DAARule",
    "PriorState",
    "PromptHistory",
    "accuracy_moments",
    "apply_daa",
    "beta_prior_from_moments",
    "daa_lambda",
    "fit_beta_prior",
    "init_prior_state",
    "prior_from_state",
    "update_history",
    "update_prior_state",
    # dynamic sampling
    "DSBuffer",
    "Selection",
    "ds_add_round",
    "ds_empty_buffer",
    "ds_group_metrics",
    "ds_keep_mask",
    "ds_take",
    "expand_group_mask",
    "select_kept",
    # overlong
    "OverlongConfig",
    "apply_overlong",
    "overlong_filter_mask",
    "soft_overlong_punishment",
    # policy loss
    "AGG_MODES",
    "LossConfig",
    "da3po_loss",
    "loss_normalizer",
    "tis_weights",
    # on-policy distillation
    "OPDConfig",
    "RAOPDConfig",
    "distillation_return",
    "opd_advantages",
    "ra_opd_mask",
]
