"""The update stage of the loop: `PolicyUpdate` binds the jitted `rl_update` to its static
settings and frozen models, plans the packing of each batch on the host, and is called as
`update(state, batch, valid, prior)`."""

from __future__ import annotations

from typing import Any

import jax
import optax

from da3po_jax.parallel import batch_sharding, replicated
from da3po_jax.parallel.mesh import batch_size_divisor
from da3po_jax.rollout.batch import GroupBatch
from da3po_jax.update.packing import PackPlan, plan_packing, sequence_lengths
from da3po_jax.update.state import TrainState, optimizer_updates
from da3po_jax.update.step import (
    FrozenModels,
    UpdateBatch,
    UpdateConfig,
    UpdateProgram,
    rl_update,
)


def pack_plan(batch: GroupBatch, valid, config: UpdateConfig) -> tuple[PackPlan, Any]:
    """The host-side packing plan of a batch (`config.pack` set): every kept response row's
    (prompt, response) sequence placed in a packed micro-batch of its mini-batch; and the
    rows' [N * G] sequence lengths (0: not packed)."""
    config = config.resolved(batch)
    lens = sequence_lengths(batch, valid)
    return plan_packing(lens, config.pack, config.mini_batch_rows), lens


class PolicyUpdate:
    """The update stage: `rl_update` jitted once, with its static settings and the frozen
    models (reference copy, teacher) bound.

    Args:
      graphdef: the policy's `nnx` graph definition.
      tx: the optimizer; `schedule` its learning-rate schedule (for the `optim/lr` metric).
      config: `UpdateConfig`.
      state_shardings: the train state's shardings (kept by the output), or None.
      mesh: metrics come back replicated over it (None: one device).
      ref_params: frozen reference parameters (KL term), or None.
      teacher: `(graphdef, params)` of the frozen OPD teacher, or None.
    """

    def __init__(
        self,
        graphdef: Any,
        tx: optax.GradientTransformation,
        schedule: optax.Schedule,
        config: UpdateConfig,
        *,
        state_shardings: Any = None,
        mesh: Any = None,
        ref_params: Any = None,
        teacher: tuple[Any, Any] | None = None,
    ):
        if config.opd is not None and teacher is None:
            raise ValueError("UpdateConfig.opd is set: the update needs the teacher model")
        self.schedule, self.config, self.mesh = schedule, config, mesh
        teacher_graphdef, teacher_params = teacher or (None, None)
        self.frozen = FrozenModels(ref_params=ref_params, teacher_params=teacher_params)
        self.last_lengths = None  # packed: the sequence lengths of the last batch (FLOPs)
        pack_sharding = None
        if mesh is not None and config.pack is not None:
            if config.pack.rows % batch_size_divisor(mesh):
                raise ValueError(
                    f"config.rl.pack_rows={config.pack.rows} must be a multiple of the "
                    f"{batch_size_divisor(mesh)} devices a batch is split over (data x fsdp)"
                )
            pack_sharding = batch_sharding(mesh, (config.pack.rows,))
        self.program = UpdateProgram(graphdef, tx, config, pack_sharding, teacher_graphdef)
        out = (state_shardings, replicated(mesh)) if mesh is not None else None
        self.fn = jax.jit(
            rl_update, static_argnames="program", donate_argnames="state", out_shardings=out
        )

    def __call__(self, state: TrainState, batch: GroupBatch, valid: jax.Array, prior):
        plan = None
        if self.config.pack is not None:  # host side: the batch's lengths decide the packing
            plan, lens = pack_plan(batch, valid, self.config)
            self.last_lengths = lens[lens > 0]
            if self.mesh is not None:
                plan = jax.device_put(plan, replicated(self.mesh))
        return self.fn(self.program, state, UpdateBatch(batch, valid, prior, plan), self.frozen)

    def trace(self, state, batch, valid, prior, plan=None) -> jax.stages.Traced:
        """The update traced for these arguments (`jax.ShapeDtypeStruct`s with shardings
        will do; `plan`: a `PackPlan` of them when packed), as `__call__` calls it."""
        inputs = UpdateBatch(batch, valid, prior, plan)
        return self.fn.trace(self.program, state, inputs, self.frozen)

    @property
    def graphdef(self) -> Any:
        """The policy's graph definition."""
        return self.program.graphdef

    @property
    def ref_params(self) -> Any:
        return self.frozen.ref_params

    def lr(self, state: TrainState) -> float:
        """The rate of the last optimizer update applied (the schedule counts updates)."""
        return float(self.schedule(max(optimizer_updates(state) - 1, 0)))

    def forwards(self) -> int:
        """Forward passes of the policy's architecture per row besides the training passes
        (the recomputed old log-probs, the reference): for the FLOP count. The teacher's
        forward is counted with its own architecture."""
        return frozen_forwards(self.config, self.ref_params is not None)


def frozen_forwards(config: UpdateConfig, reference: bool) -> int:
    """Forwards of the policy's architecture per row besides the training passes: the
    recomputed old log-probs and the reference's (`reference`: a KL term)."""
    return int(config.recompute_logp_old) + int(reference)
