"""The settings boundary: the only code that reads the ml_collections config.

Each field is declared once, in its section (`sections.py`; the RL math's sections are its
own configs, `LossConfig`, `DAAConfig`, ...), with its type, default, doc and rule;
`default_config()` (what `configs/base.py` returns) and docs/settings.md are read from
those declarations. `resolve_settings(config)` turns a config of that form into
`Settings`: frozen, typed sections (model, tokenizer, data, rollout, rl, adv, ds, daa,
overlong, loss, teacher, opd, ra_opd, reward, optim, train, eval, sft, mesh), every field
validated once with an error that names it, and the derived values (round size, surplus
capacity, which of DAA / OPD / RA-OPD are on, the resume fingerprint). Every other module
takes the settings, or the section of them, it needs.
"""

from da3po_jax.config.defaults import default_config, reference_markdown
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
    "default_config",
    "reference_markdown",
    "with_added_fields",
    "resolve_settings",
]
