"""The settings boundary: the only code that reads the ml_collections config.

`resolve_settings(config)` turns a config of `configs/base.py`'s form into `Settings`:
frozen, typed sections (model, tokenizer, data, rollout, rl, adv, ds, daa, overlong, loss,
teacher, opd, ra_opd, reward, optim, train, eval, sft, mesh), every field validated once
with an error that names it, and the derived values (round size, surplus capacity, the
rl/ math's configs, the resume fingerprint). Every other module takes the settings, or the
section of them, it needs.
"""

from da3po_jax.config.resolve import algorithm_preset, resolve_settings, with_added_fields
from da3po_jax.config.sections import (
    DataSettings,
    EvalSettings,
    ModelSettings,
    OptimSettings,
    RewardSettings,
    RolloutSettings,
    SFTSettings,
    TeacherSettings,
    TokenizerSettings,
    TrainSettings,
)
from da3po_jax.config.settings import ALGORITHMS, DISTILLATION, Settings

__all__ = [
    "ALGORITHMS",
    "DISTILLATION",
    "DataSettings",
    "EvalSettings",
    "ModelSettings",
    "OptimSettings",
    "RewardSettings",
    "RolloutSettings",
    "SFTSettings",
    "Settings",
    "TeacherSettings",
    "TokenizerSettings",
    "TrainSettings",
    "algorithm_preset",
    "with_added_fields",
    "resolve_settings",
]
