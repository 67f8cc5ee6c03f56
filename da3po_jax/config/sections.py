"""The typed settings of a run: one frozen dataclass per section of `configs/base.py`.

Each section mirrors its config section field for field (same names, same meaning; the
comments of `configs/base.py` document them), so `settings.rollout.group_size` is what a
user wrote as `--config.rollout.group_size`. `config/resolve.py` builds them once from the
ml_collections config, after filling the algorithm's defaults and validating every field;
nothing else in the package reads the raw config. The sections are hashable (tuples, not
lists), so a section can be a static argument of a jitted function.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    path: str
    preset: str
    param_dtype: str
    dtype: str
    logits_chunk: int
    remat: bool
    attention: str
    attention_block: int
    decode_attention: str
    scan_layers: bool
    remat_policy: str
    init_checkpoint: str

    def runtime_fields(self) -> dict[str, Any]:
        """The fields that override a checkpoint's architecture at load time (dtypes,
        remat, attention kernel, layer scan: `models.config.RUNTIME_FIELDS`)."""
        from da3po_jax.models.config import RUNTIME_FIELDS

        return {k: getattr(self, k) for k in RUNTIME_FIELDS}


@dataclasses.dataclass(frozen=True)
class TokenizerSettings:
    path: str
    build_tiny: bool
    vocab_size: int
    system_prompt: str


@dataclasses.dataclass(frozen=True)
class DataSettings:
    source: str
    train_path: str
    eval_path: str
    prompt_field: str
    answer_field: str
    answer_mode: str
    dedupe: bool
    template: str
    tfds_name: str
    eval_split: str
    synthetic_train: int
    synthetic_eval: int
    synthetic_sft: int
    synthetic_tier_weights: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
    engine: str
    slots: int
    steps_per_call: int
    attention_block: int
    gather_weights: bool
    prompts_per_round: int
    group_size: int
    prompt_buckets: tuple[int, ...]
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    logp_old: str
    tis_cap: float
    max_staleness: int
    partial_kv: str

    @property
    def buckets(self) -> tuple[int, ...]:
        """The prompt-length buckets, shortest first."""
        return tuple(sorted(self.prompt_buckets))

    @property
    def exact(self) -> bool:
        """Rollouts sample the temperature-1 policy itself (no temperature, top-k or
        top-p): pi_old = mu, so no importance correction is needed."""
        return self.temperature == 1.0 and self.top_k == 0 and self.top_p == 1.0


@dataclasses.dataclass(frozen=True)
class RLSettings:
    train_prompts: int
    mini_batch_prompts: int
    micro_batch_prompts: int
    packing: bool
    pack_length: int
    pack_rows: int
    num_iterations: int


@dataclasses.dataclass(frozen=True)
class AdvantageSettings:
    estimator: str
    norm: str
    std_ddof: int
    eps: float


@dataclasses.dataclass(frozen=True)
class DynamicSamplingSettings:
    enable: bool
    metric: str
    max_prompts: int


@dataclasses.dataclass(frozen=True)
class DAASettings:
    enable: bool
    estimator: str
    tau: float
    beta: float
    lambda_max: float
    gamma: float
    prior_ema: float
    history_decay: float
    apply_to: str


@dataclasses.dataclass(frozen=True)
class OverlongSettings:
    filter: bool
    buffer: int
    penalty: float


@dataclasses.dataclass(frozen=True)
class LossSettings:
    eps_low: float
    eps_high: float
    clip_ratio_c: float
    ratio_level: str
    agg: str
    kl_coef: float
    kl_estimator: str


@dataclasses.dataclass(frozen=True)
class TeacherSettings:
    path: str
    preset: str
    seed: int
    sft_steps: int
    sft_stop_acc: float
    eval: bool

    @property
    def identity(self) -> str:
        """What names the teacher in a checkpoint's fingerprint (a folder, or a preset
        and its seed)."""
        return self.path or f"preset:{self.preset}:seed{self.seed}"


@dataclasses.dataclass(frozen=True)
class OPDSettings:
    coef: float
    gamma: float
    with_outcome: bool


@dataclasses.dataclass(frozen=True)
class RAOPDSettings:
    delta: float
    baseline: str


@dataclasses.dataclass(frozen=True)
class RewardSettings:
    correct: float
    incorrect: float
    timeout_s: float
    num_workers: int
    verifier: str
    fallback: str


@dataclasses.dataclass(frozen=True)
class OptimSettings:
    lr: float
    warmup_steps: int
    schedule: str
    weight_decay: float
    b1: float
    b2: float
    grad_clip: float


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """The loop: steps, eval and checkpoint cadence, fault limits, logging sinks."""

    steps: int
    token_budget: int
    eval_every: int
    checkpoint_every: int
    keep_checkpoints: int
    max_nonfinite_steps: int
    wandb_project: str
    export_final: bool


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    num_samples: int
    temperature: float
    top_p: float
    max_prompts: int
    max_new_tokens: int
    prompts_per_call: int
    group_by: str
    log_samples: int


@dataclasses.dataclass(frozen=True)
class SFTSettings:
    enable: bool
    out_dir: str
    steps: int
    batch_size: int
    lr: float
    warmup_steps: int
    max_len: int
    stop_acc: float
    check_every: int
    check_prompts: int


@dataclasses.dataclass(frozen=True)
class MeshSettings:
    shape: tuple[int, ...]


# config section name -> its dataclass, in the order of configs/base.py
SECTIONS: dict[str, type] = {
    "model": ModelSettings,
    "tokenizer": TokenizerSettings,
    "data": DataSettings,
    "rollout": RolloutSettings,
    "rl": RLSettings,
    "adv": AdvantageSettings,
    "ds": DynamicSamplingSettings,
    "daa": DAASettings,
    "overlong": OverlongSettings,
    "loss": LossSettings,
    "teacher": TeacherSettings,
    "opd": OPDSettings,
    "ra_opd": RAOPDSettings,
    "reward": RewardSettings,
    "optim": OptimSettings,
    "train": TrainSettings,
    "eval": EvalSettings,
    "sft": SFTSettings,
    "mesh": MeshSettings,
}
TOP_LEVEL = ("algo", "stage", "seed")
