"""The jitted RL update: advantages (GRPO, DAA; or per-token OPD / RA-OPD from a frozen
teacher), overlong shaping and the clipped loss over `num_iterations` passes of mini-batch
AdamW updates, as one pure function of arrays.

Shapes are fixed per run: a batch holds `train_prompts` groups of G responses; empty
dynamic-sampling slots are masked by `valid`. The loss normaliser of each mini-batch is
computed once over the whole mini-batch and shared by its micro-batches, so micro-batching
does not change the gradient (docs/algorithms.md, "Loss aggregation").
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from da3po_jax.models import positions_from_mask
from da3po_jax.parallel import batch_sharding, replicated
from da3po_jax.parallel.mesh import batch_size_divisor
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
    distillation_return,
    expand_group_mask,
    loss_normalizer,
    opd_advantages,
    ra_opd_mask,
)
from da3po_jax.train.batch import GroupBatch
from da3po_jax.train.packing import (
    PackConfig,
    PackPlan,
    micro_slots,
    packed_response_logprobs,
    plan_packing,
    sequence_lengths,
)
from da3po_jax.train.state import TrainState, optimizer_updates


@dataclasses.dataclass(frozen=True)
class RLStepConfig:
    """Static settings of the update (hashable); `opd` set = distil from the teacher
    (per-token advantages), `ra_opd` set = also drop reward-misaligned trajectories;
    `pack` set = the forwards run on packed micro-batches (train/packing.py) instead of
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


def response_logprobs(graphdef, params, prompt_tokens, prompt_mask, tokens, response_mask):
    """Teacher-forced log-probs and entropies of responses [R, Tn] given their prompts.

    The sequence is prompt ++ response; the log-prob of response token t is read at the
    position before it, so positions match the sampler's (prompt length + t).
    """
    model = nnx.merge(graphdef, params)
    tp = prompt_tokens.shape[1]
    full = jnp.concatenate([prompt_tokens, tokens], axis=1)
    attn = jnp.concatenate([prompt_mask, response_mask], axis=1)
    targets = jnp.concatenate([full[:, 1:], jnp.zeros_like(full[:, :1])], axis=1)
    logp, ent = model.token_logprobs(full, positions_from_mask(attn), attn, targets)
    tn = tokens.shape[1]
    return logp[:, tp - 1 : tp - 1 + tn], ent[:, tp - 1 : tp - 1 + tn]


def _rows(batch: GroupBatch, g: int, plan: PackPlan | None) -> dict[str, jax.Array]:
    """Per-response rows [N * G, ...] of the batch (prompts repeated for their G samples),
    with the packing plan's entries when there is one."""
    n = batch.tokens.shape[0]
    flat = lambda x: x.reshape(n * g, *x.shape[2:])
    rows = {
        "prompt_tokens": jnp.repeat(batch.prompt_tokens, g, axis=0),
        "prompt_mask": jnp.repeat(batch.prompt_mask, g, axis=0),
        "tokens": flat(batch.tokens),
        "response_mask": flat(batch.response_mask),
        "logp_old": flat(batch.logp_old),
    }
    if batch.logp_sample is not None:
        rows["logp_sample"] = flat(batch.logp_sample)
    if plan is not None:
        rows.update(pack_micro=plan.micro, pack_row=plan.row, pack_offset=plan.offset)
    return rows


def _plan_of(rows: dict) -> PackPlan:
    return PackPlan(micro=rows["pack_micro"], row=rows["pack_row"], offset=rows["pack_offset"])


def _num_micro(rows: dict, mb_rows: int, cfg: RLStepConfig) -> int:
    seq = rows["prompt_tokens"].shape[1] + rows["tokens"].shape[1]
    return micro_slots(mb_rows, seq, cfg.pack)


def _resolved(cfg: RLStepConfig, batch: GroupBatch) -> RLStepConfig:
    """`cfg` with the pack length fixed to the batch's row length where it is 0."""
    if cfg.pack is None:
        return cfg
    row_len = batch.prompt_tokens.shape[1] + batch.tokens.shape[2]
    return dataclasses.replace(cfg, pack=cfg.pack.resolve(row_len))


