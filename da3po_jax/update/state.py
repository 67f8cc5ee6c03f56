"""Training state and optimizer.

The NNX pattern used everywhere: `graphdef, params = nnx.split(model)` once, outside jit;
jitted functions take `params` (an `nnx.State` pytree) and rebuild the module with
`nnx.merge(graphdef, params)` inside. The optimizer is plain optax over that pytree, so the
whole `TrainState` is one pytree that jits, donates and checkpoints as it is.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from da3po_jax.parallel import replicated, tree_shardings


@struct.dataclass
class TrainState:
    """Everything the device side needs to continue training exactly.

    Attributes:
      params: `nnx.State` of the policy's parameters.
      opt_state: optax state (AdamW moments, schedule count).
      step: [] int32, RL (or SFT) steps completed.
      rng: PRNG key, split once per step.
    """

    params: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array


def lr_schedule(
    lr: float, warmup_steps: int, total_steps: int, schedule: str, updates_per_step: int = 1
) -> optax.Schedule:
    """Linear warm-up to `lr` over `warmup_steps` *training steps*, then constant or cosine
    decay to 0 at `total_steps`. The optimizer calls it with its update count; with several
    updates per step (mini-batches x iterations) the count is mapped back to steps."""
    if schedule == "cosine":
        base = optax.warmup_cosine_decay_schedule(
            0.0, lr, max(warmup_steps, 1), max(total_steps, warmup_steps + 1), 0.0
        )
    else:
        base = optax.join_schedules(
            [optax.linear_schedule(0.0, lr, max(warmup_steps, 1)), optax.constant_schedule(lr)],
            [max(warmup_steps, 1)],
        )
    if warmup_steps == 0 and schedule != "cosine":
        base = optax.constant_schedule(lr)
    return lambda count: base(count // updates_per_step)


def make_optimizer(
    optim, total_steps: int, updates_per_step: int = 1, **overrides
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW with global-norm clipping and the configured schedule.

    `optim` has the fields of `config.optim` (`config.OptimSettings`); keyword `overrides`
    replace them (the SFT warm start uses its own lr, warm-up and schedule).
    """
    o = {
        k: getattr(optim, k)
        for k in ("lr", "warmup_steps", "schedule", "weight_decay", "b1", "b2", "grad_clip")
    }
    o.update(overrides)
    schedule = lr_schedule(o["lr"], o["warmup_steps"], total_steps, o["schedule"], updates_per_step)
    parts = []
    if o["grad_clip"] > 0:
        parts.append(optax.clip_by_global_norm(o["grad_clip"]))
    parts.append(optax.adamw(schedule, b1=o["b1"], b2=o["b2"], weight_decay=o["weight_decay"]))
    return optax.chain(*parts), schedule


def optimizer_updates(state: TrainState) -> int:
    """Optimizer updates applied so far: the count the learning-rate schedule reads (an
    RL step makes mini-batches x iterations of them, fewer when some were empty)."""
    counts = optax.tree_utils.tree_get_all_with_path(state.opt_state, "count")
    return max((int(v) for _, v in counts), default=0)


def init_train_state(model: nnx.Module, tx: optax.GradientTransformation, seed: int, mesh=None):
    """(graphdef, TrainState) for `model`, with fresh optimizer state; with `mesh`, the
    optimizer state is created sharded by the same rules as the parameters."""
    graphdef, params = nnx.split(model)
    if mesh is None:
        opt_state = tx.init(params)
    else:
        shardings = tree_shardings(jax.eval_shape(tx.init, params), mesh)
        opt_state = jax.jit(tx.init, out_shardings=shardings)(params)
    state = TrainState(
        params=params,
        opt_state=opt_state,
        step=jnp.zeros((), jnp.int32),
        rng=jax.random.PRNGKey(seed),  # raw uint32 key: checkpoints as a plain array
    )
    if mesh is not None:
        state = state.replace(
            **jax.device_put({"step": state.step, "rng": state.rng}, replicated(mesh))
        )
    else:  # committed, as the update's outputs are: else the second step compiles again
        state = jax.device_put(state, jax.devices()[0])
    return graphdef, state
