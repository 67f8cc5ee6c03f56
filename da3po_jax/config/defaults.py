"""The config every recipe starts from, and its reference page, both read from the
declarations of the settings (`Settings` and `sections.SECTIONS`).

`default_config()` is what `configs/base.py`'s `get_config()` returns: every field a run
reads, with its default; a field the algorithm preset fills (`preset=True`) is an unset
placeholder of its type, so `--config.algo=dapo` switches every dependent default while an
explicit `--config.loss.eps_high=0.3` still wins. `reference_markdown()` is
docs/settings.md (`python -m da3po_jax.config > docs/settings.md` rewrites it; a test
keeps the two equal).
"""

from __future__ import annotations

import typing

from ml_collections import config_dict
from ml_collections.config_dict import placeholder

from da3po_jax.config.sections import SECTIONS
from da3po_jax.config.settings import TOP_LEVEL, Settings
from da3po_jax.rl.fields import config_fields


def _leaf_fields(cls: type):
    """(field, its type) of each config field of `cls`."""
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in config_fields(cls)]


def _top_level():
    return [(f, t) for f, t in _leaf_fields(Settings) if f.name in TOP_LEVEL]


def default_config() -> config_dict.ConfigDict:
    """A fresh `ConfigDict` of every field with its default (presets as placeholders)."""
    c = config_dict.ConfigDict()
    for f, _ in _top_level():
        c[f.name] = f.default
    for name, cls in SECTIONS.items():
        section = config_dict.ConfigDict()
        for f, hint in _leaf_fields(cls):
            section[f.name] = placeholder(hint) if f.metadata["preset"] else f.default
        c[name] = section
    return c


def reference_markdown() -> str:
    """docs/settings.md: every field with its type, default and doc, section by section."""
    lines = [
        "# Settings reference",
        "",
        "Every field of a run's config with its type, default and meaning, generated from",
        "their declarations (`da3po_jax/config/sections.py` and the RL math's configs in",
        "`da3po_jax/rl/`) by `python -m da3po_jax.config > docs/settings.md`.",
        "Override any field with `--config.<section>.<field>=<value>`. A default of",
        "*preset* is filled from the algorithm (`config.algo`, `config/resolve.py:",
        "algorithm_preset`) unless set. Rules between fields are in `config/checks.py`.",
        "",
    ]
    groups = [("top level", "", _top_level())]
    groups += [(name, f"{name}.", _leaf_fields(cls)) for name, cls in SECTIONS.items()]
    for title, prefix, fields in groups:
        lines += [f"## {title}", "", "| field | type | default | meaning |", "|---|---|---|---|"]
        for f, hint in fields:
            default = "*preset*" if f.metadata["preset"] else f"`{f.default!r}`"
            doc = f.metadata["doc"].replace("|", "\\|")
            kind = "tuple" if typing.get_origin(hint) is tuple else hint.__name__
            lines.append(f"| `{prefix}{f.name}` | {kind} | {default} | {doc} |")
        lines.append("")
    return "\n".join(lines)
