"""The decoder families, by their Hugging Face `model_type`: `FAMILIES`.

One `Transformer` (models/transformer.py) computes every family; what differs between them
is a few structural switches of `ModelConfig` (biases, q/k norm) and how `config.json`
spells them. A family is one `ModelFamily` record plus one registration::

    from da3po_jax.models.families import ModelFamily, register_family

    register_family(ModelFamily("mistral", "MistralForCausalLM", read=..., write=...))

`read(hf)` gives the family's structural fields from a `config.json` dictionary (and
refuses the options the decoder does not compute); `write(cfg)` gives the family's own
keys of an exported `config.json`, so the folder loads in `transformers` unchanged.
`ModelConfig` looks a family up when it is built and when it reads or writes
`config.json`, so a family registered after import (e.g. in a test) is used from then on.

`models/` imports nothing from the package (docs/design.md, "Layers"), so this is a plain
dictionary rather than `rl.Registry`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["FAMILIES", "ModelFamily", "family", "register_family", "unregister_family"]


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    """One decoder family.

    Attributes:
      model_type: the `model_type` of its `config.json` ("qwen2").
      architecture: the class `transformers` builds ("Qwen2ForCausalLM"), written to
        `architectures` on export.
      read: `config.json` dict -> the structural `ModelConfig` fields (`attention_bias`,
        `o_bias`, `qk_norm`); raises ValueError naming an option it cannot compute.
      write: `ModelConfig` -> the family's own keys of an exported `config.json`.
    """

    model_type: str
    architecture: str
    read: Callable[[Mapping[str, Any]], dict[str, Any]]
    write: Callable[[Any], dict[str, Any]]


FAMILIES: dict[str, ModelFamily] = {}


def register_family(entry: ModelFamily, *, replace: bool = False) -> ModelFamily:
    """Adds `entry` under its `model_type`.

    Raises:
      ValueError: the name is empty, or registered and `replace` is False.
    """
    name = entry.model_type
    if not isinstance(name, str) or not name:
        raise ValueError(f"model family name must be a non-empty string, got {name!r}")
    if name in FAMILIES and not replace:
        raise ValueError(
            f"model family {name!r} is already registered (pass replace=True to overwrite)"
        )
    FAMILIES[name] = entry
    return entry


def unregister_family(name: str) -> ModelFamily:
    """Removes and returns the family `name` (ValueError, as `family`, if unknown)."""
    entry = family(name)
    del FAMILIES[name]
    return entry


def family(name: Any) -> ModelFamily:
    """The family registered as `name`.

    Raises:
      ValueError: naming the unknown `model_type` and the supported ones.
    """
    if isinstance(name, str) and name in FAMILIES:
        return FAMILIES[name]
    raise ValueError(f"unknown model_type {name!r}; supported: {sorted(FAMILIES)}")


def _biases_from_config(hf: Mapping[str, Any]) -> dict[str, Any]:
    """`attention_bias` puts a bias on q, k, v and o (Llama, Qwen3)."""
    bias = bool(hf.get("attention_bias"))
    return {"attention_bias": bias, "o_bias": bias}


def _read_qwen2(hf: Mapping[str, Any]) -> dict[str, Any]:
    """Qwen2/2.5: q/k/v always biased, o never."""
    return {"attention_bias": True, "o_bias": False, "qk_norm": False}


def _read_qwen3(hf: Mapping[str, Any]) -> dict[str, Any]:
    """Qwen3: per-head RMSNorm on queries and keys."""
    return {**_biases_from_config(hf), "qk_norm": True}


def _read_llama(hf: Mapping[str, Any]) -> dict[str, Any]:
    """Llama-3: no MLP bias (refused when set)."""
    if hf.get("mlp_bias"):
        raise ValueError("config.json sets mlp_bias=true, which is not supported")
    return {**_biases_from_config(hf), "qk_norm": False}


register_family(
    ModelFamily(
        "qwen2",
        "Qwen2ForCausalLM",
        read=_read_qwen2,
        write=lambda model_config: {"use_sliding_window": False},
    )
)
register_family(
    ModelFamily(
        "qwen3",
        "Qwen3ForCausalLM",
        read=_read_qwen3,
        write=lambda model_config: {"attention_bias": model_config.attention_bias},
    )
)
register_family(
    ModelFamily(
        "llama",
        "LlamaForCausalLM",
        read=_read_llama,
        write=lambda model_config: {
            "attention_bias": model_config.attention_bias,
            "mlp_bias": False,
        },
    )
)
