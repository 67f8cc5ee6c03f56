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
from da3po_jax.run.evaluation import EvalRun, EvalSet, HeldoutEval, check_group_by
from da3po_jax.run.inputs import generate_configs
from da3po_jax.run.loop import RLTrainer, StepPerf
from da3po_jax.runtime import perf
from da3po_jax.runtime.checkpoint import Checkpointer
from da3po_jax.runtime.logger import MetricsLogger
from da3po_jax.sampling import GenerateConfig, continuous
from da3po_jax.sampling.sampler import generate_with_cache
from da3po_jax.update import PackConfig, PolicyUpdate, UpdateConfig
from da3po_jax.update.state import init_train_state, make_optimizer


def update_config(settings: Settings) -> UpdateConfig:
    """The update's static settings."""
    return UpdateConfig(
        group_size=settings.rollout.group_size,
        mini_batch_prompts=settings.rl.mini_batch_prompts,
        micro_batch_prompts=settings.rl.micro_batch_prompts,
        num_iterations=settings.rl.num_iterations,
        loss=settings.loss,
        adv=settings.adv,
        daa=settings.daa_on,
        overlong=settings.overlong,
        # partial rollouts: the proximal policy is the step's weights (decoupled objective)
        recompute_logp_old=settings.rollout.logp_old == "recompute"
        or settings.rollout.max_staleness > 0,
        opd=settings.opd_on,
        ra_opd=settings.ra_opd_on,
        pack=PackConfig(settings.rl.pack_length, settings.rl.pack_rows)
        if settings.rl.packing
        else None,
    )


def collect_config(settings: Settings) -> CollectConfig:
    """The collect stage's settings; the DAA rule decides what the carry tracks."""
    capacity = settings.rl.train_prompts
    return CollectConfig(
        capacity=capacity,
        max_prompts=settings.ds.max_prompts if settings.ds.enable else capacity,
        keep=KeepRule(
            enable=bool(settings.ds.enable),
            metric=settings.ds.metric,
            group_size=settings.rollout.group_size,
            overlong=settings.overlong,
        ),
        daa=settings.daa,
    )


