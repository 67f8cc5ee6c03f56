"""The jitted RL update: advantages (GRPO, DAA; or per-token OPD / RA-OPD from a frozen
teacher), overlong shaping and the clipped loss over `num_iterations` passes of mini-batch
AdamW updates, as one pure function of arrays.

Shapes are fixed per run: a batch holds `train_prompts` groups of G responses; empty
dynamic-sampling slots are masked by `valid`. The batch becomes per-response rows
(`ResponseRows`), split into mini-batches (one optimizer update each) and those into
micro-batches (padded slices, or packed slots: `update/packing.py`) whose gradients are
summed (`update/accumulate.py`); the loss normaliser of each mini-batch is computed once
over the whole mini-batch and shared by its micro-batches, so micro-batching does not
change the gradient (docs/algorithms.md, "Loss aggregation").
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from da3po_jax.rl import (
    AdvantageConfig,
    BetaPrior,
    DAAConfig,
    LossConfig,
    OPDConfig,
    OverlongConfig,
    RAOPDConfig,
    apply_overlong,
    compute_advantages,
    da3po_loss,
    expand_group_mask,
    loss_normalizer,
)
from da3po_jax.rollout.batch import GroupBatch
from da3po_jax.update.accumulate import accumulate_grads
from da3po_jax.update.distill import distillation_advantages
from da3po_jax.update.forwards import frozen_logprobs, num_slots, response_logprobs
from da3po_jax.update.metrics import combine_metrics, mean_over_applied
from da3po_jax.update.packing import PackConfig, PackPlan, packed_response_logprobs
from da3po_jax.update.rows import ResponseRows
from da3po_jax.update.state import TrainState


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
    """Static settings of the update (hashable); `opd` set = distil from the teacher
    (per-token advantages), `ra_opd` set = also drop reward-misaligned trajectories;
    `pack` set = the forwards run on packed micro-batches (update/packing.py) instead of
    `micro_batch_prompts` groups padded to the full length."""

    group_size: int
    mini_batch_prompts: int
    micro_batch_prompts: int
    num_iterations: int
    loss: LossConfig
    adv: AdvantageConfig
    daa: DAAConfig | None
    overlong: OverlongConfig
    recompute_logp_old: bool = False
    opd: OPDConfig | None = None
    ra_opd: RAOPDConfig | None = None
    pack: PackConfig | None = None

    @property
    def mini_batch_rows(self) -> int:
        return self.mini_batch_prompts * self.group_size

    def resolved(self, batch: GroupBatch) -> UpdateConfig:
        """This config with the pack length fixed to the batch's row length where it is 0."""
        if self.pack is None:
            return self
        row_len = batch.prompt_tokens.shape[1] + batch.tokens.shape[2]
        return dataclasses.replace(self, pack=self.pack.resolve(row_len))


@dataclasses.dataclass(frozen=True)
class UpdateProgram:
    """Everything the jitted update is specialised on (hashable; `rl_update`'s static
    argument): the policy's graph, the optimizer, the settings, where packed rows go
    (the batch axes of the mesh; None: one device or unpacked) and the frozen teacher's
    graph (OPD; None otherwise)."""

    graphdef: Any
    tx: optax.GradientTransformation
    config: UpdateConfig
    pack_sharding: Any = None
    teacher_graphdef: Any = None


@struct.dataclass
class UpdateBatch:
    """One step's input to the update.

    Attributes:
      batch: `GroupBatch` of N = train_prompts groups.
      valid: [N] bool, slots that hold a kept group.
      prior: the Beta prior of the bayes / history estimators, else None (the history
        estimator reads its counts from `batch.history`).
      plan: the batch's `PackPlan` when the program packs (`config.pack`), else None.
    """

    batch: GroupBatch
    valid: jax.Array
    prior: BetaPrior | None = None
    plan: PackPlan | None = None


@struct.dataclass
class FrozenModels:
    """The parameters the update reads without training them: the reference copy (a KL
    term) and the OPD teacher (any architecture with the student's tokenizer; its graph is
    `UpdateProgram.teacher_graphdef`); None where unused."""

    ref_params: Any = None
    teacher_params: Any = None


