"""Declaring a setting once: `setting(default, doc, check)` is a dataclass field that
carries its default, a one-line doc and the rule its value alone must satisfy; its type is
the annotation.

Every settings section of a run is a frozen dataclass of such fields (the RL math's
`LossConfig`, `DAAConfig`, ... here; the rest in `da3po_jax.config.sections`), whose
`__post_init__` calls `check_fields`. The run's config (`configs/base.py`), its reference
page (docs/settings.md) and its validation are all read from these declarations.
Stdlib only, so `da3po_jax.rl` stays importable on its own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], "str | None"]
"""A single-field rule: the value -> None, or what the value must be ("must be > 0")."""


def setting(
    default: Any, doc: str, check: Check | None = None, *, preset: bool = False, config=True
) -> Any:
    """A settings field.

    Args:
      default: its default (immutable: a tuple, not a list).
      doc: one line: what it means (and its choices).
      check: the rule its value alone must satisfy; rules between fields live with the
        run's settings (`da3po_jax.config.checks`).
      preset: in the run's config the field starts unset and the algorithm preset fills it
        (`config.resolve.algorithm_preset`); `default` is what direct users of the class
        get.
      config: False for a field the run's config does not expose (a numerical constant, or
        a value the settings derive from other sections).
    """
    metadata = {"doc": doc, "check": check, "preset": preset, "config": config}
    return dataclasses.field(default=default, metadata=metadata)


class SettingError(ValueError):
    """A field whose value breaks its rule; the message names the owner, field and value."""

    def __init__(self, owner: str, name: str, value: Any, problem: str):
        super().__init__(f"{owner}.{name}={value!r} {problem}")
        self.name, self.value, self.problem = name, value, problem


def check_fields(obj: Any) -> None:
    """Applies every field's own rule to the dataclass instance `obj`.

    Raises:
      SettingError: for the first field whose value breaks its rule.
    """
    for f in dataclasses.fields(obj):
        check = f.metadata.get("check")
        value = getattr(obj, f.name)
        problem = check(value) if check is not None else None
        if problem:
            raise SettingError(type(obj).__name__, f.name, value, problem)


def config_fields(cls: type) -> tuple[dataclasses.Field, ...]:
    """The fields of the settings class `cls` that the run's config exposes."""
    return tuple(f for f in dataclasses.fields(cls) if f.metadata.get("config", True))


# ------------------------------------------------------------------------- common rules
def choice(*allowed: Any) -> Check:
    return lambda v: None if v in allowed else f"must be one of {list(allowed)}"


def positive(v) -> str | None:
    return None if v > 0 and math.isfinite(v) else "must be > 0 (and finite)"


def non_negative(v) -> str | None:
    return None if v >= 0 and math.isfinite(v) else "must be >= 0 (and finite)"


def unit(v) -> str | None:
    return None if 0 <= v <= 1 else "must be in [0, 1]"


def open_unit(v) -> str | None:
    return None if 0 < v <= 1 else "must be in (0, 1]"


def at_least_one(v) -> str | None:
    return None if v >= 1 else "must be >= 1"


def below_one(v) -> str | None:
    return None if 0 <= v < 1 else "must be in [0, 1)"


def above_one(v) -> str | None:
    return None if v > 1 else "must be > 1"