def pack_plan(batch: GroupBatch, valid, cfg: RLStepConfig, *, with_lengths: bool = False):
    """The host-side packing plan of a batch (`cfg.pack` set): every kept response row's
    (prompt, response) sequence placed in a packed micro-batch of its mini-batch. With
    `with_lengths`, (plan, the rows' [N * G] sequence lengths, 0 if not packed)."""
    cfg = _resolved(cfg, batch)
    mb_rows = cfg.mini_batch_prompts * cfg.group_size
    lens = sequence_lengths(batch, valid)
    plan = plan_packing(lens, cfg.pack, mb_rows)
    return (plan, lens) if with_lengths else plan


def _advantages(batch, valid, cfg: RLStepConfig, prior, history):
    g = cfg.group_size
    n = batch.tokens.shape[0]
    valid_resp = expand_group_mask(valid, g)
    rows_mask = batch.response_mask.reshape(n * g, -1) & valid_resp[:, None]
    rewards, loss_mask = apply_overlong(
        batch.rewards.reshape(-1),
        batch.lengths.reshape(-1),
        batch.truncated.reshape(-1),
        rows_mask,
        cfg.overlong,
    )
    correct = batch.correct.reshape(-1)
    adv, metrics = compute_advantages(
        rewards,
        correct,
        g,
        config=cfg.adv,
        valid=valid_resp,
        daa=cfg.daa,
        group_valid=valid,
        prior=prior,
        history=history,
    )
    base, _ = compute_advantages(rewards, correct, g, config=cfg.adv, valid=valid_resp)
    amplified = jnp.abs(adv) > jnp.abs(base)
    metrics["reward/shaped_mean"] = (rewards * valid_resp).sum() / jnp.maximum(valid_resp.sum(), 1)
    return adv, loss_mask, amplified, metrics


def _masked_stats(x: jax.Array, valid: jax.Array, prefix: str) -> dict[str, jax.Array]:
    """Mean, std, min and max of `x` over `valid` entries (0 when there are none)."""
    n = valid.sum()
    mean = jnp.where(valid, x, 0.0).sum() / jnp.maximum(n, 1)
    var = jnp.where(valid, (x - mean) ** 2, 0.0).sum() / jnp.maximum(n, 1)
    lo = jnp.where(valid, x, jnp.inf).min()
    hi = jnp.where(valid, x, -jnp.inf).max()
    return {
        f"{prefix}_mean": mean,
        f"{prefix}_std": jnp.sqrt(var),
        f"{prefix}_min": jnp.where(n > 0, lo, 0.0),
        f"{prefix}_max": jnp.where(n > 0, hi, 0.0),
    }


def _distillation(rows, logp_teacher, correct, outcome_adv, cfg: RLStepConfig):
    """Per-token OPD advantages `[R, Tn]`, the loss mask after the RA-OPD filter, and
    metrics: mean reverse KL per token, the distillation return D's distribution over
    trajectories, and (RA-OPD) kept / aligned fractions."""
    lp_old = rows["logp_old"]
    m = rows["loss_mask"] > 0
    adv = opd_advantages(lp_old, logp_teacher, m, config=cfg.opd, outcome_advantages=outcome_adv)
    d_return = distillation_return(lp_old, logp_teacher, m)
    has_tokens = m.any(-1)
    kl = jnp.where(m, lp_old - logp_teacher, 0.0).sum() / jnp.maximum(m.sum(), 1)
    metrics = {"opd/reverse_kl": kl, **_masked_stats(d_return, has_tokens, "opd/return")}
    if cfg.ra_opd is not None:
        keep, ra_metrics = ra_opd_mask(
            d_return, correct, config=cfg.ra_opd, group_size=cfg.group_size, valid=has_tokens
        )
        m = m & keep[:, None]
        metrics.update(ra_metrics)
    metrics["opd/adv_token_mean"] = jnp.where(m, adv, 0.0).sum() / jnp.maximum(m.sum(), 1)
    return adv, m, metrics


