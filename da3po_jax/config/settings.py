"""`Settings`: the whole run's typed settings, and the values derived from them.

A `Settings` holds one frozen section per section of `configs/base.py` (`sections.py`) and
answers the questions several stages would otherwise each answer from raw fields: the
prompts of a static generation round, how many groups the dynamic-sampling surplus holds,
the rl/ math's own configs (loss, advantages, DAA, overlong shaping, OPD), the eval length
cap, and the fingerprint a checkpoint must match to be resumed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from da3po_jax.config.sections import (
    SECTIONS,
    AdvantageSettings,
    DAASettings,
    DataSettings,
    DynamicSamplingSettings,
    EvalSettings,
    LossSettings,
    MeshSettings,
    ModelSettings,
    OPDSettings,
    OptimSettings,
    OverlongSettings,
    RAOPDSettings,
    RewardSettings,
    RLSettings,
    RolloutSettings,
    SFTSettings,
    TeacherSettings,
    TokenizerSettings,
    TrainSettings,
)
from da3po_jax.rl import (
    AdvantageConfig,
    DAAConfig,
    LossConfig,
    OPDConfig,
    OverlongConfig,
    RAOPDConfig,
)
from da3po_jax.rollout.engines import ENGINES

ALGORITHMS = ("grpo", "dapo", "da3po", "opd", "ra_opd")
DISTILLATION = ("opd", "ra_opd")


@dataclasses.dataclass(frozen=True)
class Settings:
    """The resolved, validated settings of a run (`resolve_settings` builds them)."""

    algo: str
    stage: str
    seed: int
    model: ModelSettings
    tokenizer: TokenizerSettings
    data: DataSettings
    rollout: RolloutSettings
    rl: RLSettings
    adv: AdvantageSettings
    ds: DynamicSamplingSettings
    daa: DAASettings
    overlong: OverlongSettings
    loss: LossSettings
    teacher: TeacherSettings
    opd: OPDSettings
    ra_opd: RAOPDSettings
    reward: RewardSettings
    optim: OptimSettings
    train: TrainSettings
    eval: EvalSettings
    sft: SFTSettings
    mesh: MeshSettings

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
        r = self.rollout
        return ENGINES.get(r.engine).max_in_flight_for(self.round_size, r.slots, r.group_size)

    @property
    def eval_max_new_tokens(self) -> int:
        """The eval length cap (`eval.max_new_tokens`, 0 = the rollout's)."""
        return self.eval.max_new_tokens or self.rollout.max_new_tokens

    @property
    def updates_per_step(self) -> int:
        """Optimizer updates of one RL step: passes x mini-batches."""
        return self.rl.num_iterations * (self.rl.train_prompts // self.rl.mini_batch_prompts)

    # ------------------------------------------------------- the rl/ math's own configs
    def loss_config(self) -> LossConfig:
        """The loss settings; truncated importance sampling (`rollout.tis_cap`) is on only
        when the rollout distribution differs from the policy the ratio is taken against:
        sampling is not exact, or partial rollouts sample with older weights."""
        r = self.rollout
        tis_cap = 0.0 if r.exact and not r.max_staleness else float(r.tis_cap)
        return LossConfig(**dataclasses.asdict(self.loss), tis_cap=tis_cap)

    def advantage_config(self) -> AdvantageConfig:
        return AdvantageConfig(**dataclasses.asdict(self.adv))

    def daa_config(self) -> DAAConfig | None:
        """The DAA settings, or None when DAA is off (GRPO, DAPO)."""
        if not self.daa.enable:
            return None
        fields = dataclasses.asdict(self.daa)
        del fields["enable"]
        return DAAConfig(**fields)

    def opd_config(self) -> OPDConfig | None:
        """The OPD settings, or None unless the algorithm distils from a teacher."""
        return OPDConfig(**dataclasses.asdict(self.opd)) if self.distillation else None

    def ra_opd_config(self) -> RAOPDConfig | None:
        """The RA-OPD alignment filter, or None unless `algo = "ra_opd"`."""
        return RAOPDConfig(**dataclasses.asdict(self.ra_opd)) if self.algo == "ra_opd" else None

    def overlong_config(self) -> OverlongConfig:
        return OverlongConfig(
            max_len=self.rollout.max_new_tokens,
            buffer_len=self.overlong.buffer,
            penalty=self.overlong.penalty,
            filter=self.overlong.filter,
        )

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
        """The resolved config as plain data (what a run writes to config.json)."""
        out: dict[str, Any] = {name: getattr(self, name) for name in ("algo", "stage", "seed")}
        out.update({name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS})
        return out

    def replace(self, **changes: Any) -> Settings:
        """A copy with whole sections or top-level fields replaced (each is frozen)."""
        return dataclasses.replace(self, **changes)
