"""Wiring a run from its config: the run context (built once in `train/run.py`) and the
factory that assembles the RL loop's stages (`build_trainer`): the optimizer and train
state, the update, the rollout engine, the collector and its carry, evaluation,
checkpoints, logging and performance metrics. Nothing in the loop builds its own parts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from da3po_jax.data import PromptIterator
from da3po_jax.models import Transformer
from da3po_jax.models.tokenizer import Tokenizer
from da3po_jax.rewards import RewardScorer
from da3po_jax.rl import OverlongConfig
from da3po_jax.sampling import GenerateConfig, Sampler, continuous
from da3po_jax.sampling.continuous import SlotConfig, SlotDecoder
from da3po_jax.sampling.host import pick_bucket
from da3po_jax.sampling.sampler import generate_with_cache
from da3po_jax.train import config as config_lib
from da3po_jax.train import perf
from da3po_jax.train.checkpoint import Checkpointer
from da3po_jax.train.collector import CollectConfig, Collector, DSConfig
from da3po_jax.train.engine import ContinuousEngine, RolloutEngine, StaticEngine
from da3po_jax.train.evaluation import HeldoutEval, check_group_by
from da3po_jax.train.logger import MetricsLogger
from da3po_jax.train.packing import PackConfig
from da3po_jax.train.rl_step import RLStepConfig, RLUpdate
from da3po_jax.train.rollout import PromptEncoder
from da3po_jax.train.setup import Datasets, generate_configs
from da3po_jax.train.signals import StopRequest
from da3po_jax.train.state import init_train_state, make_optimizer
from da3po_jax.train.trainer import RLTrainer, StepPerf


@dataclasses.dataclass
class RunContext:
    """What every stage of a run shares, built once from the config (`train/run.py`)."""

    cfg: object
    workdir: str
    tokenizer: Tokenizer
    encoder: PromptEncoder
    data: Datasets
    scorer: RewardScorer
    mesh: Mesh | None = None
    stop: StopRequest | None = None

    def replace(self, **changes) -> RunContext:
        return dataclasses.replace(self, **changes)


def rl_step_config(cfg) -> RLStepConfig:
    """The update's static settings from the config."""
    return RLStepConfig(
        group_size=cfg.rollout.group_size,
        mini_batch_prompts=cfg.rl.mini_batch_prompts,
        micro_batch_prompts=cfg.rl.micro_batch_prompts,
        num_iterations=cfg.rl.num_iterations,
        loss=config_lib.loss_config(cfg),
        adv=config_lib.advantage_config(cfg),
        daa=config_lib.daa_config(cfg),
        overlong=OverlongConfig(
            max_len=cfg.rollout.max_new_tokens,
            buffer_len=cfg.overlong.buffer,
            penalty=cfg.overlong.penalty,
            filter=cfg.overlong.filter,
        ),
        recompute_logp_old=cfg.rollout.logp_old == "recompute",
        opd=config_lib.opd_config(cfg),
        ra_opd=config_lib.ra_opd_config(cfg),
        pack=PackConfig(cfg.rl.pack_length, cfg.rl.pack_rows) if cfg.rl.packing else None,
    )


def collect_config(cfg, step_cfg: RLStepConfig) -> CollectConfig:
    """The collect stage's settings; the DAA rule decides what the carry tracks."""
    capacity, daa = cfg.rl.train_prompts, step_cfg.daa
    return CollectConfig(
        capacity=capacity,
        max_prompts=cfg.ds.max_prompts if cfg.ds.enable else capacity,
        ds=DSConfig(
            enable=bool(cfg.ds.enable),
            metric=cfg.ds.metric,
            group_size=step_cfg.group_size,
            overlong=step_cfg.overlong,
        ),
        prior_ema=cfg.daa.prior_ema,
        history_decay=cfg.daa.history_decay,
        use_prior=daa is not None and daa.uses_prior,
        track_history=daa is not None and daa.uses_history,
    )


def prompt_len_of(ctx: RunContext, problems) -> int:
    """The padded prompt length of `problems`' groups: the bucket of the longest."""
    longest = max(len(ctx.encoder.ids(p)) for p in problems)
    return pick_bucket(longest, ctx.cfg.rollout.prompt_buckets)


def static_engine(ctx: RunContext, graphdef, model_cfg, gen, **spec) -> StaticEngine:
    """A `StaticEngine` with its own `Sampler` (its cache freed by `release`)."""
    return StaticEngine(
        Sampler(graphdef, model_cfg, gen),
        ctx.encoder,
        ctx.scorer,
        gen,
        spec["prompt_len"],
        spec["index_of"],
        ctx.mesh,
        round_size=spec["round_size"],
    )


def continuous_engine(ctx: RunContext, graphdef, model_cfg, gen, **spec) -> ContinuousEngine:
    """A `ContinuousEngine` of `rollout.slots` slots (freed by `release`)."""
    r = ctx.cfg.rollout
    slots = SlotConfig(
        slots=r.slots,
        prompt_len=spec["prompt_len"],
        steps_per_call=r.steps_per_call,
        block=r.attention_block,
    )
    decoder = SlotDecoder(graphdef, model_cfg, gen, slots, ctx.mesh)
    return ContinuousEngine(
        decoder,
        ctx.encoder,
        ctx.scorer,
        spec["prompt_len"],
        spec["index_of"],
        ctx.mesh,
        max_in_flight=config_lib.surplus_capacity(ctx.cfg),
    )


# `rollout.engine` -> (context, graphdef, model config, sampling settings, *, prompt_len,
# round_size (static calls), index_of (dataset index of a problem id)) -> engine
ENGINES: dict[str, Callable[..., RolloutEngine]] = {
    "static": static_engine,
    "continuous": continuous_engine,
}


