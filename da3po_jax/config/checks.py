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


def check_relations(s: Settings, *, inputs: bool = True) -> None:
    """The rules between fields (batch shapes, engine capacity, required inputs unless
    `inputs` is False, mesh, buckets, templates, presets, rewards, distillation).

    Raises:
      ValueError: naming the fields and the rule they break.
    """
    _check_batch_shapes(s)
    _check_inputs(s, inputs)
    if s.distillation:
        _check_distillation(s)
    _check_pack_length(s)
    _check_data_and_models(s)
    if s.daa.estimator == "none":  # the DAA_RULES entry for direct users of `apply_daa`
        allowed = [n for n in DAA_RULES.names() if n != "none"]
        raise ValueError(
            f"config.daa.estimator='none' must be one of {allowed} (daa.enable=False turns DAA off)"
        )


def _check_batch_shapes(s: Settings) -> None:
    rl = s.rl
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
    if s.ds.enable and s.ds.max_prompts < rl.train_prompts:
        raise ValueError(
            f"config.ds.max_prompts={s.ds.max_prompts} must be >= "
            f"config.rl.train_prompts={rl.train_prompts} (prompts admitted per step at most)"
        )
    samples = max(s.rollout.group_size, s.eval.num_samples)
    if ENGINES.get(s.rollout.engine).uses_slots and s.rollout.slots < samples:
        raise ValueError(
            f"config.rollout.slots={s.rollout.slots} must be >= {samples} (one group: "
            "rollout.group_size and eval.num_samples samples)"
        )
    _check_partial(s)


def _check_partial(s: Settings) -> None:
    """Partial rollouts need a slot engine and the behaviour correction of the decoupled
    objective (docs/algorithms.md, "Partial rollouts")."""
    r = s.rollout
    if not r.max_staleness:
        return
    if not ENGINES.get(r.engine).uses_slots:
        raise ValueError(
            f"config.rollout.max_staleness={r.max_staleness} needs a slot engine "
            f"(rollout.engine='continuous'), not rollout.engine={r.engine!r}"
        )
    if not r.tis_cap:
        raise ValueError(
            f"config.rollout.max_staleness={r.max_staleness} trains with the decoupled "
            "objective, whose behaviour weight is capped at rollout.tis_cap: set it >= 1, "
            "not 0"
        )


def _check_inputs(s: Settings, inputs: bool) -> None:
    """A model must be named; unless `inputs` is False, a tokenizer and training data too."""
    if not s.model.path and not s.model.preset:
        raise ValueError(
            "config.model.path is required (a HF folder with config.json and "
            "safetensors), or config.model.preset for random weights"
        )
    if not inputs:
        return
    if not s.tokenizer.build_tiny and not (s.tokenizer.path or s.model.path):
        raise ValueError(
            "config.tokenizer.path (or config.model.path) is required: a folder "
            "with the tokenizer files"
        )
    if s.data.source in ("jsonl", "parquet") and not s.data.train_path:
        raise ValueError(f"config.data.train_path is required for data.source={s.data.source!r}")


def _check_pack_length(s: Settings) -> None:
    longest = max(s.rollout.prompt_buckets) + s.rollout.max_new_tokens
    if s.rl.packing and 0 < s.rl.pack_length < longest:
        raise ValueError(
            f"config.rl.pack_length={s.rl.pack_length} is shorter than the longest sequence "
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


def _check_data_and_models(s: Settings) -> None:
    """Fields whose rule depends on other fields (synthetic tiers and split sizes,
    presets, rewards)."""
    if s.data.source == "synthetic":
        _check_tier_weights(s.data.synthetic_tier_weights)
        if s.stage == "rl" and s.data.synthetic_train < 1:
            raise ValueError(
                f"config.data.synthetic_train={s.data.synthetic_train} must be >= 1 "
                "for stage='rl' (the RL prompts)"
            )
        if s.stage == "sft" and s.data.synthetic_sft < 1:
            raise ValueError(
                f"config.data.synthetic_sft={s.data.synthetic_sft} must be >= 1 "
                "for stage='sft' (the SFT examples)"
            )
    if not s.model.path and s.model.preset.lower() not in PRESETS:
        raise ValueError(
            f"config.model.preset={s.model.preset!r} must be one of {sorted(PRESETS)} "
            "(or set config.model.path)"
        )
    if not s.reward.correct > s.reward.incorrect:
        raise ValueError(
            f"config.reward.correct={s.reward.correct!r} must be > "
            f"config.reward.incorrect={s.reward.incorrect!r} (else there is nothing to learn)"
        )


def _check_distillation(s: Settings) -> None:
    """OPD / RA-OPD need a teacher; DAA only reshapes the outcome advantage."""
    t = s.teacher
    if not t.path and not t.preset:
        raise ValueError(
            f"config.teacher.path is required for algo={s.algo!r}: a HF folder (config.json "
            "and safetensors) of the frozen teacher, or config.teacher.preset for a "
            "random-init teacher (tests)"
        )
    if t.path and t.preset:
        raise ValueError(
            f"config.teacher.path={t.path!r} and config.teacher.preset={t.preset!r}: set only one"
        )
    if t.sft_steps and not t.path:
        raise ValueError(
            f"config.teacher.sft_steps={t.sft_steps} builds the teacher into "
            "config.teacher.path, which is unset"
        )
    if s.daa.enable and not s.opd.with_outcome:
        raise ValueError(
            f"config.daa.enable=True with algo={s.algo!r} needs config.opd.with_outcome=True "
            "(DAA amplifies the outcome advantage, which OPD otherwise does not use)"
        )
    if t.preset and t.preset.lower() not in PRESETS:
        raise ValueError(f"config.teacher.preset={t.preset!r} must be one of {sorted(PRESETS)}")