def _advantages(batch: GroupBatch, valid, config: UpdateConfig, prior):
    """(advantages [R], loss mask [R, Tn], amplified [R], metrics) of the batch's rows:
    overlong shaping, then the outcome advantage with DAA on hard groups."""
    g = config.group_size
    n = batch.tokens.shape[0]
    valid_resp = expand_group_mask(valid, g)
    rows_mask = batch.response_mask.reshape(n * g, -1) & valid_resp[:, None]
    rewards, loss_mask = apply_overlong(
        batch.rewards.reshape(-1),
        batch.lengths.reshape(-1),
        batch.truncated.reshape(-1),
        rows_mask,
        config.overlong,
    )
    correct = batch.correct.reshape(-1)
    adv, metrics = compute_advantages(
        rewards,
        correct,
        g,
        config=config.adv,
        valid=valid_resp,
        daa=config.daa,
        group_valid=valid,
        prior=prior,
        history=batch.history,
    )
    base, _ = compute_advantages(rewards, correct, g, config=config.adv, valid=valid_resp)
    amplified = jnp.abs(adv) > jnp.abs(base)
    metrics["reward/shaped_mean"] = (rewards * valid_resp).sum() / jnp.maximum(valid_resp.sum(), 1)
    return adv, loss_mask, amplified, metrics


def _loss(logp, ent, rows: ResponseRows, loss_mask, config: UpdateConfig, normalizer):
    return da3po_loss(
        logp,
        rows.logp_old,
        rows.adv,
        loss_mask,
        config=config.loss,
        logp_ref=rows.logp_ref,
        normalizer=normalizer,
        entropy=ent,
        amplified=rows.amplified,
        logp_behavior=rows.logp_sample,
    )


