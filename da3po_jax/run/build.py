"""Wiring a run from its settings: the stages of the RL loop (`build_trainer`: the
optimizer and train state, the update, the rollout engine, the collector and its carry,
held-out evaluation, checkpoints, logging and performance metrics) and the engines of
evaluation and the SFT checks. Nothing in the loop builds its own parts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from da3po_jax.config import Settings
from da3po_jax.data import MathProblem, PromptIterator
from da3po_jax.models import Transformer
from da3po_jax.parallel import is_main_process
from da3po_jax.rollout import (
    CollectConfig,
    Collector,
    EngineParts,
    KeepRule,
    RolloutEngine,
    build_engine,
)
from da3po_jax.run.context import RunContext
from da3po_jax.run.evaluation import HeldoutEval, check_group_by
from da3po_jax.run.inputs import generate_configs
from da3po_jax.run.loop import RLTrainer, StepPerf
from da3po_jax.runtime import perf
from da3po_jax.runtime.checkpoint import Checkpointer
from da3po_jax.runtime.logger import MetricsLogger
from da3po_jax.sampling import GenerateConfig, continuous
from da3po_jax.sampling.sampler import generate_with_cache
from da3po_jax.update import PackConfig, PolicyUpdate, UpdateConfig
from da3po_jax.update.state import init_train_state, make_optimizer


def update_config(s: Settings) -> UpdateConfig:
    """The update's static settings."""
    return UpdateConfig(
        group_size=s.rollout.group_size,
        mini_batch_prompts=s.rl.mini_batch_prompts,
        micro_batch_prompts=s.rl.micro_batch_prompts,
        num_iterations=s.rl.num_iterations,
        loss=s.loss,
        adv=s.adv,
        daa=s.daa_on,
        overlong=s.overlong,
        # partial rollouts: the proximal policy is the step's weights (decoupled objective)
        recompute_logp_old=s.rollout.logp_old == "recompute" or s.rollout.max_staleness > 0,
        opd=s.opd_on,
        ra_opd=s.ra_opd_on,
        pack=PackConfig(s.rl.pack_length, s.rl.pack_rows) if s.rl.packing else None,
    )


def collect_config(s: Settings) -> CollectConfig:
    """The collect stage's settings; the DAA rule decides what the carry tracks."""
    capacity = s.rl.train_prompts
    return CollectConfig(
        capacity=capacity,
        max_prompts=s.ds.max_prompts if s.ds.enable else capacity,
        keep=KeepRule(
            enable=bool(s.ds.enable),
            metric=s.ds.metric,
            group_size=s.rollout.group_size,
            overlong=s.overlong,
        ),
        daa=s.daa,
    )


def make_engine(
    ctx: RunContext,
    graphdef,
    model_cfg,
    gen: GenerateConfig,
    problems: Sequence[MathProblem],
    round_size: int,
    index_of: dict[str, int] | None = None,
    *,
    training: bool = False,
) -> RolloutEngine:
    """The configured engine (`rollout.engine`) for groups of `problems` (their longest
    prompt sets the prompt length); `round_size` prompts per call of a round engine.
    Only `training`'s engine carries groups across steps (`rollout.max_staleness`)."""
    r = ctx.settings.rollout
    parts = EngineParts(
        graphdef=graphdef,
        model_cfg=model_cfg,
        gen=gen,
        encoder=ctx.encoder,
        scorer=ctx.scorer,
        prompt_len=ctx.encoder.bucket(problems),
        round_size=round_size,
        index_of=index_of or {},
        mesh=ctx.mesh,
        slots=r.slots,
        steps_per_call=r.steps_per_call,
        attention_block=r.attention_block,
        max_staleness=r.max_staleness if training else 0,
        partial_kv=r.partial_kv,
    )
    return build_engine(r.engine, parts)


def eval_engine(
    ctx: RunContext, graphdef, model_cfg, gen: GenerateConfig, problems: Sequence[MathProblem]
) -> RolloutEngine:
    """The engine of a held-out evaluation of `problems`: `eval.prompts_per_call` prompts
    per call (fewer when there are fewer problems)."""
    size = min(ctx.settings.eval.prompts_per_call, len(problems))
    return make_engine(ctx, graphdef, model_cfg, gen, problems, size)


def heldout_problems(ctx: RunContext) -> list[MathProblem]:
    """The first `eval.max_prompts` held-out problems (0: all)."""
    return ctx.data.heldout[: ctx.settings.eval.max_prompts or None]


