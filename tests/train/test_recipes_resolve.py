"""Every recipe in `configs/` builds the same config, field types included, and resolves to
the same settings as recorded in `data/recipe_reference.json` (written by the code before
the settings were declared in one place; rerun this file as a script to re-record after an
intended change of a recipe or a default, and say so in the commit)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest
from ml_collections import config_dict

from da3po_jax.config import ALGORITHMS, resolve_settings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REFERENCE = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "data", "recipe_reference.json"
)
RECIPES = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".py"))


def load_recipe(name: str) -> config_dict.ConfigDict:
    path = os.path.join(ROOT, "configs", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_recipe_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def _leaves(c: config_dict.ConfigDict, prefix: str = "") -> dict[str, list]:
    """dotted field -> [its type's name, its value as JSON] (placeholders: [type, null])."""
    out = {}
    for key in c.keys():
        value = c[key]
        if isinstance(value, config_dict.ConfigDict):
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = [c.get_type(key).__name__, _json(value)]
    return out


def _json(value):
    return json.loads(json.dumps(value, default=list))


def snapshot(name: str) -> dict:
    config = load_recipe(name)
    out = {"fields": _leaves(config)}
    algos = ALGORITHMS if name == "base" else (config.algo,)
    for algo in algos:
        config.algo = algo
        if algo in ("opd", "ra_opd") and not (config.teacher.path or config.teacher.preset):
            config.teacher.preset = config.model.preset
        out[f"resolved:{algo}"] = _json(resolve_settings(config, inputs=False).to_dict())
    return out


def test_the_reference_names_every_recipe():
    with open(REFERENCE) as f:
        assert sorted(json.load(f)) == RECIPES


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_builds_and_resolves_as_recorded(name):
    with open(REFERENCE) as f:
        expected = json.load(f)[name]
    got = snapshot(name)
    assert got["fields"] == expected["fields"]
    assert got.keys() == expected.keys()
    for key in expected:
        assert got[key] == expected[key], key


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    with open(REFERENCE, "w") as f:
        json.dump({name: snapshot(name) for name in RECIPES}, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {REFERENCE}")
