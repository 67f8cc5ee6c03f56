"""The sections of a run's settings, each field declared once: its type, default, one-line
doc and own rule (`da3po_jax.rl.fields.setting`).

The RL math's sections are its own configs (`LossConfig`, `AdvantageConfig`, `DAAConfig`,
`OverlongConfig`, `OPDConfig`, `RAOPDConfig` in `da3po_jax.rl`); the rest are here.
`configs/base.py` (`defaults.default_config`) and docs/settings.md are built from these
declarations, `resolve.py` builds the sections from a config, and `checks.py` holds only
the rules between fields. The sections are frozen and hashable (tuples, not lists), so a
section can be a static argument of a jitted function.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from da3po_jax.data.prompts import PLACEHOLDER, PROMPT_TEMPLATES
from da3po_jax.data.readers import ANSWER_MODES
from da3po_jax.data.suites import SuiteError, parse_suites
from da3po_jax.models.config import (
    ATTENTION_CHOICES,
    DECODE_ATTENTION_CHOICES,
    REMAT_POLICY_CHOICES,
)
from da3po_jax.rewards.extract import FALLBACKS
from da3po_jax.rewards.scorer import VERIFIERS
from da3po_jax.rl import (
    AdvantageConfig,
    DAAConfig,
    LossConfig,
    OPDConfig,
    OverlongConfig,
    RAOPDConfig,
)
from da3po_jax.rl.fields import (
    at_least_one,
    below_one,
    check_fields,
    choice,
    non_negative,
    open_unit,
    positive,
    setting,
    unit,
)
from da3po_jax.rollout.engines import ENGINES


def section(cls: type) -> type:
    """A frozen settings dataclass whose construction applies each field's own rule."""
    cls.__post_init__ = check_fields
    return dataclasses.dataclass(frozen=True)(cls)


def _template(v) -> str | None:
    if v in PROMPT_TEMPLATES or (isinstance(v, str) and PLACEHOLDER in v):
        return None
    return f"must be one of {sorted(PROMPT_TEMPLATES)} or a string containing {PLACEHOLDER!r}"


def _suites(v) -> str | None:
    try:
        parse_suites(v)
    except SuiteError as e:
        return f"has a bad suite: {e}"
    return None


def _buckets(v) -> str | None:
    ok = bool(v) and all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in v)
    return None if ok else "must be a non-empty list of positive token lengths"


def _mesh_shape(v) -> str | None:
    if len(v) != 3:
        return "must have 3 entries (data, fsdp, tensor)"
    if v.count(-1) > 1 or any(n == 0 or n < -1 for n in v):
        return "must have positive entries, with at most one -1"
    return None


_DTYPES = choice("float32", "bfloat16")


@section
class ModelSettings:
    path: str = setting("", 'HF folder (config.json + safetensors); "" = random init from preset')
    preset: str = setting("tiny-qwen2", 'architecture of a random init (used when path is "")')
    param_dtype: str = setting("float32", "float32 | bfloat16: the stored weights", _DTYPES)
    dtype: str = setting("float32", "float32 | bfloat16: the compute dtype", _DTYPES)
    logits_chunk: int = setting(512, "tokens per chunk of the vocabulary projection", positive)
    remat: bool = setting(False, "rematerialise each layer in the backward pass")
    attention: str = setting(
        "auto",
        "training forward and prefill: auto | naive | blockwise | cudnn | splash",
        choice(*ATTENTION_CHOICES),
    )
    attention_block: int = setting(512, "query / key block of the blockwise kernels", positive)
    decode_attention: str = setting(
        "auto",
        "continuous engine's decode step: auto (ragged on TPU, paged elsewhere) | paged (pure "
        "JAX over the live KV blocks only) | blockwise (pure JAX) | ragged (the Pallas TPU "
        "kernel reading only live KV pages; interpreted off TPU: slow)",
        choice(*DECODE_ATTENTION_CHOICES),
    )
    scan_layers: bool = setting(False, "layers stacked under lax.scan: compile time flat in depth")
    remat_policy: str = setting(
        "nothing",
        "nothing | dots: what a rematerialised layer keeps",
        choice(*REMAT_POLICY_CHOICES),
    )
    init_checkpoint: str = setting("", "HF folder to start RL from (e.g. an SFT export)")
    max_position_embeddings: int = setting(
        0,
        "0 = the checkpoint's (or preset's); larger extends the policy's context explicitly "
        "(usually with rope_theta): prompt bucket + response must fit it",
        non_negative,
    )
    rope_theta: float = setting(
        0.0,
        "0 = the checkpoint's; the policy's RoPE base (raised to extend the context)",
        non_negative,
    )

    def runtime_fields(self) -> dict[str, Any]:
        """The fields that override a checkpoint's architecture at load time (dtypes,
        remat, attention kernel, layer scan: `models.config.RUNTIME_FIELDS`)."""
        from da3po_jax.models.config import RUNTIME_FIELDS

        return {k: getattr(self, k) for k in RUNTIME_FIELDS}

    def context_fields(self) -> dict[str, Any]:
        """The policy's context extension, the architecture fields set here (not 0) that
        replace the checkpoint's: max_position_embeddings, rope_theta. The policy's only
        (a teacher keeps its own); an export writes them to its config.json."""
        fields = {"max_position_embeddings": self.max_position_embeddings}
        fields["rope_theta"] = self.rope_theta
        return {k: v for k, v in fields.items() if v}


