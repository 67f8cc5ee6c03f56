"""The rules between a run's fields, checked once at start-up on the typed `Settings`
(each field's own rule is declared with the field and checked when its section is built).
Every error names the fields, their values and the rule.
"""

from __future__ import annotations

import math

from da3po_jax.config.settings import Settings
from da3po_jax.data.synthetic import TIERS
from da3po_jax.models.presets import PRESETS
from da3po_jax.rl import DAA_RULES
from da3po_jax.rollout.engines import ENGINES


def check_relations(settings: Settings, *, inputs: bool = True) -> None:
    """The rules between fields (batch shapes, engine capacity, required inputs unless
    `inputs` is False, mesh, buckets, templates, presets, rewards, distillation).

    Raises:
      ValueError: naming the fields and the rule they break.
    """
    _check_batch_shapes(settings)
    _check_inputs(settings, inputs)
    if settings.distillation:
        _check_distillation(settings)
    _check_pack_length(settings)
    _check_data_and_models(settings)
    if settings.daa.estimator == "none":  # the DAA_RULES entry for direct users of `apply_daa`
        allowed = [n for n in DAA_RULES.names() if n != "none"]
        raise ValueError(
            f"config.daa.estimator='none' must be one of {allowed} (daa.enable=False turns DAA off)"
        )


def _check_batch_shapes(settings: Settings) -> None:
    rl = settings.rl
    if rl.train_prompts % rl.mini_batch_prompts:
        raise ValueError(
            f"config.rl.mini_batch_prompts={rl.mini_batch_prompts} must divide "
            f"config.rl.train_prompts={rl.train_prompts}"
        )
    if rl.micro_batch_prompts and rl.mini_batch_prompts % rl.micro_batch_prompts:
        raise ValueError(
            f"config.rl.micro_batch_prompts={rl.micro_batch_prompts} must divide "
            f"config.rl.mini_batch_prompts={rl.mini_batch_prompts}"
        )
    if rl.packing and rl.micro_batch_prompts:
        raise ValueError(
            f"config.rl.micro_batch_prompts={rl.micro_batch_prompts} is for unpacked updates: "
            "with config.rl.packing the micro-batches are rl.pack_rows rows of "
            "rl.pack_length tokens (set micro_batch_prompts=0 or packing=False)"
        )
    if settings.ds.enable and settings.ds.max_prompts < rl.train_prompts:
        raise ValueError(
            f"config.ds.max_prompts={settings.ds.max_prompts} must be >= "
            f"config.rl.train_prompts={rl.train_prompts} (prompts admitted per step at most)"
        )
    samples = max(
        settings.rollout.group_size, settings.eval.num_samples, *settings.eval_sample_counts
    )
    if ENGINES.get(settings.rollout.engine).uses_slots and settings.rollout.slots < samples:
        raise ValueError(
            f"config.rollout.slots={settings.rollout.slots} must be >= {samples} (one group: "
            "rollout.group_size, eval.num_samples and each eval suite's k samples)"
        )
    _check_partial(settings)


def _check_partial(settings: Settings) -> None:
    """Partial rollouts need a slot engine and the behaviour correction of the decoupled
    objective (docs/algorithms.md, "Partial rollouts")."""
    rollout = settings.rollout
    if not rollout.max_staleness:
        return
    if not ENGINES.get(rollout.engine).uses_slots:
        raise ValueError(
            f"config.rollout.max_staleness={rollout.max_staleness} needs a slot engine "
            f"(rollout.engine='continuous'), not rollout.engine={rollout.engine!r}"
        )
    if not rollout.tis_cap:
        raise ValueError(
            f"config.rollout.max_staleness={rollout.max_staleness} trains with the decoupled "
            "objective, whose behaviour weight is capped at rollout.tis_cap: set it >= 1, "
            "not 0"
        )


