"""`Settings`: the whole run's typed settings, and the values derived from them.

A `Settings` holds the top-level fields (algo, stage, seed) and one frozen section per
section of a config (`sections.py`; the RL math's sections are its own configs), keeps the
fields derived from other sections in step (`derived_fields`), and answers the questions
several stages would otherwise each answer from raw fields: the prompts of a static
generation round, how many groups the dynamic-sampling surplus holds, which of DAA, OPD
and RA-OPD are on, the eval length cap, and the fingerprint a checkpoint must match to be
resumed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from da3po_jax.config.sections import (
    SECTIONS,
    DataSettings,
    DynamicSamplingSettings,
    EvalSettings,
    MeshSettings,
    ModelSettings,
    OptimSettings,
    RewardSettings,
    RLSettings,
    RolloutSettings,
    SFTSettings,
    TeacherSettings,
    TokenizerSettings,
    TrainSettings,
)
from da3po_jax.data.suites import EvalSuite, parse_suites
from da3po_jax.rl import (
    AdvantageConfig,
    DAAConfig,
    LossConfig,
    OPDConfig,
    OverlongConfig,
    RAOPDConfig,
)
from da3po_jax.rl.fields import check_fields, choice, config_fields, non_negative, setting
from da3po_jax.rollout.engines import ENGINES

ALGORITHMS = ("grpo", "dapo", "da3po", "opd", "ra_opd")
DISTILLATION = ("opd", "ra_opd")
TOP_LEVEL = ("algo", "stage", "seed")  # the fields of a config outside its sections


def derived_fields(name: str, rollout: RolloutSettings, own: dict[str, Any]) -> dict[str, Any]:
    """The fields of section `name` that the settings derive (not set in a config), from the
    rollout section and the section's own fields `own`: the loss's trained-policy
    temperature (`train_temperature`, or the sampling temperature where that is 0; 1 for
    greedy rollouts) and its truncated importance sampling cap, on only when the rollout
    distribution differs from the policy the ratio is taken against (the sampling
    temperature is not that policy's, top-k / top-p truncate, or partial rollouts sample
    with older weights); overlong shaping's response cap."""
    if name == "loss":
        temperature = own["train_temperature"] or rollout.temperature or 1.0
        exact = rollout.samples_policy_at(temperature) and not rollout.max_staleness
        tis_cap = 0.0 if exact else float(rollout.tis_cap)
        return {"temperature": float(temperature), "tis_cap": tis_cap}
    if name == "overlong":
        return {"max_len": rollout.max_new_tokens}
    return {}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """The resolved, validated settings of a run (`resolve_settings` builds them)."""

    algo: str = setting("da3po", "grpo | dapo | da3po | opd | ra_opd", choice(*ALGORITHMS))
    stage: str = setting("rl", "rl | sft", choice("rl", "sft"))
    seed: int = setting(0, "seed of the initialisation, data order and sampling", non_negative)
    model: ModelSettings
    tokenizer: TokenizerSettings
    data: DataSettings
    rollout: RolloutSettings
    rl: RLSettings
    adv: AdvantageConfig
    ds: DynamicSamplingSettings
    daa: DAAConfig
    overlong: OverlongConfig
    loss: LossConfig
    teacher: TeacherSettings
    opd: OPDConfig
    ra_opd: RAOPDConfig
    reward: RewardSettings
    optim: OptimSettings
    train: TrainSettings
    eval: EvalSettings
    sft: SFTSettings
    mesh: MeshSettings

    def __post_init__(self):
        check_fields(self)
        for name in ("loss", "overlong"):  # kept in step with the rollout section
            section = getattr(self, name)
            derived = derived_fields(name, self.rollout, dataclasses.asdict(section))
            if any(getattr(section, k) != v for k, v in derived.items()):
                object.__setattr__(self, name, dataclasses.replace(section, **derived))

    # ------------------------------------------------------------------ derived values
    @property
    def distillation(self) -> bool:
        """OPD / RA-OPD: a frozen teacher scores the student's samples."""
        return self.algo in DISTILLATION

    @property
    def round_size(self) -> int:
        """Prompts per static-engine round: one full batch without dynamic sampling."""
        return self.rollout.prompts_per_round if self.ds.enable else self.rl.train_prompts

    @property
    def surplus_capacity(self) -> int:
        """Groups the dynamic-sampling surplus holds: the rollout engine's
        `max_in_flight` (the most prompts it holds at once)."""
        rollout = self.rollout
        return ENGINES.get(rollout.engine).max_in_flight_for(
            self.round_size, rollout.slots, rollout.group_size
        )

    @property
    def eval_max_new_tokens(self) -> int:
        """The eval length cap (`eval.max_new_tokens`, 0 = the rollout's)."""
        return self.eval.max_new_tokens or self.rollout.max_new_tokens

    @property
    def eval_suites(self) -> tuple[EvalSuite, ...]:
        """The named held-out sets of `eval.suites`, each with its k (`eval.num_samples`
        where the suite gives none)."""
        return tuple(
            dataclasses.replace(s, k=s.k or self.eval.num_samples)
            for s in parse_suites(self.eval.suites)
        )

    @property
    def has_heldout_set(self) -> bool:
        """Whether the run has the unnamed held-out set (`data.eval_path`, the synthetic
        held-out split or the TFDS eval split) beside its suites."""
        d = self.data
        if d.source == "synthetic":
            return d.synthetic_eval > 0
        return d.source == "tfds" or bool(d.eval_path)

    @property
    def eval_sample_counts(self) -> tuple[int, ...]:
        """The distinct k of the run's evaluations (the held-out set's `eval.num_samples`
        and each suite's), ascending: one eval program per k."""
        ks = {s.k for s in self.eval_suites}
        if self.has_heldout_set:
            ks.add(self.eval.num_samples)
        return tuple(sorted(ks))

    @property
    def updates_per_step(self) -> int:
        """Optimizer updates of one RL step: passes x mini-batches."""
        return self.rl.num_iterations * (self.rl.train_prompts // self.rl.mini_batch_prompts)

    @property
    def daa_on(self) -> DAAConfig | None:
        """The DAA section when DAA is on (DA3PO), else None."""
        return self.daa if self.daa.enable else None

    @property
    def opd_on(self) -> OPDConfig | None:
        """The OPD section when the algorithm distils from a teacher, else None."""
        return self.opd if self.distillation else None

    @property
    def ra_opd_on(self) -> RAOPDConfig | None:
        """The RA-OPD alignment filter when `algo = "ra_opd"`, else None."""
        return self.ra_opd if self.algo == "ra_opd" else None

    # -------------------------------------------------------------------- bookkeeping
    def fingerprint(self) -> dict[str, Any]:
        """The fields a checkpoint must agree with to be resumed."""
        return {
            "algo": self.algo,
            "model": self.model.path or self.model.preset,
            "rollout.group_size": self.rollout.group_size,
            "rl.train_prompts": self.rl.train_prompts,
            "rollout.max_new_tokens": self.rollout.max_new_tokens,
            # frozen and not checkpointed: a resume must use the same one
            "teacher": self.teacher.identity if self.distillation else None,
            # the carried surplus buffer's size (rollout.engine, prompts_per_round or slots)
            "surplus_groups": self.surplus_capacity,
            "model.scan_layers": bool(self.model.scan_layers),  # the parameter tree's layout
        }

    def to_dict(self) -> dict[str, Any]:
        """The resolved config as plain data, the fields a config sets (what a run writes
        to config.json)."""
        out: dict[str, Any] = {name: getattr(self, name) for name in TOP_LEVEL}
        for name in SECTIONS:
            section = getattr(self, name)
            out[name] = {f.name: getattr(section, f.name) for f in config_fields(type(section))}
        return out
