"""The update stage of an RL step: one `GroupBatch` in, new parameters out, jitted.

- `step`: `rl_update` (advantages, frozen forwards, mini-batch AdamW updates) and its
  static `UpdateConfig`; `policy_update`: the stage object the loop calls;
- `rows`: the per-response record the update works on (`ResponseRows`);
- `forwards`, `accumulate`, `packing`: log-probs padded or packed, gradient accumulation
  over micro-batches, sequence packing; `distill`: OPD / RA-OPD; `metrics`;
- `state`: `TrainState`, the optimizer and its schedule (also the SFT warm start's).
"""

from da3po_jax.update.packing import PackConfig, PackPlan
from da3po_jax.update.policy_update import PolicyUpdate, pack_plan
from da3po_jax.update.rows import ResponseRows
from da3po_jax.update.state import TrainState, init_train_state, make_optimizer
from da3po_jax.update.step import UpdateConfig, rl_update

__all__ = [
    "PackConfig",
    "PackPlan",
    "PolicyUpdate",
    "ResponseRows",
    "TrainState",
    "UpdateConfig",
    "init_train_state",
    "make_optimizer",
    "pack_plan",
    "rl_update",
]