def make_engine(
    ctx: RunContext, graphdef, model_cfg, gen, problems, round_size: int, index_of=None
):
    """The configured engine for groups of `problems` (their longest prompt sets the
    prompt length); `round_size` prompts per static call."""
    return ENGINES[ctx.cfg.rollout.engine](
        ctx,
        graphdef,
        model_cfg,
        gen,
        prompt_len=prompt_len_of(ctx, problems),
        round_size=round_size,
        index_of=index_of or {},
    )


def build_trainer(
    ctx: RunContext,
    model: Transformer,
    teacher: Transformer | None = None,
    *,
    on_resumed: Callable[[], None] | None = None,
) -> RLTrainer:
    """The RL loop for `ctx.cfg`, its stages wired (see the module docstring). OPD /
    RA-OPD also take the frozen `teacher` (never updated, never checkpointed)."""
    cfg, mesh = ctx.cfg, ctx.mesh
    step_cfg = rl_step_config(cfg)
    if step_cfg.opd is not None and teacher is None:
        raise ValueError(f"algo={cfg.algo!r} needs the teacher model (config.teacher)")
    updates = cfg.rl.num_iterations * (cfg.rl.train_prompts // cfg.rl.mini_batch_prompts)
    tx, schedule = make_optimizer(cfg.optim, cfg.train.steps, updates)
    graphdef, state = init_train_state(model, tx, cfg.seed, mesh)
    update = RLUpdate(
        graphdef,
        tx,
        schedule,
        step_cfg,
        state_shardings=jax.tree.map(lambda x: x.sharding, state) if mesh else None,
        mesh=mesh,
        # a frozen copy: the policy's buffers are donated each step
        ref_params=jax.tree.map(jnp.copy, state.params) if cfg.loss.kl_coef > 0 else None,
        teacher=nnx.split(teacher) if teacher is not None else None,
    )
    gen, eval_gen = generate_configs(cfg, ctx.tokenizer)
    index_of = {p.id: i for i, p in enumerate(ctx.data.train)}
    engine = make_engine(
        ctx, graphdef, model.cfg, gen, ctx.data.train, config_lib.round_size(cfg), index_of
    )
    # every host walks the same global stream; each feeds its rows of every batch
    iterator = PromptIterator(ctx.data.train, seed=cfg.seed)
    collector = Collector(engine, iterator, collect_config(cfg, step_cfg), mesh)
    logger = MetricsLogger(
        ctx.workdir,
        enabled=jax.process_index() == 0,
        wandb_project=cfg.train.wandb_project,
        config=cfg.to_dict(),
    )
    return RLTrainer(
        cfg,
        state,
        collector.initial_carry(len(ctx.data.train)),
        collector,
        update,
        heldout_eval(ctx, graphdef, model.cfg, eval_gen, logger.write_samples),
        Checkpointer(ctx.workdir, cfg.train.keep_checkpoints, finite=("['train']",)),
        logger,
        stop=ctx.stop,
        on_resumed=on_resumed,
        perf=step_perf(cfg, model, teacher, engine, update, collector, mesh),
    )


def heldout_eval(
    ctx: RunContext, graphdef, model_cfg, gen: GenerateConfig, on_samples=None
) -> HeldoutEval:
    """The loop's periodic eval on the first `eval.max_prompts` held-out problems, through
    an engine of the configured kind (its memory freed after each eval), grouped by
    `eval.group_by`; `eval.log_samples` responses go to `on_samples(step, records)`."""
    cfg = ctx.cfg
    problems = ctx.data.heldout[: cfg.eval.max_prompts or None]
    if not problems:
        return HeldoutEval(None, [], cfg.seed)
    check_group_by(problems, cfg.eval.group_by)
    size = min(cfg.eval.prompts_per_call, len(problems))
    return HeldoutEval(
        make_engine(ctx, graphdef, model_cfg, gen, problems, size),
        problems,
        cfg.seed,
        by=cfg.eval.group_by,
        tokenizer=ctx.tokenizer,
        render=ctx.encoder.render,
        log_samples=cfg.eval.log_samples,
        on_samples=on_samples,
    )


def step_perf(cfg, model, teacher, engine: RolloutEngine, update: RLUpdate, collector, mesh):
    """Compile counts of the step's jitted functions, and the update's model FLOPs: the
    training passes plus the frozen forwards, over every row of the padded batch or,
    packed, over the real tokens of each sequence of the step's batch."""
    counts = perf.CompileCounts()
    counts.watch("update", update.fn)
    counts.watch("ds_round", collector.round_update)
    counts.watch("sampler", generate_with_cache)
    for name in ("admit_groups", "decode_steps"):
        counts.watch(name, count=lambda name=name: continuous.trace_counts().get(name, 0))
    rows = cfg.rl.train_prompts * cfg.rollout.group_size
    seq = engine.prompt_len + engine.max_new_tokens
    teacher_flops = perf.forward_flops(teacher.cfg, rows, seq) if teacher is not None else 0.0
    flops = perf.update_flops(
        model.cfg,
        rows,
        seq,
        num_iterations=cfg.rl.num_iterations,
        extra_forwards=update.forwards(),
        extra_flops=teacher_flops,
    )
    devices = mesh.size if mesh is not None else 1
    if update.cfg.pack is not None:
        padded = flops

        def flops() -> float:
            lens = update.last_lengths
            if lens is None:
                return padded
            fwd = perf.sequence_flops(model.cfg, lens)
            t = perf.sequence_flops(teacher.cfg, lens) if teacher is not None else 0.0
            return (cfg.rl.num_iterations * 3 + update.forwards()) * fwd + t

    return StepPerf(counts, flops, lambda: perf.peak_flops(cfg.model.dtype), devices)