def build_trainer(
    ctx: RunContext,
    model: Transformer,
    teacher: Transformer | None = None,
    *,
    on_resumed: Callable[[], None] | None = None,
) -> RLTrainer:
    """The RL loop for `ctx.settings`, its stages wired (see the module docstring). OPD /
    RA-OPD also take the frozen `teacher` (never updated, never checkpointed)."""
    s, mesh = ctx.settings, ctx.mesh
    cfg = update_config(s)
    if cfg.opd is not None and teacher is None:
        raise ValueError(f"algo={s.algo!r} needs the teacher model (config.teacher)")
    tx, schedule = make_optimizer(s.optim, s.train.steps, s.updates_per_step)
    graphdef, state = init_train_state(model, tx, s.seed, mesh)
    update = PolicyUpdate(
        graphdef,
        tx,
        schedule,
        cfg,
        state_shardings=jax.tree.map(lambda x: x.sharding, state) if mesh else None,
        mesh=mesh,
        # a frozen copy: the policy's buffers are donated each step
        ref_params=jax.tree.map(jnp.copy, state.params) if s.loss.kl_coef > 0 else None,
        teacher=nnx.split(teacher) if teacher is not None else None,
    )
    gen, eval_gen = generate_configs(s, ctx.tokenizer)
    index_of = {p.id: i for i, p in enumerate(ctx.data.train)}
    engine = make_engine(
        ctx, graphdef, model.cfg, gen, ctx.data.train, s.round_size, index_of, training=True
    )
    # every host walks the same global stream; each feeds its rows of every batch
    iterator = PromptIterator(ctx.data.train, seed=s.seed)
    collector = Collector(engine, iterator, collect_config(s), mesh)
    logger = MetricsLogger(
        ctx.workdir,
        enabled=is_main_process(),
        wandb_project=s.train.wandb_project,
        config=s.to_dict(),
    )
    return RLTrainer(
        s,
        state,
        collector.initial_carry(len(ctx.data.train)),
        collector,
        update,
        heldout_eval(ctx, graphdef, model.cfg, eval_gen, logger.write_samples),
        Checkpointer(ctx.workdir, s.train.keep_checkpoints, finite=("['train']",)),
        logger,
        stop=ctx.stop,
        on_resumed=on_resumed,
        perf=step_perf(s, model, teacher, engine, update, collector, mesh),
    )


def heldout_eval(
    ctx: RunContext, graphdef, model_cfg, gen: GenerateConfig, on_samples=None
) -> HeldoutEval:
    """The loop's periodic eval on the first `eval.max_prompts` held-out problems, through
    an engine of the configured kind (its memory freed after each eval), grouped by
    `eval.group_by`; `eval.log_samples` responses go to `on_samples(step, records)`."""
    s = ctx.settings
    problems = heldout_problems(ctx)
    if not problems:
        return HeldoutEval(None, [], s.seed)
    check_group_by(problems, s.eval.group_by)
    return HeldoutEval(
        eval_engine(ctx, graphdef, model_cfg, gen, problems),
        problems,
        s.seed,
        by=s.eval.group_by,
        tokenizer=ctx.tokenizer,
        render=ctx.encoder.render,
        log_samples=s.eval.log_samples,
        on_samples=on_samples,
    )


def step_perf(
    s: Settings, model, teacher, engine: RolloutEngine, update: PolicyUpdate, collector, mesh
) -> StepPerf:
    """Compile counts of the step's jitted functions, and the update's model FLOPs: the
    training passes plus the frozen forwards, over every row of the padded batch or,
    packed, over the real tokens of each sequence of the step's batch."""
    counts = perf.CompileCounts()
    counts.watch("update", update.fn)
    counts.watch("ds_round", collector.add_finished)
    counts.watch("sampler", generate_with_cache)
    for name in ("admit_groups", "decode_steps"):
        counts.watch(name, count=lambda name=name: continuous.trace_counts().get(name, 0))
    seq = engine.prompt_len + engine.max_new_tokens
    teacher_cfg = teacher.cfg if teacher is not None else None
    flops = padded_update_flops(s, model.cfg, teacher_cfg, seq, update.forwards())
    iterations = s.rl.num_iterations
    devices = mesh.size if mesh is not None else 1
    if update.cfg.pack is not None:
        padded = flops

        def flops() -> float:
            lens = update.last_lengths
            if lens is None:
                return padded
            fwd = perf.sequence_flops(model.cfg, lens)
            t = perf.sequence_flops(teacher.cfg, lens) if teacher is not None else 0.0
            return (iterations * 3 + update.forwards()) * fwd + t

    return StepPerf(counts, flops, lambda: perf.peak_flops(s.model.dtype), devices)


def padded_update_flops(
    s: Settings, model_cfg, teacher_cfg, seq: int, extra_forwards: int
) -> float:
    """Model FLOPs of one step's update over every row of the padded batch at `seq`
    tokens: the training passes, `extra_forwards` frozen forwards of the policy's
    architecture (`PolicyUpdate.forwards`) and the teacher's forward (None: no teacher)."""
    rows = s.rl.train_prompts * s.rollout.group_size
    teacher = perf.forward_flops(teacher_cfg, rows, seq) if teacher_cfg is not None else 0.0
    return perf.update_flops(
        model_cfg,
        rows,
        seq,
        num_iterations=s.rl.num_iterations,
        extra_forwards=extra_forwards,
        extra_flops=teacher,
    )