def _loss(logp, ent, m: dict, loss_mask, cfg: RLStepConfig, normalizer):
    return da3po_loss(
        logp,
        m["logp_old"],
        m["adv"],
        loss_mask,
        config=cfg.loss,
        logp_ref=m.get("logp_ref"),
        normalizer=normalizer,
        entropy=ent,
        amplified=m["amplified"],
        logp_behavior=m.get("logp_sample"),
    )


def _microbatch_grads(graphdef, params, mb: dict, cfg: RLStepConfig, normalizer):
    """Gradient of one mini-batch, accumulated over its micro-batches (shared normaliser)."""
    g = cfg.group_size
    micro_rows = (cfg.micro_batch_prompts or cfg.mini_batch_prompts) * g
    n_micro = mb["tokens"].shape[0] // micro_rows
    split = jax.tree.map(lambda x: x.reshape(n_micro, micro_rows, *x.shape[1:]), mb)

    def loss_fn(p, m):
        logp, ent = response_logprobs(
            graphdef, p, m["prompt_tokens"], m["prompt_mask"], m["tokens"], m["response_mask"]
        )
        return _loss(logp, ent, m, m["loss_mask"], cfg, normalizer)

    def body(acc, m):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, m)
        acc_grads, acc_loss = acc
        return (jax.tree.map(jnp.add, acc_grads, grads), acc_loss + loss), metrics

    zeros = jax.tree.map(jnp.zeros_like, params)
    (grads, loss), metrics = jax.lax.scan(body, (zeros, jnp.zeros(())), split)
    return grads, loss, metrics


def _zeros_like_shapes(fn, *args):
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(fn, *args))


def _packed_grads(graphdef, params, mb: dict, cfg: RLStepConfig, normalizer, sharding):
    """`_microbatch_grads` over packed micro-batches: slot m trains on the responses the
    plan put in it (the others masked out of its loss); unused slots are skipped."""
    plan = _plan_of(mb)
    n_micro = _num_micro(mb, mb["tokens"].shape[0], cfg)

    def loss_fn(p, m):
        logp, ent = packed_response_logprobs(graphdef, p, mb, plan, m, cfg.pack, sharding)
        here = (plan.micro == m)[:, None]
        return _loss(logp, ent, mb, jnp.where(here, mb["loss_mask"], 0), cfg, normalizer)

    def grads_of(m):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, m)
        return grads, loss, metrics

    unused = _zeros_like_shapes(grads_of, jnp.zeros((), jnp.int32))

    def body(acc, m):
        used = jnp.any(plan.micro == m)
        grads, loss, metrics = jax.lax.cond(used, grads_of, lambda _: unused, m)
        acc_grads, acc_loss = acc
        return (jax.tree.map(jnp.add, acc_grads, grads), acc_loss + loss), metrics

    zeros = jax.tree.map(jnp.zeros_like, params)
    slots = jnp.arange(n_micro, dtype=jnp.int32)
    (grads, loss), metrics = jax.lax.scan(body, (zeros, jnp.zeros(())), slots)
    return grads, loss, metrics