def make_engine(
    ctx: RunContext,
    graphdef,
    model_config,
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
    rollout = ctx.settings.rollout
    parts = EngineParts(
        graphdef=graphdef,
        model_config=model_config,
        gen=gen,
        encoder=ctx.encoder,
        scorer=ctx.scorer,
        prompt_len=ctx.encoder.bucket(problems),
        round_size=round_size,
        index_of=index_of or {},
        mesh=ctx.mesh,
        slots=rollout.slots,
        steps_per_call=rollout.steps_per_call,
        attention_block=rollout.attention_block,
        max_staleness=rollout.max_staleness if training else 0,
        partial_kv=rollout.partial_kv,
    )
    return build_engine(rollout.engine, parts)


def eval_engine(
    ctx: RunContext, graphdef, model_config, gen: GenerateConfig, problems: Sequence[MathProblem]
) -> RolloutEngine:
    """The engine of a held-out evaluation of `problems`: `eval.prompts_per_call` prompts
    per call (fewer when there are fewer problems)."""
    size = min(ctx.settings.eval.prompts_per_call, len(problems))
    return make_engine(ctx, graphdef, model_config, gen, problems, size)


def eval_sets(ctx: RunContext) -> list[EvalSet]:
    """The sets a run evaluates: the first `eval.max_prompts` held-out problems (0: all)
    at k = `eval.num_samples`, then each suite of `eval.suites` (loaded with the data)."""
    settings = ctx.settings
    heldout = ctx.data.heldout[: settings.eval.max_prompts or None]
    sets = [EvalSet("", "held-out", heldout, settings.eval.num_samples)] if heldout else []
    for loaded in ctx.data.suites:
        k = loaded.suite.k or settings.eval.num_samples
        sets.append(EvalSet(loaded.suite.name, loaded.title, loaded.problems, k))
    return sets


def eval_runs(ctx: RunContext, graphdef, model_config, gen: GenerateConfig) -> list[EvalRun]:
    """Each set of `eval_sets` with the engine that samples it: one engine per k (`gen`
    with `num_samples` = k), its prompt length the longest of its sets' prompts, so a
    run compiles one set of eval programs per k (what the planner counts)."""
    sets = eval_sets(ctx)
    engines = {}
    for k in sorted({s.k for s in sets}):
        problems = [p for s in sets if s.k == k for p in s.problems]
        engines[k] = eval_engine(ctx, graphdef, model_config, gen.replace(num_samples=k), problems)
    return [(s, engines[s.k]) for s in sets]


def build_trainer(
    ctx: RunContext,
    model: Transformer,
    teacher: Transformer | None = None,
    *,
    on_resumed: Callable[[], None] | None = None,
) -> RLTrainer:
    """The RL loop for `ctx.settings`, its stages wired (see the module docstring). OPD /
    RA-OPD also take the frozen `teacher` (never updated, never checkpointed)."""
    settings, mesh = ctx.settings, ctx.mesh
    config = update_config(settings)
    if config.opd is not None and teacher is None:
        raise ValueError(f"algo={settings.algo!r} needs the teacher model (config.teacher)")
    tx, schedule = make_optimizer(settings.optim, settings.train.steps, settings.updates_per_step)
    graphdef, state = init_train_state(model, tx, settings.seed, mesh)
    update = PolicyUpdate(
        graphdef,
        tx,
        schedule,
        config,
        state_shardings=jax.tree.map(lambda x: x.sharding, state) if mesh else None,
        mesh=mesh,
        # a frozen copy: the policy's buffers are donated each step
        ref_params=jax.tree.map(jnp.copy, state.params) if settings.loss.kl_coef > 0 else None,
        teacher=nnx.split(teacher) if teacher is not None else None,
    )
    gen, eval_gen = generate_configs(settings, ctx.tokenizer)
    index_of = {p.id: i for i, p in enumerate(ctx.data.train)}
    engine = make_engine(
        ctx,
        graphdef,
        model.config,
        gen,
        ctx.data.train,
        settings.round_size,
        index_of,
        training=True,
    )
    # every host walks the same global stream; each feeds its rows of every batch
    iterator = PromptIterator(ctx.data.train, seed=settings.seed)
    collector = Collector(engine, iterator, collect_config(settings), mesh)
    logger = MetricsLogger(
        ctx.workdir,
        enabled=is_main_process(),
        wandb_project=settings.train.wandb_project,
        config=settings.to_dict(),
    )
    return RLTrainer(
        settings,
        state,
        collector.initial_carry(len(ctx.data.train)),
        collector,
        update,
        heldout_eval(ctx, graphdef, model.config, eval_gen, logger.write_samples),
        Checkpointer(ctx.workdir, settings.train.keep_checkpoints, finite=("['train']",)),
        logger,
        stop=ctx.stop,
        on_resumed=on_resumed,
        perf=step_perf(settings, model, teacher, engine, update, collector, mesh),
    )


def heldout_eval(
    ctx: RunContext, graphdef, model_config, gen: GenerateConfig, on_samples=None
) -> HeldoutEval:
    """The loop's periodic eval of every set (`eval_runs`), through engines of the
    configured kind (their memory freed after each eval), grouped by `eval.group_by`;
    `eval.log_samples` responses of each set go to `on_samples(step, records)`."""
    settings = ctx.settings
    runs = eval_runs(ctx, graphdef, model_config, gen)
    check_group_by([p for s, _ in runs for p in s.problems], settings.eval.group_by)
    return HeldoutEval(
        runs,
        settings.seed,
        by=settings.eval.group_by,
        tokenizer=ctx.tokenizer,
        render=ctx.encoder.render,
        log_samples=settings.eval.log_samples,
        on_samples=on_samples,
    )


def step_perf(
    settings: Settings, model, teacher, engine: RolloutEngine, update: PolicyUpdate, collector, mesh
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
    teacher_model_config = teacher.config if teacher is not None else None
    flops = padded_update_flops(
        settings, model.config, teacher_model_config, seq, update.forwards()
    )
    iterations = settings.rl.num_iterations
    devices = mesh.size if mesh is not None else 1
    if update.config.pack is not None:
        padded = flops

        def flops() -> float:
            lens = update.last_lengths
            if lens is None:
                return padded
            fwd = perf.sequence_flops(model.config, lens)
            t = perf.sequence_flops(teacher.config, lens) if teacher is not None else 0.0
            return (iterations * 3 + update.forwards()) * fwd + t

    return StepPerf(counts, flops, lambda: perf.peak_flops(settings.model.dtype), devices)


def padded_update_flops(
    settings: Settings, model_config, teacher_model_config, seq: int, extra_forwards: int
) -> float:
    """Model FLOPs of one step's update over every row of the padded batch at `seq`
    tokens: the training passes, `extra_forwards` frozen forwards of the policy's
    architecture (`PolicyUpdate.forwards`) and the teacher's forward (None: no teacher)."""
    rows = settings.rl.train_prompts * settings.rollout.group_size
    teacher = (
        perf.forward_flops(teacher_model_config, rows, seq)
        if teacher_model_config is not None
        else 0.0
    )
    return perf.update_flops(
        model_config,
        rows,
        seq,
        num_iterations=settings.rl.num_iterations,
        extra_forwards=extra_forwards,
        extra_flops=teacher,
    )