def _minibatch_grads(graphdef, params, mb: ResponseRows, config: UpdateConfig, norm, sharding):
    """The gradient of one mini-batch, accumulated over its micro-batches: padded slices
    of `micro_batch_prompts` groups, or the packed slots of the mini-batch's plan (slot m
    trains on the responses the plan put in it, the others masked out of its loss). The
    policy is softmax(logits / `loss.temperature`), the trained policy's temperature."""
    temperature = config.loss.temperature
    if config.pack is None:
        micro_rows = (config.micro_batch_prompts or config.mini_batch_prompts) * config.group_size

        def loss_fn(p, m: ResponseRows):
            logp, ent = response_logprobs(graphdef, p, *m.inputs(), temperature)
            return _loss(logp, ent, m, m.loss_mask, config, norm)

        return accumulate_grads(loss_fn, params, mb.split(mb.num_rows // micro_rows))

    def packed_loss_fn(p, m):
        logp, ent = packed_response_logprobs(graphdef, p, mb, m, config.pack, sharding, temperature)
        here = (mb.plan.micro == m)[:, None]
        return _loss(logp, ent, mb, jnp.where(here, mb.loss_mask, 0), config, norm)

    slots = jnp.arange(num_slots(mb, mb.num_rows, config.pack), dtype=jnp.int32)
    used = lambda m: jnp.any(mb.plan.micro == m)  # noqa: E731
    return accumulate_grads(packed_loss_fn, params, slots, used)


def rl_update(
    program: UpdateProgram,
    state: TrainState,
    inputs: UpdateBatch,
    frozen: FrozenModels | None = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One RL training step on a batch of groups; jit it with `program` static and
    `state` donated (`jax.jit(rl_update, static_argnames="program",
    donate_argnames="state")`, as `PolicyUpdate` does).

    With `program.config.opd` set, the teacher's log-probs of the sampled responses (one
    forward of `frozen.teacher_params`) give the per-token OPD advantages; with a
    reference (`frozen.ref_params`) the loss has its KL term (`frozen` None: neither).

    A mini-batch without a valid token (e.g. the trailing slots when dynamic sampling
    stopped at its round cap short of a full batch) leaves parameters *and* optimizer
    state unchanged: no momentum step, no weight decay, no schedule count. So does a
    mini-batch whose loss, gradient norm or update norm is not finite (counted in
    `optim/nonfinite_updates`; the trainer stops after `train.max_nonfinite_steps` such
    steps in a row).

    Returns:
      (new state, scalar metrics).
    """
    graphdef, config, batch = program.graphdef, program.config, inputs.batch
    frozen = frozen or FrozenModels()
    if config.loss.tis_cap > 0 and batch.logp_sample is None:
        raise ValueError("loss.tis_cap > 0 needs the sampler's log-probs (batch.logp_sample)")
    if (config.pack is None) != (inputs.plan is None):
        raise ValueError("rl_update takes a packing plan exactly when config.pack is set")
    config = config.resolved(batch)
    adv, loss_mask, amplified, metrics = _advantages(batch, inputs.valid, config, inputs.prior)
    rows = ResponseRows.from_groups(batch, inputs.plan)
    rows = rows.replace(adv=adv, loss_mask=loss_mask, amplified=amplified)
    teacher = (program.teacher_graphdef, frozen.teacher_params)
    rows, frozen_metrics = _frozen_forwards(
        graphdef,
        state.params,
        rows,
        batch,
        config,
        frozen.ref_params,
        teacher,
        program.pack_sharding,
    )
    metrics.update(frozen_metrics)
    params, opt_state, update_metrics = _minibatch_updates(
        graphdef, program.tx, config, state, rows, program.pack_sharding
    )
    metrics.update(update_metrics)
    new_state = state.replace(params=params, opt_state=opt_state, step=state.step + 1)
    return new_state, metrics


def _frozen_forwards(graphdef, params, rows, batch, config: UpdateConfig, ref_params, teacher, sh):
    """The forwards that take no gradient, written into `rows`: recomputed old log-probs,
    the reference's log-probs (KL term) and, for OPD, the teacher's, which replace the
    advantages and the loss mask; all at the trained policy's temperature. Returns (rows,
    the OPD metrics ({} without a teacher))."""
    pack_args = None if config.pack is None else (config.mini_batch_rows, config.pack, sh)
    t = config.loss.temperature
    if config.recompute_logp_old:
        rows = rows.replace(logp_old=frozen_logprobs(graphdef, params, rows, pack_args, t))
    if ref_params is not None:
        rows = rows.replace(logp_ref=frozen_logprobs(graphdef, ref_params, rows, pack_args, t))
    if config.opd is None:
        return rows, {}
    teacher_graphdef, teacher_params = teacher
    if teacher_params is None or teacher_graphdef is None:
        raise ValueError("UpdateConfig.opd is set: rl_update needs the teacher")
    logp_teacher = frozen_logprobs(teacher_graphdef, teacher_params, rows, pack_args, t)
    adv, loss_mask, metrics = distillation_advantages(
        rows, logp_teacher, batch.correct.reshape(-1), config.opd, config.ra_opd, config.group_size
    )
    return rows.replace(adv=adv, loss_mask=loss_mask), metrics


def _minibatch_updates(graphdef, tx, config: UpdateConfig, state: TrainState, rows, sharding):
    """`num_iterations` passes of one optimizer update per mini-batch (a `lax.scan`);
    an update with no valid token or a non-finite loss / gradient / update is not
    applied. Returns (params, opt_state, metrics)."""
    minibatches = rows.split(rows.num_rows // config.mini_batch_rows)

    def update(carry, mb: ResponseRows):
        params, opt_state = carry
        norm = loss_normalizer(mb.loss_mask, config.loss.agg)
        grads, loss, mb_metrics = _minibatch_grads(graphdef, params, mb, config, norm, sharding)
        updates, new_opt_state = tx.update(grads, opt_state, params)
        grad_norm = optax.global_norm(grads)
        finite = (
            jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(optax.global_norm(updates))
        )
        nonfinite = (norm > 0) & ~finite
        applied = (norm > 0) & ~nonfinite
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(applied, a, b), new, old)
        carry = (keep(optax.apply_updates(params, updates), params), keep(new_opt_state, opt_state))
        scalars = {"loss/total": loss, "optim/grad_norm": grad_norm}
        return carry, (mb_metrics, {**scalars, "optim/applied": applied, "_nonfinite": nonfinite})

    carry = (state.params, state.opt_state)
    micro, per_mb = [], []
    for _ in range(config.num_iterations):
        carry, (m, s) = jax.lax.scan(update, carry, minibatches)
        micro.append(m)
        per_mb.append(s)
    stack = lambda ms: {k: jnp.stack([m[k] for m in ms]) for k in ms[0]}  # noqa: E731
    metrics = combine_metrics(stack(micro), config.num_iterations)
    per_mb = stack(per_mb)  # [iterations, mini-batches]
    applied = per_mb.pop("optim/applied")
    nonfinite = per_mb.pop("_nonfinite")
    metrics.update({k: mean_over_applied(v, applied) for k, v in per_mb.items()})
    metrics["optim/updates"] = applied.sum(dtype=jnp.float32)
    metrics["optim/nonfinite_updates"] = nonfinite.sum(dtype=jnp.float32)
    metrics["optim/skipped_updates"] = (~applied).sum(dtype=jnp.float32)
    return carry[0], carry[1], metrics