def _packed_logprobs(graphdef, params, rows: dict, cfg: RLStepConfig, sharding) -> jax.Array:
    """`response_logprobs(...)[0]` of every response row [R, Tn], computed on the packed
    micro-batches of each mini-batch (unused slots skipped; rows not packed get 0)."""
    mb_rows = cfg.mini_batch_prompts * cfg.group_size
    keys = ("prompt_tokens", "prompt_mask", "tokens", "response_mask")
    keys += ("pack_micro", "pack_row", "pack_offset")
    r, tn = rows["tokens"].shape
    mbs = {k: rows[k].reshape(r // mb_rows, mb_rows, *rows[k].shape[1:]) for k in keys}
    slots = jnp.arange(_num_micro(rows, mb_rows, cfg), dtype=jnp.int32)

    def per_minibatch(_, mb):
        plan = _plan_of(mb)
        fwd = lambda m: packed_response_logprobs(  # noqa: E731
            graphdef, params, mb, plan, m, cfg.pack, sharding
        )[0]
        empty = jnp.zeros((mb_rows, tn), jnp.float32)

        def body(acc, m):  # every row is in one slot: the slots' values add up
            return acc + jax.lax.cond(jnp.any(plan.micro == m), fwd, lambda _: empty, m), None

        return None, jax.lax.scan(body, empty, slots)[0]

    return jax.lax.scan(per_minibatch, None, mbs)[1].reshape(r, tn)


# Micro-batch metrics that are not token means of their own micro-batch: the partial sums
# of the mini-batch loss, and means over a subset of tokens (weighted by its own count).
_SUMMED_OVER_MICRO = ("loss/pg",)
_WEIGHTED_BY = {"loss/clipfrac_high_amplified": "loss/num_amplified_tokens"}


def combine_metrics(metrics: dict[str, jax.Array], num_iterations: int) -> dict[str, jax.Array]:
    """One value per step from the metrics stacked `[iterations, mini-batches, micro]`.

    Token means are weighted by their micro-batch's token count (an empty micro-batch
    does not drag them towards 0) and means over a subset of tokens by that subset's
    count; `loss/pg`, whose micro-batch values are partial sums of the mini-batch loss
    (they share its normaliser), is summed over micro-batches and averaged over the
    mini-batches that had tokens; token counts are those of one pass over the batch.
    """
    counts = ("loss/num_tokens", *_WEIGHTED_BY.values())
    nonempty = (metrics["loss/num_tokens"].sum(-1) > 0).astype(jnp.float32)  # [iters, mbs]
    out = {}
    for k, v in metrics.items():
        if k in counts:
            out[k] = v.sum() / num_iterations
        elif k == "loss/ratio_max":
            out[k] = v.max()
        elif k in _SUMMED_OVER_MICRO:
            out[k] = (v.sum(-1) * nonempty).sum() / jnp.maximum(nonempty.sum(), 1.0)
        else:
            w = metrics[_WEIGHTED_BY.get(k, "loss/num_tokens")]
            out[k] = (v * w).sum() / jnp.maximum(w.sum(), 1e-9)
    return out


def _mean_over_applied(x: jax.Array, applied: jax.Array) -> jax.Array:
    a = applied.astype(jnp.float32)
    return jnp.where(applied, x, 0.0).sum() / jnp.maximum(a.sum(), 1.0)


def rl_update(
    graphdef: Any,
    tx: optax.GradientTransformation,
    cfg: RLStepConfig,
    state: TrainState,
    batch: GroupBatch,
    valid: jax.Array,
    prior: BetaPrior | None = None,
    ref_params: Any = None,
    teacher_params: Any = None,
    pack: PackPlan | None = None,
    *,
    teacher_graphdef: Any = None,
    pack_sharding: Any = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One RL training step on a batch of groups (jit with graphdef, tx, cfg and
    teacher_graphdef static).

    Args:
      state: the `TrainState` (donate it).
      batch: `GroupBatch` of N = train_prompts groups.
      valid: [N] bool, slots that hold a kept group.
      prior: the Beta prior of the bayes / history estimators, else None (the history
        estimator reads its counts from `batch.history`).
      ref_params: frozen reference parameters when the loss has a KL term.
      teacher_params, teacher_graphdef: the frozen teacher (`nnx.split` of it; any
        architecture with the student's tokenizer) when `cfg.opd` is set: its log-probs of
        the sampled responses (one forward) give the per-token OPD advantages.
      pack, pack_sharding: with `cfg.pack`, the batch's `pack_plan` and (static) where
        the packed rows go (the batch axes), or None.

    A mini-batch without a valid token (e.g. the trailing slots when dynamic sampling
    stopped at its round cap short of a full batch) leaves parameters *and* optimizer
    state unchanged: no momentum step, no weight decay, no schedule count. So does a
    mini-batch whose loss, gradient norm or update norm is not finite (counted in
    `optim/nonfinite_updates`; the trainer stops after `train.max_nonfinite_steps` such
    steps in a row).

    Returns:
      (new state, scalar metrics).
    """
    if cfg.loss.tis_cap > 0 and batch.logp_sample is None:
        raise ValueError("loss.tis_cap > 0 needs the sampler's log-probs (batch.logp_sample)")
    if (cfg.pack is None) != (pack is None):
        raise ValueError("rl_update takes a packing plan exactly when cfg.pack is set")
    cfg = _resolved(cfg, batch)
    adv, loss_mask, amplified, metrics = _advantages(batch, valid, cfg, prior, batch.history)
    rows = _rows(batch, cfg.group_size, pack)
    rows.update(adv=adv, loss_mask=loss_mask, amplified=amplified)
    teacher, sh = (teacher_graphdef, teacher_params), pack_sharding
    metrics.update(
        _frozen_forwards(graphdef, state.params, rows, batch, cfg, ref_params, teacher, sh)
    )
    params, opt_state, update_metrics = _minibatch_updates(
        graphdef, tx, cfg, state, rows, pack_sharding
    )
    metrics.update(update_metrics)
    new_state = state.replace(params=params, opt_state=opt_state, step=state.step + 1)
    return new_state, metrics


def _frozen_forwards(graphdef, params, rows, batch, cfg: RLStepConfig, ref_params, teacher, sh):
    """The forwards that take no gradient, written into `rows`: recomputed old log-probs,
    the reference's log-probs (KL term) and, for OPD, the teacher's, which replace the
    advantages and the loss mask. Returns the OPD metrics ({} without a teacher)."""
    if cfg.pack is None:
        args = (rows["prompt_tokens"], rows["prompt_mask"], rows["tokens"], rows["response_mask"])
        fwd = lambda gd, p, *a: response_logprobs(gd, p, *a)  # noqa: E731
    else:
        args = ()
        fwd = lambda gd, p: (_packed_logprobs(gd, p, rows, cfg, sh),)  # noqa: E731
    if cfg.recompute_logp_old:
        rows["logp_old"] = jax.lax.stop_gradient(fwd(graphdef, params, *args)[0])
    if ref_params is not None:
        rows["logp_ref"] = jax.lax.stop_gradient(fwd(graphdef, ref_params, *args)[0])
    if cfg.opd is None:
        return {}
    teacher_graphdef, teacher_params = teacher
    if teacher_params is None or teacher_graphdef is None:
        raise ValueError("RLStepConfig.opd is set: rl_update needs the teacher")
    logp_teacher = jax.lax.stop_gradient(fwd(teacher_graphdef, teacher_params, *args)[0])
    rows["adv"], rows["loss_mask"], opd_metrics = _distillation(
        rows, logp_teacher, batch.correct.reshape(-1), rows["adv"], cfg
    )
    return opd_metrics


def _minibatch_updates(graphdef, tx, cfg: RLStepConfig, state: TrainState, rows, sharding):
    """`num_iterations` passes of one optimizer update per mini-batch (a `lax.scan`);
    an update with no valid token or a non-finite loss / gradient / update is not
    applied. Returns (params, opt_state, metrics)."""
    mb_rows = cfg.mini_batch_prompts * cfg.group_size
    n_mb = rows["tokens"].shape[0] // mb_rows
    minibatches = jax.tree.map(lambda x: x.reshape(n_mb, mb_rows, *x.shape[1:]), rows)

    def update(carry, mb):
        params, opt_state = carry
        norm = loss_normalizer(mb["loss_mask"], cfg.loss.agg)
        if cfg.pack is None:
            grads, loss, mb_metrics = _microbatch_grads(graphdef, params, mb, cfg, norm)
        else:
            grads, loss, mb_metrics = _packed_grads(graphdef, params, mb, cfg, norm, sharding)
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
    for _ in range(cfg.num_iterations):
        carry, (m, s) = jax.lax.scan(update, carry, minibatches)
        micro.append(m)
        per_mb.append(s)
    stack = lambda ms: {k: jnp.stack([m[k] for m in ms]) for k in ms[0]}
    metrics = combine_metrics(stack(micro), cfg.num_iterations)
    per_mb = stack(per_mb)  # [iterations, mini-batches]
    applied = per_mb.pop("optim/applied")
    nonfinite = per_mb.pop("_nonfinite")
    metrics.update({k: _mean_over_applied(v, applied) for k, v in per_mb.items()})
    metrics["optim/updates"] = applied.sum(dtype=jnp.float32)
    metrics["optim/nonfinite_updates"] = nonfinite.sum(dtype=jnp.float32)
    metrics["optim/skipped_updates"] = (~applied).sum(dtype=jnp.float32)
    return carry[0], carry[1], metrics


class RLUpdate:
    """The update stage: `rl_update` jitted once, with its static settings and the frozen
    models (reference copy, teacher) bound, so the loop calls `update(state, batch, valid,
    prior)`.

    Args:
      graphdef: the policy's `nnx` graph definition.
      tx: the optimizer; `schedule` its learning-rate schedule (for the `optim/lr` metric).
      cfg: `RLStepConfig`.
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
        cfg: RLStepConfig,
        *,
        state_shardings: Any = None,
        mesh: Any = None,
        ref_params: Any = None,
        teacher: tuple[Any, Any] | None = None,
    ):
        if cfg.opd is not None and teacher is None:
            raise ValueError("RLStepConfig.opd is set: the update needs the teacher model")
        self.graphdef, self.tx, self.schedule, self.cfg = graphdef, tx, schedule, cfg
        self.ref_params = ref_params
        self.teacher_graphdef, self.teacher_params = teacher or (None, None)
        out = (state_shardings, replicated(mesh)) if mesh is not None else None
        self.mesh = mesh
        self.last_lengths = None  # packed: the sequence lengths of the last batch (FLOPs)
        self.pack_sharding = None
        if mesh is not None and cfg.pack is not None:
            if cfg.pack.rows % batch_size_divisor(mesh):
                raise ValueError(
                    f"config.rl.pack_rows={cfg.pack.rows} must be a multiple of the "
                    f"{batch_size_divisor(mesh)} devices a batch is split over (data x fsdp)"
                )
            self.pack_sharding = batch_sharding(mesh, (cfg.pack.rows,))
        self.fn = jax.jit(
            rl_update,
            static_argnums=(0, 1, 2),
            static_argnames=("teacher_graphdef", "pack_sharding"),
            donate_argnums=(3,),
            out_shardings=out,
        )

    def __call__(self, state: TrainState, batch: GroupBatch, valid: jax.Array, prior):
        plan = None
        if self.cfg.pack is not None:  # host side: the batch's lengths decide the packing
            plan, lens = pack_plan(batch, valid, self.cfg, with_lengths=True)
            self.last_lengths = lens[lens > 0]
            if self.mesh is not None:
                plan = jax.device_put(plan, replicated(self.mesh))
        return self.fn(
            self.graphdef,
            self.tx,
            self.cfg,
            state,
            batch,
            valid,
            prior,
            self.ref_params,
            self.teacher_params,
            plan,
            teacher_graphdef=self.teacher_graphdef,
            pack_sharding=self.pack_sharding,
        )

    def lr(self, state: TrainState) -> float:
        """The rate of the last optimizer update applied (the schedule counts updates)."""
        return float(self.schedule(max(optimizer_updates(state) - 1, 0)))

    def forwards(self) -> int:
        """Forward passes of the policy's architecture per row besides the training passes
        (the recomputed old log-probs, the reference): for the FLOP count. The teacher's
        forward is counted with its own architecture."""
        return int(self.cfg.recompute_logp_old) + int(self.ref_params is not None)