def _check_inputs(settings: Settings, inputs: bool) -> None:
    """A model must be named; unless `inputs` is False, a tokenizer and training data too."""
    if not settings.model.path and not settings.model.preset:
        raise ValueError(
            "config.model.path is required (a HF folder with config.json and "
            "safetensors), or config.model.preset for random weights"
        )
    if not inputs:
        return
    if not settings.tokenizer.build_tiny and not (settings.tokenizer.path or settings.model.path):
        raise ValueError(
            "config.tokenizer.path (or config.model.path) is required: a folder "
            "with the tokenizer files"
        )
    if settings.data.source in ("jsonl", "parquet") and not settings.data.train_path:
        raise ValueError(
            f"config.data.train_path is required for data.source={settings.data.source!r}"
        )


def _check_pack_length(settings: Settings) -> None:
    longest = max(settings.rollout.prompt_buckets) + settings.rollout.max_new_tokens
    if settings.rl.packing and 0 < settings.rl.pack_length < longest:
        raise ValueError(
            f"config.rl.pack_length={settings.rl.pack_length} is shorter than the longest sequence "
            f"(largest rollout.prompt_buckets + rollout.max_new_tokens = {longest}); 0 = that"
        )


def _check_tier_weights(weights: tuple) -> None:
    ok = (
        len(weights) == len(TIERS)
        and all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights)
        and all(0 <= w < math.inf for w in weights)
        and sum(weights) > 0
    )
    if not ok:
        raise ValueError(
            f"config.data.synthetic_tier_weights={weights!r} must be {len(TIERS)} weights "
            f">= 0, one per tier {TIERS}, with a positive sum"
        )


def _check_data_and_models(settings: Settings) -> None:
    """Fields whose rule depends on other fields (synthetic tiers and split sizes,
    presets, rewards)."""
    if settings.data.source == "synthetic":
        _check_tier_weights(settings.data.synthetic_tier_weights)
        if settings.stage == "rl" and settings.data.synthetic_train < 1:
            raise ValueError(
                f"config.data.synthetic_train={settings.data.synthetic_train} must be >= 1 "
                "for stage='rl' (the RL prompts)"
            )
        if settings.stage == "sft" and settings.data.synthetic_sft < 1:
            raise ValueError(
                f"config.data.synthetic_sft={settings.data.synthetic_sft} must be >= 1 "
                "for stage='sft' (the SFT examples)"
            )
    if not settings.model.path and settings.model.preset.lower() not in PRESETS:
        raise ValueError(
            f"config.model.preset={settings.model.preset!r} must be one of {sorted(PRESETS)} "
            "(or set config.model.path)"
        )
    if not settings.reward.correct > settings.reward.incorrect:
        raise ValueError(
            f"config.reward.correct={settings.reward.correct!r} must be > config.reward."
            f"incorrect={settings.reward.incorrect!r} (else there is nothing to learn)"
        )


def _check_distillation(settings: Settings) -> None:
    """OPD / RA-OPD need a teacher; DAA only reshapes the outcome advantage."""
    teacher = settings.teacher
    if not teacher.path and not teacher.preset:
        raise ValueError(
            f"config.teacher.path is required for algo={settings.algo!r}: a HF folder (config.json "
            "and safetensors) of the frozen teacher, or config.teacher.preset for a "
            "random-init teacher (tests)"
        )
    if teacher.path and teacher.preset:
        raise ValueError(
            f"config.teacher.path={teacher.path!r} and config.teacher.preset="
            f"{teacher.preset!r}: set only one"
        )
    if teacher.sft_steps and not teacher.path:
        raise ValueError(
            f"config.teacher.sft_steps={teacher.sft_steps} builds the teacher into "
            "config.teacher.path, which is unset"
        )
    if settings.daa.enable and not settings.opd.with_outcome:
        raise ValueError(
            f"config.daa.enable=True with algo={settings.algo!r} needs "
            "config.opd.with_outcome=True "
            "(DAA amplifies the outcome advantage, which OPD otherwise does not use)"
        )
    if teacher.preset and teacher.preset.lower() not in PRESETS:
        raise ValueError(
            f"config.teacher.preset={teacher.preset!r} must be one of {sorted(PRESETS)}"
        )
