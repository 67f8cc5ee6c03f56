"""Config resolution and validation, done once at start-up.

`resolve_config` fills the placeholders of `configs/base.py` from the algorithm preset,
checks every field the trainer reads (an error names the field, its value and what is
allowed) and returns an immutable config; training code never mutates it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from ml_collections import config_dict

from da3po_jax.data.prompts import get_template
from da3po_jax.data.readers import ANSWER_MODES
from da3po_jax.models.config import ATTENTION_CHOICES, REMAT_POLICY_CHOICES
from da3po_jax.models.presets import PRESETS
from da3po_jax.rl import (
    ADVANTAGE_ESTIMATORS,
    AGG_MODES,
    DAA_RULES,
    AdvantageConfig,
    DAAConfig,
    LossConfig,
    OPDConfig,
    RAOPDConfig,
)

ALGORITHMS = ("grpo", "dapo", "da3po", "opd", "ra_opd")
DISTILLATION = ("opd", "ra_opd")


def algorithm_preset(algo: str, max_new_tokens: int) -> dict[str, Any]:
    """Defaults that define each algorithm (docs/algorithms.md): GRPO = std-normalised group
    advantages, symmetric clip, sequence-mean loss; DAPO = dynamic sampling, clip-higher,
    token-level loss, soft overlong punishment over the last fifth of the length cap (the
    DAPO paper's 4096 of 20480); DA3PO = DAPO + DAA. OPD / RA-OPD: per-token teacher
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
    }
    if algo == "dapo":
        return dapo
    return {**dapo, "daa.enable": True}


def _choice(*allowed) -> Callable[[Any], str | None]:
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


_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "algo": _choice(*ALGORITHMS),
    "stage": _choice("rl", "sft"),
    "seed": _non_negative,
    "model.param_dtype": _choice("float32", "bfloat16"),
    "model.dtype": _choice("float32", "bfloat16"),
    "model.logits_chunk": _positive,
    "model.attention": _choice(*ATTENTION_CHOICES),
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
    "rollout.top_p": lambda v: None if 0 < v <= 1 else "must be in (0, 1]",
    "rollout.top_k": _non_negative,
    "rollout.logp_old": _choice("sampler", "recompute"),
    "rollout.engine": lambda v: _engine_check(v),
    "rollout.slots": _positive,
    "rollout.steps_per_call": _positive,
    "rollout.attention_block": _positive,
    "rollout.tis_cap": lambda v: None if v == 0 or v >= 1 else "must be 0 (off) or >= 1",
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
    "daa.tau": lambda v: None if 0 < v <= 1 else "must be in (0, 1]",
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
    "reward.verifier": _choice("builtin", "math_verify"),
    "optim.lr": _positive,
    "optim.warmup_steps": _non_negative,
    "optim.schedule": _choice("constant", "cosine"),
    "optim.weight_decay": _non_negative,
    "optim.b1": _adam_beta,
    "optim.b2": _adam_beta,
    "optim.grad_clip": _non_negative,
    "train.steps": _non_negative,
    "train.eval_every": _non_negative,
    "train.checkpoint_every": _non_negative,
    "train.keep_checkpoints": _at_least_one,
    "train.max_nonfinite_steps": _non_negative,
    "eval.num_samples": _positive,
    "eval.temperature": _non_negative,
    "eval.top_p": lambda v: None if 0 < v <= 1 else "must be in (0, 1]",
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


def round_size(cfg) -> int:
    """Prompts per static-engine round: one full batch without dynamic sampling."""
    return cfg.rollout.prompts_per_round if cfg.ds.enable else cfg.rl.train_prompts