@section
class TokenizerSettings:
    path: str = setting("", '"" = the model folder')
    build_tiny: bool = setting(False, "build the tiny BPE tokenizer in the workdir")
    vocab_size: int = setting(512, "vocabulary of the tiny tokenizer", positive)
    system_prompt: str = setting("", "system message of the chat template")


@section
class DataSettings:
    source: str = setting(
        "synthetic",
        "synthetic | jsonl | parquet | tfds",
        choice("synthetic", "jsonl", "parquet", "tfds"),
    )
    train_path: str = setting("", "training prompts (jsonl or parquet)")
    eval_path: str = setting("", "held-out prompts (jsonl or parquet)")
    prompt_field: str = setting("", '"" = first of prompt / problem / question (dotted paths ok)')
    answer_field: str = setting("", '"" = first of answer / reward_model.ground_truth / solution')
    answer_mode: str = setting("auto", "auto | raw | boxed | gsm8k", choice(*ANSWER_MODES))
    dedupe: bool = setting(False, "drop repeated prompts")
    template: str = setting(
        "dapo", "dapo | boxed | tiny | raw | a string with {problem}", _template
    )
    tfds_name: str = setting("", 'e.g. "gsm8k" for data.source = "tfds"')
    eval_split: str = setting("test", "TFDS split for eval")
    synthetic_train: int = setting(4000, "synthetic RL prompts", non_negative)
    synthetic_eval: int = setting(300, "synthetic held-out prompts", non_negative)
    synthetic_sft: int = setting(4000, "synthetic SFT examples", non_negative)
    synthetic_tier_weights: tuple[float, ...] = setting(
        (1.0, 1.0, 1.0, 0.0),
        "relative share of each synthetic tier (easy, medium, hard, harder), every split",
    )


@section
class RolloutSettings:
    engine: str = setting(
        "continuous",
        "continuous (continuous batching over rollout.slots rows) | static (each round one "
        "batch decoded until its longest row stops); rollout/engines.py: ENGINES",
        lambda v: ENGINES.check(v),
    )
    slots: int = setting(64, "continuous: rows decoded together (S)", positive)
    steps_per_call: int = setting(16, "continuous: decode steps per jitted call (K)", positive)
    attention_block: int = setting(128, "continuous: keys per decode-attention block", positive)
    gather_weights: bool = setting(
        True,
        "under a mesh, generation reads the compute-dtype weights gathered over data x fsdp "
        "(one copy per device while it runs) instead of all-gathering them every decode step",
    )
    prompts_per_round: int = setting(16, "prompts in one generation round", positive)
    group_size: int = setting(
        8, "G samples per prompt", lambda v: None if v >= 2 else "must be >= 2 (group advantages)"
    )
    prompt_buckets: tuple[int, ...] = setting(
        (64, 128, 256, 512, 1024, 2048), "prompt-length buckets (tokens)", _buckets
    )
    max_new_tokens: int = setting(64, "response cap (tokens)", positive)
    temperature: float = setting(1.0, "sampling temperature", non_negative)
    top_p: float = setting(1.0, "nucleus sampling (1: off)", open_unit)
    top_k: int = setting(0, "top-k sampling (0: off)", non_negative)
    logp_old: str = setting(
        "sampler",
        "sampler | recompute: where pi_old's log-probs come from",
        choice("sampler", "recompute"),
    )
    tis_cap: float = setting(
        2.0,
        "truncated importance sampling: when temperature / top-k / top-p make the sampling "
        "distribution mu differ from the trained policy, each token's loss is weighted "
        "by min(pi_old / mu, tis_cap); 0 = off. Not applied when the two coincide",
        lambda v: None if v == 0 or v >= 1 else "must be 0 (off) or >= 1",
    )
    max_staleness: int = setting(
        0,
        "partial rollouts (continuous engine): optimizer steps a group may stay in flight, "
        "generating under newer weights, before dynamic sampling judges it; 0 = every group "
        "admitted in a step finishes in it. > 0 trains with the decoupled objective",
        non_negative,
    )
    partial_kv: str = setting(
        "keep",
        "keys / values of a response carried into a new step: keep (stale) | recompute "
        "(prefill prompt + generated prefix under the new weights)",
        choice("keep", "recompute"),
    )

    @property
    def buckets(self) -> tuple[int, ...]:
        """The prompt-length buckets, shortest first."""
        return tuple(sorted(self.prompt_buckets))

    def samples_policy_at(self, temperature: float) -> bool:
        """Rollouts sample the policy at `temperature` itself (that temperature, no top-k
        or top-p): pi_old = mu, so no importance correction is needed."""
        return self.temperature == temperature and self.top_k == 0 and self.top_p == 1.0


