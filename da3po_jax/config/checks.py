"""Validation of a run's settings, done once at start-up: every field's own rule (a table
of dotted name -> check, applied to the raw values) and the rules that relate fields to
each other (applied to the typed `Settings`). Every error names the field, its value and
what is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from da3po_jax.config.settings import ALGORITHMS, Settings
from da3po_jax.data.prompts import get_template
from da3po_jax.data.readers import ANSWER_MODES
from da3po_jax.data.synthetic import TIERS
from da3po_jax.models.config import (
    ATTENTION_CHOICES,
    DECODE_ATTENTION_CHOICES,
    REMAT_POLICY_CHOICES,
)
from da3po_jax.models.presets import PRESETS
from da3po_jax.rewards.scorer import FALLBACKS, VERIFIERS
from da3po_jax.rl import ADVANTAGE_ESTIMATORS, AGG_MODES, DAA_RULES
from da3po_jax.rollout.engines import ENGINES

Check = Callable[[Any], "str | None"]


def _choice(*allowed) -> Check:
    return lambda v: None if v in allowed else f"must be one of {list(allowed)}"


def _positive(v) -> str | None:
    return None if v > 0 and math.isfinite(v) else "must be > 0 (and finite)"


def _non_negative(v) -> str | None:
    return None if v >= 0 and math.isfinite(v) else "must be >= 0 (and finite)"


def _unit(v) -> str | None:
    return None if 0 <= v <= 1 else "must be in [0, 1]"


def _at_least_one(v) -> str | None:
    return None if v >= 1 else "must be >= 1"


def _adam_beta(v) -> str | None:  # 1 zeroes Adam's bias correction (division by 0)
    return None if 0 <= v < 1 else "must be in [0, 1)"


def _top_p(v) -> str | None:
    return None if 0 < v <= 1 else "must be in (0, 1]"


FIELD_CHECKS: dict[str, Check] = {
    "algo": _choice(*ALGORITHMS),
    "stage": _choice("rl", "sft"),
    "seed": _non_negative,
    "model.param_dtype": _choice("float32", "bfloat16"),
    "model.dtype": _choice("float32", "bfloat16"),
    "model.logits_chunk": _positive,
    "model.attention": _choice(*ATTENTION_CHOICES),
    "model.decode_attention": _choice(*DECODE_ATTENTION_CHOICES),
    "model.attention_block": _positive,
    "model.remat_policy": _choice(*REMAT_POLICY_CHOICES),
    "tokenizer.vocab_size": _positive,
    "data.source": _choice("synthetic", "jsonl", "parquet", "tfds"),
    "data.answer_mode": _choice(*ANSWER_MODES),
    "data.synthetic_train": _non_negative,
    "data.synthetic_eval": _non_negative,
    "data.synthetic_sft": _non_negative,
    "rollout.prompts_per_round": _positive,
    "rollout.group_size": lambda v: None if v >= 2 else "must be >= 2 (group advantages)",
    "rollout.max_new_tokens": _positive,
    "rollout.temperature": _non_negative,
    "rollout.top_p": _top_p,
    "rollout.top_k": _non_negative,
    "rollout.logp_old": _choice("sampler", "recompute"),
    "rollout.engine": lambda v: ENGINES.check(v),
    "rollout.slots": _positive,
    "rollout.steps_per_call": _positive,
    "rollout.attention_block": _positive,
    "rollout.tis_cap": lambda v: None if v == 0 or v >= 1 else "must be 0 (off) or >= 1",
    "rollout.max_staleness": _non_negative,
    "rollout.partial_kv": _choice("keep", "recompute"),
    "rl.train_prompts": _positive,
    "rl.mini_batch_prompts": _positive,
    "rl.micro_batch_prompts": _non_negative,
    "rl.packing": _choice(True, False),
    "rl.pack_length": _non_negative,
    "rl.pack_rows": _positive,
    "rl.num_iterations": _positive,
    "adv.estimator": lambda v: ADVANTAGE_ESTIMATORS.check(v),
    "adv.norm": _choice("std", "none"),
    "adv.std_ddof": _choice(0, 1),
    "adv.eps": _non_negative,
    "ds.metric": _choice("acc", "reward"),
    "ds.max_prompts": _positive,
    # "none" is refused here: daa.enable turns DAA off
    "daa.estimator": lambda v: DAA_RULES.check(v, exclude=("none",)),
    # tau = 1 is allowed: every mixed group is hard (`power` uses odds(min(tau, 1 - 1e-6)))
    "daa.tau": _top_p,
    "daa.beta": _positive,
    "daa.lambda_max": lambda v: None if v >= 1 else "must be >= 1",
    "daa.gamma": _positive,
    "daa.prior_ema": _unit,
    "daa.history_decay": _unit,
    "daa.apply_to": _choice("correct", "both"),
    "overlong.buffer": _non_negative,
    "overlong.penalty": _non_negative,
    "loss.eps_low": lambda v: None if 0 <= v < 1 else "must be in [0, 1)",
    "loss.eps_high": _non_negative,
    "loss.clip_ratio_c": lambda v: None if v > 1 else "must be > 1",
    "loss.ratio_level": _choice("token", "sequence"),
    "loss.agg": _choice(*AGG_MODES),
    "loss.kl_coef": _non_negative,
    "loss.kl_estimator": _choice("k1", "k3"),
    "teacher.sft_steps": _non_negative,
    "teacher.sft_stop_acc": _unit,
    "opd.coef": _positive,
    "opd.gamma": _unit,
    "ra_opd.delta": _non_negative,
    "ra_opd.baseline": _choice("none", "group_mean"),
    "reward.timeout_s": _positive,
    "reward.num_workers": _non_negative,
    "reward.verifier": _choice(*VERIFIERS),
    "reward.fallback": _choice(*FALLBACKS),
    "optim.lr": _positive,
    "optim.warmup_steps": _non_negative,
    "optim.schedule": _choice("constant", "cosine"),
    "optim.weight_decay": _non_negative,
    "optim.b1": _adam_beta,
    "optim.b2": _adam_beta,
    "optim.grad_clip": _non_negative,
    "train.steps": _non_negative,
    "train.token_budget": _non_negative,
    "train.eval_every": _non_negative,
    "train.checkpoint_every": _non_negative,
    "train.keep_checkpoints": _at_least_one,
    "train.max_nonfinite_steps": _non_negative,
    "eval.num_samples": _positive,
    "eval.temperature": _non_negative,
    "eval.top_p": _top_p,
    "eval.max_prompts": _non_negative,
    "eval.max_new_tokens": _non_negative,
    "eval.prompts_per_call": _at_least_one,
    "eval.group_by": lambda v: None if isinstance(v, str) else "must be a field name (a string)",
    "eval.log_samples": _non_negative,
    "sft.steps": _non_negative,
    "sft.batch_size": _positive,
    "sft.lr": _positive,
    "sft.warmup_steps": _non_negative,
    "sft.max_len": _positive,
    "sft.stop_acc": _unit,
    "sft.check_every": _non_negative,
    "sft.check_prompts": _at_least_one,
}


def check_fields(values: dict[str, dict[str, Any] | Any]) -> None:
    """Applies `FIELD_CHECKS` to the raw nested values (a placeholder left unset is an
    error too).

    Raises:
      ValueError: naming the first bad field, its value and what it must be.
    """
    for key, check in FIELD_CHECKS.items():
        value = lookup(values, key)
        problem = "is unset" if value is None else check(value)
        if problem:
            raise ValueError(f"config.{key}={value!r} {problem}")


def lookup(values: dict[str, Any], dotted: str) -> Any:
    node = values
    for part in dotted.split("."):
        node = node[part]
    return node


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
    _check_mesh(s.mesh.shape)
    _check_buckets(s)
    _check_data_and_models(s)


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
    if s.overlong.buffer > s.rollout.max_new_tokens:
        raise ValueError(
            f"config.overlong.buffer={s.overlong.buffer} exceeds "
            f"config.rollout.max_new_tokens={s.rollout.max_new_tokens}"
        )


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


def _check_mesh(shape: tuple[int, ...]) -> None:
    if len(shape) != 3:
        raise ValueError(f"config.mesh.shape={shape} must have 3 entries (data, fsdp, tensor)")
    if shape.count(-1) > 1 or any(n == 0 or n < -1 for n in shape):
        raise ValueError(
            f"config.mesh.shape={shape}: entries must be positive, with at most one -1"
        )


def _check_buckets(s: Settings) -> None:
    buckets = s.rollout.prompt_buckets
    if not buckets or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in buckets):
        raise ValueError(
            f"config.rollout.prompt_buckets={buckets!r} must be a non-empty list of "
            "positive token lengths"
        )
    longest = max(buckets) + s.rollout.max_new_tokens
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
    """Fields whose allowed values live in other modules (templates, presets) or depend
    on other fields (synthetic split sizes, rewards)."""
    try:
        get_template(s.data.template)
    except ValueError as e:
        raise ValueError(f"config.data.template: {e}") from None
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