def surplus_capacity(cfg) -> int:
    """Groups the dynamic-sampling surplus holds: the rollout engine's `max_in_flight`
    (one static round; 4 x slots / G prompts for the continuous engine, whose group's
    slots free up row by row, so more groups than S / G are in flight when slots are full)."""
    if cfg.rollout.engine == "continuous":
        return 4 * max(1, cfg.rollout.slots // cfg.rollout.group_size)
    return round_size(cfg)


def _engine_check(name) -> str | None:
    from da3po_jax.train.build import ENGINES  # the registry lives with the factory

    return None if name in ENGINES else f"must be one of {sorted(ENGINES)}"


def _get(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


def _set(cfg, dotted: str, value):
    *parents, leaf = dotted.split(".")
    node = cfg
    for part in parents:
        node = node[part]
    node[leaf] = value


def resolve_config(config: config_dict.ConfigDict) -> config_dict.FrozenConfigDict:
    """Fills algorithm defaults into unset fields, validates, and freezes the config.

    Raises:
      ValueError: naming the first bad field, its value and what it must be.
    """
    cfg = config_dict.ConfigDict(config.to_dict())  # a copy; the caller's stays untouched
    algo_err = _CHECKS["algo"](cfg.algo)
    if algo_err:
        raise ValueError(f"config.algo={cfg.algo!r} {algo_err}")
    for key, value in algorithm_preset(cfg.algo, cfg.rollout.max_new_tokens).items():
        if _get(cfg, key) is None:
            _set(cfg, key, value)
    for key, check in _CHECKS.items():
        value = _get(cfg, key)
        problem = "is unset" if value is None else check(value)
        if problem:
            raise ValueError(f"config.{key}={value!r} {problem}")
    _check_relations(cfg)
    return config_dict.FrozenConfigDict(cfg)


def _check_relations(cfg) -> None:
    rl = cfg.rl
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
    if cfg.ds.enable and cfg.ds.max_prompts < rl.train_prompts:
        raise ValueError(
            f"config.ds.max_prompts={cfg.ds.max_prompts} must be >= "
            f"config.rl.train_prompts={rl.train_prompts} (prompts admitted per step at most)"
        )
    if cfg.rollout.engine == "continuous":
        samples = max(cfg.rollout.group_size, cfg.eval.num_samples)
        if cfg.rollout.slots < samples:
            raise ValueError(
                f"config.rollout.slots={cfg.rollout.slots} must be >= {samples} (one group: "
                "rollout.group_size and eval.num_samples samples)"
            )
    if cfg.overlong.buffer > cfg.rollout.max_new_tokens:
        raise ValueError(
            f"config.overlong.buffer={cfg.overlong.buffer} exceeds "
            f"config.rollout.max_new_tokens={cfg.rollout.max_new_tokens}"
        )
    if not cfg.model.path and not cfg.model.preset:
        raise ValueError(
            "config.model.path is required (a HF folder with config.json and "
            "safetensors), or config.model.preset for random weights"
        )
    if not cfg.tokenizer.build_tiny and not (cfg.tokenizer.path or cfg.model.path):
        raise ValueError(
            "config.tokenizer.path (or config.model.path) is required: a folder "
            "with the tokenizer files"
        )
    if cfg.data.source in ("jsonl", "parquet") and not cfg.data.train_path:
        raise ValueError(f"config.data.train_path is required for data.source={cfg.data.source!r}")
    if cfg.algo in DISTILLATION:
        _check_distillation(cfg)
    shape = tuple(cfg.mesh.shape)
    if len(shape) != 3:
        raise ValueError(f"config.mesh.shape={shape} must have 3 entries (data, fsdp, tensor)")
    if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
        raise ValueError(
            f"config.mesh.shape={shape}: entries must be positive, with at most one -1"
        )
    _check_data_and_models(cfg)


def _check_data_and_models(cfg) -> None:
    """Fields whose allowed values live in other modules (templates, presets) or depend
    on other fields (buckets, synthetic split sizes, rewards)."""
    buckets = tuple(cfg.rollout.prompt_buckets)
    if not buckets or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in buckets):
        raise ValueError(
            f"config.rollout.prompt_buckets={buckets!r} must be a non-empty list of "
            "positive token lengths"
        )
    longest = max(buckets) + cfg.rollout.max_new_tokens
    if cfg.rl.packing and 0 < cfg.rl.pack_length < longest:
        raise ValueError(
            f"config.rl.pack_length={cfg.rl.pack_length} is shorter than the longest sequence "
            f"(largest rollout.prompt_buckets + rollout.max_new_tokens = {longest}); 0 = that"
        )
    try:
        get_template(cfg.data.template)
    except ValueError as e:
        raise ValueError(f"config.data.template: {e}") from None
    if cfg.data.source == "synthetic":
        if cfg.stage == "rl" and cfg.data.synthetic_train < 1:
            raise ValueError(
                f"config.data.synthetic_train={cfg.data.synthetic_train} must be >= 1 "
                "for stage='rl' (the RL prompts)"
            )
        if cfg.stage == "sft" and cfg.data.synthetic_sft < 1:
            raise ValueError(
                f"config.data.synthetic_sft={cfg.data.synthetic_sft} must be >= 1 "
                "for stage='sft' (the SFT examples)"
            )
    if not cfg.model.path and cfg.model.preset.lower() not in PRESETS:
        raise ValueError(
            f"config.model.preset={cfg.model.preset!r} must be one of {sorted(PRESETS)} "
            "(or set config.model.path)"
        )
    if not cfg.reward.correct > cfg.reward.incorrect:
        raise ValueError(
            f"config.reward.correct={cfg.reward.correct!r} must be > "
            f"config.reward.incorrect={cfg.reward.incorrect!r} (else there is nothing to learn)"
        )


def _check_distillation(cfg) -> None:
    """OPD / RA-OPD need a teacher; DAA only reshapes the outcome advantage."""
    if not cfg.teacher.path and not cfg.teacher.preset:
        raise ValueError(
            f"config.teacher.path is required for algo={cfg.algo!r}: a HF folder (config.json "
            "and safetensors) of the frozen teacher, or config.teacher.preset for a "
            "random-init teacher (tests)"
        )
    if cfg.teacher.path and cfg.teacher.preset:
        raise ValueError(
            f"config.teacher.path={cfg.teacher.path!r} and config.teacher.preset="
            f"{cfg.teacher.preset!r}: set only one"
        )
    if cfg.teacher.sft_steps and not cfg.teacher.path:
        raise ValueError(
            f"config.teacher.sft_steps={cfg.teacher.sft_steps} builds the teacher into "
            "config.teacher.path, which is unset"
        )
    if cfg.daa.enable and not cfg.opd.with_outcome:
        raise ValueError(
            f"config.daa.enable=True with algo={cfg.algo!r} needs config.opd.with_outcome=True "
            "(DAA amplifies the outcome advantage, which OPD otherwise does not use)"
        )
    if cfg.teacher.preset and cfg.teacher.preset.lower() not in PRESETS:
        raise ValueError(
            f"config.teacher.preset={cfg.teacher.preset!r} must be one of {sorted(PRESETS)}"
        )


def _from_section(cls, section):
    """`cls` built from the config section's fields of the same names (others default)."""
    return cls(**{f.name: section[f.name] for f in dataclasses.fields(cls) if f.name in section})


def sampling_is_exact(rollout) -> bool:
    """True when rollouts sample from the temperature-1 policy itself (no temperature,
    top-k or top-p): then pi_old = mu and no importance correction is needed."""
    return rollout.temperature == 1.0 and rollout.top_k == 0 and rollout.top_p == 1.0


def loss_config(cfg) -> LossConfig:
    """The loss settings; truncated importance sampling (`rollout.tis_cap`) is on only when
    the rollout distribution differs from the policy the ratio is taken against."""
    tis_cap = 0.0 if sampling_is_exact(cfg.rollout) else float(cfg.rollout.tis_cap)
    return dataclasses.replace(_from_section(LossConfig, cfg.loss), tis_cap=tis_cap)


def advantage_config(cfg) -> AdvantageConfig:
    return _from_section(AdvantageConfig, cfg.adv)


def daa_config(cfg) -> DAAConfig | None:
    """The DAA settings, or None when DAA is off (GRPO, DAPO)."""
    return _from_section(DAAConfig, cfg.daa) if cfg.daa.enable else None


def opd_config(cfg) -> OPDConfig | None:
    """The OPD settings, or None unless the algorithm distils from a teacher."""
    return _from_section(OPDConfig, cfg.opd) if cfg.algo in DISTILLATION else None


def ra_opd_config(cfg) -> RAOPDConfig | None:
    """The RA-OPD alignment filter, or None unless `algo = "ra_opd"`."""
    return _from_section(RAOPDConfig, cfg.ra_opd) if cfg.algo == "ra_opd" else None