@section
class RLSettings:
    train_prompts: int = setting(16, "groups per optimizer step batch", positive)
    mini_batch_prompts: int = setting(8, "groups per optimizer update", positive)
    micro_batch_prompts: int = setting(
        0, "0 = whole mini-batch in one pass (rl.packing off)", non_negative
    )
    packing: bool = setting(
        True,
        "the update's forwards run on micro-batches of pack_rows rows of pack_length tokens, "
        "each holding several (prompt, response) sequences (docs/design.md)",
        choice(True, False),
    )
    pack_length: int = setting(
        0, "tokens per packed row; 0 = prompt bucket + max_new_tokens", non_negative
    )
    pack_rows: int = setting(
        8, "packed rows per micro-batch (a multiple of the data-parallel devices)", positive
    )
    num_iterations: int = setting(1, "passes over each step's batch", positive)


@section
class DynamicSamplingSettings:
    enable: bool = setting(
        True, "keep only groups whose metric varies (the algorithm preset)", preset=True
    )
    metric: str = setting(
        "acc", "acc | reward: what must vary within a kept group", choice("acc", "reward")
    )
    max_prompts: int = setting(64, "prompts admitted per step at most", positive)


@section
class TeacherSettings:
    path: str = setting(
        "", "HF folder of the OPD teacher (config.json + safetensors [+ tokenizer])"
    )
    preset: str = setting("", 'random-init teacher of this preset when path is "" (tests)')
    seed: int = setting(1, "init seed of a preset teacher")
    sft_steps: int = setting(
        0, "> 0: build a missing teacher.path by an SFT warm start of this many steps", non_negative
    )
    sft_stop_acc: float = setting(0.0, "... stopping at this accuracy", unit)
    eval: bool = setting(True, "evaluate the teacher on the held-out set once at start")

    @property
    def identity(self) -> str:
        """What names the teacher in a checkpoint's fingerprint (a folder, or a preset
        and its seed)."""
        return self.path or f"preset:{self.preset}:seed{self.seed}"


@section
class RewardSettings:
    correct: float = setting(
        1.0, "reward of a correct response (the algorithm preset: 1)", preset=True
    )
    incorrect: float = setting(
        0.0,
        "reward of an incorrect response (the algorithm preset: -1 for dapo / da3po, as in "
        "DAPO; 0 otherwise); soft overlong punishment is added on top",
        preset=True,
    )
    timeout_s: float = setting(5.0, "verifier time limit per response (s)", positive)
    num_workers: int = setting(2, "verifier processes (0: in-process)", non_negative)
    verifier: str = setting(
        "builtin",
        "builtin | math_verify (needs: pip install math-verify); rewards/verifiers.py: VERIFIERS",
        lambda v: choice(*VERIFIERS)(v),  # read when checked: a later registration counts
    )
    fallback: str = setting(
        "last_expression",
        "last_expression | none: the answer of a response with no box, `Answer:` line or "
        '"the answer is": its last math expression or number, or none',
        choice(*FALLBACKS),
    )


