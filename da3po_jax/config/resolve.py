"""The raw ml_collections config -> typed `Settings`, once, at start-up.

`resolve_settings` copies the config (the caller's stays untouched), fills the
placeholders of `configs/base.py` from the algorithm preset, builds the frozen sections
(each field checked by its own rule, declared with it) and checks the rules between
fields (`checks.py`). Recipes and `--config.x=y` overrides stay exactly as users write
them; only this module reads them.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

from da3po_jax.config.checks import check_relations
from da3po_jax.config.sections import SECTIONS
from da3po_jax.config.settings import ALGORITHMS, DISTILLATION, TOP_LEVEL, Settings, derived_fields
from da3po_jax.rl.fields import SettingError, config_fields


def algorithm_preset(algo: str, max_new_tokens: int) -> dict[str, Any]:
    """Defaults that define each algorithm (docs/algorithms.md): GRPO = std-normalised group
    advantages, symmetric clip, sequence-mean loss; DAPO = dynamic sampling, clip-higher,
    token-level loss, soft overlong punishment over the last fifth of the length cap (the
    DAPO paper's 4096 of 20480) added to DAPO's +1 / -1 reward; DA3PO = DAPO + DAA. GRPO
    keeps the 1 / 0 reward of its paper's rule-based setups. OPD / RA-OPD: per-token teacher
    advantages with a plain symmetric clip (eps_high = eps_low) and the token-level loss;
    no dynamic sampling (the teacher signal does not need mixed groups), no DAA, no
    overlong shaping (placeholders: any of them can still be switched on explicitly)."""
    grpo = {
        "ds.enable": False,
        "daa.enable": False,
        "overlong.filter": False,
        "overlong.buffer": 0,
        "loss.eps_high": 0.2,
        "loss.agg": "seq-mean-token-mean",
        "reward.correct": 1.0,
        "reward.incorrect": 0.0,
    }
    if algo in DISTILLATION:
        return {**grpo, "loss.agg": "token-mean"}
    if algo == "grpo":
        return grpo
    dapo = {
        "ds.enable": True,
        "daa.enable": False,
        "overlong.filter": False,
        "overlong.buffer": max_new_tokens // 5,
        "loss.eps_high": 0.28,
        "loss.agg": "token-mean",
        "reward.correct": 1.0,
        "reward.incorrect": -1.0,
    }
    if algo == "dapo":
        return dapo
    return {**dapo, "daa.enable": True}


def resolve_settings(config: Any, *, inputs: bool = True) -> Settings:
    """The typed, validated settings of `config` (an ml_collections `ConfigDict` of
    `configs/base.py`'s form, or the same as a nested mapping, e.g. a run's config.json).

    With `inputs=False` the run's inputs (a tokenizer folder, training data files) need
    not be named yet: the memory planner sizes recipes before their data exists.

    Raises:
      ValueError: naming the first bad, unset or unknown field, its value and what it
        must be.
    """
    values = _plain(config)
    if values.get("algo") not in ALGORITHMS:
        raise ValueError(f"config.algo={values.get('algo')!r} must be one of {list(ALGORITHMS)}")
    _check_names(values)
    for key, value in algorithm_preset(values["algo"], _max_new_tokens(values)).items():
        section, leaf = key.split(".")
        if values[section][leaf] is None:
            values[section][leaf] = value
    built: dict[str, Any] = {}
    for name, cls in SECTIONS.items():
        built[name] = _section(name, cls, values[name], built.get("rollout"))
    try:
        settings = Settings(**{name: values[name] for name in TOP_LEVEL}, **built)
    except SettingError as e:
        raise ValueError(f"config.{e.name}={e.value!r} {e.problem}") from None
    check_relations(settings, inputs=inputs)
    return settings


# Fields added after runs were first saved, with the value that reproduces those runs: a
# saved run's config.json that predates one gets it (`with_added_fields`). Generating from a
# gathered copy of the weights computes the same values (each matrix is cast to the
# compute dtype where it is used either way); it changes where the weights are read from.
ADDED_FIELDS: dict[str, Any] = {
    "model.decode_attention": "auto",
    "rollout.gather_weights": True,
    "rollout.max_staleness": 0,
    "rollout.partial_kv": "keep",
    # runs before it read no answer from a response without a box or `Answer:` line
    "reward.fallback": "none",
    "data.synthetic_tier_weights": (1.0, 1.0, 1.0, 0.0),
    "train.token_budget": 0,
    "daa.factor": 2.0,  # read only by the constant rule, which did not exist
    "loss.train_temperature": 1.0,  # runs before it trained the untempered policy
    "eval.suites": (),
}


def with_added_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """A saved run's config (a nested mapping) with every field added since it was written
    (`ADDED_FIELDS`) filled; nothing else changes."""
    out = _plain(raw)
    for key, value in ADDED_FIELDS.items():
        section, leaf = key.split(".")
        if isinstance(out.get(section), dict):
            out[section].setdefault(leaf, value)
    return out


def _plain(config: Any) -> dict[str, Any]:
    """A nested dict copy of `config` (a ConfigDict, FrozenConfigDict or mapping)."""
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    if not isinstance(config, Mapping):
        raise TypeError(f"a config must be a ConfigDict or a mapping, got {type(config)}")
    return {k: _plain(v) if isinstance(v, Mapping) else v for k, v in config.items()}


def _max_new_tokens(values: dict[str, Any]) -> int:
    n = values["rollout"]["max_new_tokens"]
    if not isinstance(n, int) or isinstance(n, bool):
        raise ValueError(f"config.rollout.max_new_tokens={n!r} must be > 0 (and finite)")
    return n


def _check_names(values: dict[str, Any]) -> None:
    """Every field of `configs/base.py` present, and no other (a misspelt field in a
    recipe would otherwise be ignored)."""
    known = set(TOP_LEVEL) | set(SECTIONS)
    for name in values:
        if name not in known:
            raise ValueError(f"config.{name} is not a field (configs/base.py defines them all)")
    for name in TOP_LEVEL:
        if name not in values:
            raise ValueError(f"config.{name} is unset (configs/base.py defines every field)")
    for name, cls in SECTIONS.items():
        section = values.get(name)
        if not isinstance(section, dict):
            raise ValueError(f"config.{name} must be a section (configs/base.py defines it)")
        fields = [f.name for f in config_fields(cls)]
        for key in section:
            if key not in fields:
                raise ValueError(
                    f"config.{name}.{key} is not a field (configs/base.py defines them all)"
                )
        for key in fields:
            if key not in section:
                raise ValueError(f"config.{name}.{key} is unset (configs/base.py defines it)")


def _section(name: str, cls: type, values: dict[str, Any], rollout: Any):
    """Section `name` (class `cls`) from its raw values, with the fields derived from the
    rollout section; sequences become tuples (frozen, hashable).

    Raises:
      ValueError: naming the first field left unset or whose value breaks its rule.
    """
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in config_fields(cls):
        value = values[f.name]
        if value is None:
            raise ValueError(f"config.{name}.{f.name}=None is unset")
        if typing.get_origin(hints[f.name]) is tuple and isinstance(value, list | tuple):
            value = tuple(value)
        kwargs[f.name] = value
    if rollout is not None:
        kwargs.update(derived_fields(name, rollout, kwargs))
    try:
        return cls(**kwargs)
    except SettingError as e:
        raise ValueError(f"config.{name}.{e.name}={e.value!r} {e.problem}") from None
