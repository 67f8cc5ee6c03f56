"""Base configuration: every field the trainer reads, with its default.

Recipes import `get_config()` from here and change a few fields. The fields, their
defaults, types, meaning and rules are declared once, in `da3po_jax/config/sections.py`
and the RL math's configs (`da3po_jax/rl/`); docs/settings.md lists them all. Fields the
algorithm preset fills (`config.algo`) start unset, so `--config.algo=dapo` on the command
line switches every dependent default, while an explicit `--config.loss.eps_high=0.3`
still wins.
"""

from ml_collections import config_dict

from da3po_jax.config.defaults import default_config


def get_config() -> config_dict.ConfigDict:
    return default_config()