@section
class OptimSettings:
    lr: float = setting(1e-6, "peak learning rate", positive)
    warmup_steps: int = setting(20, "linear warm-up steps", non_negative)
    schedule: str = setting("constant", "constant | cosine", choice("constant", "cosine"))
    weight_decay: float = setting(0.01, "AdamW weight decay", non_negative)
    b1: float = setting(0.9, "Adam beta1", below_one)
    b2: float = setting(0.999, "Adam beta2", below_one)
    grad_clip: float = setting(1.0, "global gradient-norm clip (0: off)", non_negative)


@section
class TrainSettings:
    steps: int = setting(100, "RL steps", non_negative)
    token_budget: int = setting(
        0,
        "> 0: also stop after the step at which the generated response tokens (every sample "
        "of every round, filtered groups included) reach this total; train.steps stays a cap",
        non_negative,
    )
    eval_every: int = setting(20, "steps between held-out evals (0: never)", non_negative)
    checkpoint_every: int = setting(
        20, "steps between checkpoints (0: only at the end)", non_negative
    )
    keep_checkpoints: int = setting(2, "checkpoints kept", at_least_one)
    max_nonfinite_steps: int = setting(
        3,
        "steps in a row whose every update had a non-finite loss / gradient (each skipped) "
        "before the run stops with an error; 0 = never stop",
        non_negative,
    )
    wandb_project: str = setting("", '"" = no W&B')
    export_final: bool = setting(
        False, "write the final policy as a HF folder <workdir>/final_model"
    )


@section
class EvalSettings:
    num_samples: int = setting(4, "k of avg@k / pass@k", positive)
    temperature: float = setting(1.0, "sampling temperature", non_negative)
    top_p: float = setting(1.0, "nucleus sampling (1: off)", open_unit)
    max_prompts: int = setting(256, "held-out prompts evaluated (0: all)", non_negative)
    max_new_tokens: int = setting(0, "0 = rollout.max_new_tokens", non_negative)
    prompts_per_call: int = setting(64, "prompts per generation call", at_least_one)
    group_by: str = setting(
        "tier",
        'avg@k / pass@k per tier, "source" or a dataset field; "" = none',
        lambda v: None if isinstance(v, str) else "must be a field name (a string)",
    )
    log_samples: int = setting(
        4, "responses logged per eval (eval_samples.jsonl, TensorBoard text)", non_negative
    )
    suites: tuple[str, ...] = setting(
        (),
        'named held-out sets, one row each in every report: "NAME path=FILES [format=F] '
        '[template=T] [k=N] [max_prompts=N]" (docs/evaluation.md)',
        _suites,
    )


@section
class SFTSettings:
    enable: bool = setting(False, "warm start before RL (cached in the workdir)")
    out_dir: str = setting("", 'where the warm start is cached; "" = <workdir>/sft_model')
    steps: int = setting(300, "SFT steps", non_negative)
    batch_size: int = setting(32, "examples per SFT step", positive)
    lr: float = setting(3e-3, "SFT learning rate", positive)
    warmup_steps: int = setting(20, "SFT warm-up steps", non_negative)
    max_len: int = setting(128, "tokens per SFT example", positive)
    stop_acc: float = setting(
        0.0,
        "> 0: stop the warm-up once accuracy at the rollout temperature on sft.check_prompts "
        "RL prompts reaches it",
        unit,
    )
    check_every: int = setting(100, "SFT steps between those checks", non_negative)
    check_prompts: int = setting(64, "prompts of each check", at_least_one)


@section
class MeshSettings:
    shape: tuple[int, ...] = setting(
        (-1, 1, 1), "(data, fsdp, tensor); -1 = fill with the remaining devices", _mesh_shape
    )


# config section name -> its class, in the order of a config (and of config.json)
SECTIONS: dict[str, type] = {
    "model": ModelSettings,
    "tokenizer": TokenizerSettings,
    "data": DataSettings,
    "rollout": RolloutSettings,
    "rl": RLSettings,
    "adv": AdvantageConfig,
    "ds": DynamicSamplingSettings,
    "daa": DAAConfig,
    "overlong": OverlongConfig,
    "loss": LossConfig,
    "teacher": TeacherSettings,
    "opd": OPDConfig,
    "ra_opd": RAOPDConfig,
    "reward": RewardSettings,
    "optim": OptimSettings,
    "train": TrainSettings,
    "eval": EvalSettings,
    "sft": SFTSettings,
    "mesh": MeshSettings,
}
