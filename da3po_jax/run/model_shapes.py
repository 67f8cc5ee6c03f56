"""The `ModelConfig`s a run's settings describe, read before any weights exist: a model
folder's config.json when it is here, else the preset (the memory planner and the AOT
compile plan a recipe before its weights are downloaded), with the run's runtime fields
(dtypes, remat, ...) and, for a random policy, the tiny tokenizer's vocabulary."""

from __future__ import annotations

import logging
import os
from typing import Any

from da3po_jax.config import Settings
from da3po_jax.models.config import ModelConfig
from da3po_jax.models.presets import get_preset
from da3po_jax.run.inputs import preset_vocab

log = logging.getLogger(__name__)


def model_config(
    path: str, preset: str, runtime: dict[str, Any], vocab_size: int | None = None
) -> ModelConfig:
    """The `ModelConfig` of a model folder or preset, with a run's runtime fields (dtypes,
    remat, ...). `path` with a config.json wins; otherwise `preset` is used (with a
    warning when a path was given: planning usually happens before the weights are
    downloaded)."""
    if path and os.path.isfile(os.path.join(path, "config.json")):
        return ModelConfig.from_hf_folder(path, **runtime)
    if not preset:
        raise ValueError(
            f"model.path={path!r} has no config.json here and model.preset is empty: set "
            "model.preset (e.g. qwen2.5-math-7b) to plan before downloading the weights"
        )
    if path:
        log.warning("model.path=%r has no config.json here; planning with preset %r", path, preset)
    overrides = dict(runtime, **({"vocab_size": vocab_size} if vocab_size else {}))
    return get_preset(preset, **overrides)


def policy_config(settings: Settings) -> ModelConfig:
    """The policy's `ModelConfig` with the run's runtime fields and context extension (see
    `model_config`)."""
    return model_config(
        settings.model.path,
        settings.model.preset,
        settings.model.runtime_fields() | settings.model.context_fields(),
        _vocab(settings),
    )


def model_origin(model, path: str | None) -> str:
    """Where a policy's positions come from, for messages: the context extension, the
    config.json of `path` (a folder that is here), or the preset standing in for it."""
    if model.max_position_embeddings:
        return "config.model.max_position_embeddings"
    if path and os.path.isfile(os.path.join(path, "config.json")):
        return os.path.join(path, "config.json")
    return f"preset {model.preset!r}"


def check_context(
    settings: Settings, model_config: ModelConfig, train_prompt: int, eval_prompt: int, where: str
) -> None:
    """Refuses sequences longer than the policy's positions: the padded prompt length of
    the training prompts (their largest bucket) + `rollout.max_new_tokens`, and of the
    held-out prompts + the eval length cap, must fit `max_position_embeddings` (`where`
    names the model's origin). A longer context is an explicit choice of the user
    (`model.max_position_embeddings`, usually with `model.rope_theta`).

    Raises:
      ValueError: naming the length fields, the sum and the model's limit.
    """
    limit = model_config.max_position_embeddings
    asked = (
        ("rollout.max_new_tokens", settings.rollout.max_new_tokens, train_prompt, "training"),
        (
            "eval.max_new_tokens" if settings.eval.max_new_tokens else "rollout.max_new_tokens",
            settings.eval_max_new_tokens,
            eval_prompt,
            "held-out",
        ),
    )
    for field, new, prompt, split in asked:
        if prompt and prompt + new > limit:
            raise ValueError(
                f"config.{field}={new} after the {prompt}-token prompt bucket of the {split} "
                f"prompts needs {prompt + new} positions, more than the model's "
                f"max_position_embeddings={limit} ({where}): shorten the responses or "
                "config.rollout.prompt_buckets, or extend the context explicitly with "
                "config.model.max_position_embeddings (and config.model.rope_theta)"
            )


def teacher_config(settings: Settings, policy: ModelConfig) -> ModelConfig | None:
    """The OPD teacher's `ModelConfig` (None: no teacher), built with the policy's dtypes
    as `run.teacher.load_teacher` builds it; the policy's shapes when its folder is not
    here yet."""
    name = settings.teacher.path or settings.teacher.preset
    if not name:
        return None
    try:
        return model_config(
            settings.teacher.path,
            settings.teacher.preset,
            settings.model.runtime_fields(),
            _vocab(settings),
        )
    except ValueError:
        log.warning("teacher %r has no config.json here: assuming the policy's shapes", name)
        return policy


def _vocab(settings: Settings) -> int | None:
    """A random policy's vocabulary when the run builds the tiny tokenizer (as
    `run.inputs.policy_config` sizes it), else None (the model's own)."""
    if not settings.model.path and settings.tokenizer.build_tiny:
        return preset_vocab(settings.tokenizer.vocab_size)
    return None
