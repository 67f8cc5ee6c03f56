"""The update stage of an RL step: one `GroupBatch` in, new parameters out, jitted.

- `step`: `rl_update(program, state, inputs, frozen)` (advantages, frozen forwards,
  mini-batch AdamW updates): its static `UpdateProgram` (graph, optimizer,
  `UpdateConfig`), the step's `UpdateBatch` and the `FrozenModels` (reference, teacher);
  `policy_update`: the stage object the loop calls;
- `rows`: the per-response record the update works on (`ResponseRows`);
- `forwards`, `accumulate`, `packing`: log-probs padded or packed, gradient accumulation
  over micro-batches, sequence packing; `distill`: OPD / RA-OPD; `metrics`;
- `state`: `TrainState`, the optimizer and its schedule (also the SFT warm start's).
"""

from da3po_jax.update.packing import PackConfig, PackPlan
from da3po_jax.update.policy_update import PolicyUpdate, pack_plan
from da3po_jax.update.rows import ResponseRows
from da3po_jax.update.state import TrainState, init_train_state, make_optimizer
from da3po_jax.update.step import (
    FrozenModels,
    UpdateBatch,
    UpdateConfig,
    UpdateProgram,
    rl_update,
)

__all__ = [
    "FrozenModels",
    "PackConfig",
    "PackPlan",
    "PolicyUpdate",
    "ResponseRows",
    "TrainState",
    "UpdateBatch",
    "UpdateConfig",
    "UpdateProgram",
    "init_train_state",
    "make_optimizer",
    "pack_plan",
    "rl_update",
]
