"""`train(config, workdir)`: the one library call behind `python -m da3po_jax.main`.

Builds the run from a resolved config: tokenizer, policy (from a HF folder, an SFT warm
start cached in the workdir or `sft.out_dir`, or random init), the frozen teacher of
OPD / RA-OPD (a HF folder, built once by a longer SFT warm start when asked), data, reward
workers; then runs the SFT stage or the RL loop, writes plots and a summary, and exports
the final policy.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import shutil
import tempfile
from typing import Any

import jax
from flax import nnx
from ml_collections import config_dict

from da3po_jax.models import save_model
from da3po_jax.parallel import is_main_process, make_mesh, to_host
from da3po_jax.rewards import RewardScorer
from da3po_jax.train import config as config_lib
from da3po_jax.train.build import RunContext, build_trainer, make_engine
from da3po_jax.train.checkpoint import (
    Checkpointer,
    check_compatible,
    check_directory,
    tree_digest,
)
from da3po_jax.train.evaluation import evaluate
from da3po_jax.train.logger import MetricsLogger, plot_curves, read_metrics
from da3po_jax.train.rollout import PromptEncoder
from da3po_jax.train.setup import (
    generate_configs,
    install_tokenizer,
    load_datasets,
    policy_model,
    prompt_renderer,
    scorer_kwargs,
    tokenizer_dir,
    tokenizer_for,
)
from da3po_jax.train.sft import build_sft_arrays, run_sft
from da3po_jax.train.signals import stop_on_signals
from da3po_jax.train.state import init_train_state, make_optimizer
from da3po_jax.train.teacher import load_teacher
from da3po_jax.train.trainer import NonFiniteTraining, RLTrainer, fingerprint  # noqa: F401

log = logging.getLogger(__name__)


class _PendingLogs(logging.handlers.MemoryHandler):
    """The run's log records, held in memory until the run is accepted: nothing is written
    into a workdir whose run is then refused. `accept` creates the workdir, moves the tiny
    tokenizer in, writes config.json (atomically) and starts the log file with the
    records so far; `close` detaches the handlers at the end of the run."""

    def __init__(self):
        super().__init__(capacity=1 << 20, flushLevel=logging.CRITICAL + 1)
        self._file: logging.Handler | None = None
        ours = logging.getLogger("da3po_jax")
        if ours.level == logging.NOTSET or ours.level > logging.INFO:
            ours.setLevel(logging.INFO)  # the log file keeps INFO lines
        ours.addHandler(self)

    def shouldFlush(self, record) -> bool:
        return self.target is not None and super().shouldFlush(record)

    def accept(self, cfg, workdir: str, staging: str) -> None:
        if self._file is not None:
            return
        os.makedirs(workdir, exist_ok=True)
        install_tokenizer(cfg, workdir, staging)
        if is_main_process():
            path = os.path.join(workdir, "config.json")
            with open(path + ".tmp", "w") as f:
                json.dump(cfg.to_dict(), f, indent=2, default=str)
            os.replace(path + ".tmp", path)
        pid = jax.process_index()
        self._file = logging.FileHandler(
            os.path.join(workdir, f"log.{pid}.txt" if pid else "log.txt")
        )
        self._file.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        )
        ours = logging.getLogger("da3po_jax")
        self.setTarget(self._file)
        self.flush()
        ours.removeHandler(self)
        ours.addHandler(self._file)

    def close(self) -> None:
        ours = logging.getLogger("da3po_jax")
        ours.removeHandler(self)
        self.buffer.clear()
        if self._file is not None:
            ours.removeHandler(self._file)
            self._file.close()
        super().close()


def sft_warm_start(ctx: RunContext, model, out_dir: str, logs: str = "sft_logs"):
    """Supervised warm-up on the SFT split, exported to `out_dir` (reused when present).

    With `sft.stop_acc > 0` the warm-up stops at the first check (every `sft.check_every`
    steps) where the policy's accuracy at the rollout temperature on `sft.check_prompts`
    RL-training prompts reaches it: RL then starts in the regime where it can learn.

    The warm start is not checkpointed: on SIGTERM / SIGINT it stops after the current
    step and raises `Preempted` (nothing is exported; a rerun starts it again).
    """
    cfg = ctx.cfg
    arrays = build_sft_arrays(ctx.data.sft, ctx.tokenizer, ctx.encoder.render, cfg.sft.max_len)
    tx, _ = make_optimizer(
        cfg.optim,
        cfg.sft.steps,
        lr=cfg.sft.lr,
        warmup_steps=cfg.sft.warmup_steps,
        schedule="cosine",
        b2=0.98,
    )
    graphdef, state = init_train_state(model, tx, cfg.seed, ctx.mesh)
    logger = MetricsLogger(os.path.join(ctx.workdir, logs), enabled=jax.process_index() == 0)
    check = None
    if cfg.sft.stop_acc > 0 and ctx.data.train:
        check = _sft_stop_check(ctx, graphdef, model.cfg, logger)
    state = run_sft(
        graphdef,
        state,
        tx,
        arrays,
        cfg.sft.steps,
        cfg.sft.batch_size,
        cfg.seed,
        on_step=lambda i, m: logger.write(i, m, kind="sft") if i % 10 == 0 else None,
        check=check,
        check_every=cfg.sft.check_every,
        mesh=ctx.mesh,
        stop=ctx.stop,
    )
    model = nnx.merge(graphdef, state.params)
    export_policy(model, out_dir, tokenizer_dir(cfg, ctx.workdir))
    logger.plot()
    logger.close()
    return model


def _sft_stop_check(ctx: RunContext, graphdef, model_cfg, logger):
    cfg = ctx.cfg
    gen = generate_configs(cfg, ctx.tokenizer)[0].replace(num_samples=4)
    problems = ctx.data.train[: cfg.sft.check_prompts]
    engine = make_engine(ctx, graphdef, model_cfg, gen, problems, len(problems))

    def check(state, step: int) -> bool:
        rng = jax.random.PRNGKey(cfg.seed + step)
        metrics = evaluate(engine, state.params, problems, rng, "", f"SFT check at step {step}")
        acc = metrics["eval/avg@4"]
        logger.write(step, {"sft/check_acc": acc}, kind="sft")
        logger.plot()
        log.info(
            "SFT step %d: accuracy %.3f on %d training prompts (stop at %.2f)",
            step,
            acc,
            len(problems),
            cfg.sft.stop_acc,
        )
        return acc >= cfg.sft.stop_acc

    return check


def export_policy(model, out_dir: str, tokenizer_dir: str, *, overwrite: bool = True) -> None:
    """Writes `model` as a HF folder from process 0; with several processes every host
    takes part in gathering the sharded parameters first. The end of a run replaces its
    own export; `python -m da3po_jax.export` passes `overwrite` from its flag."""
    _, nonfinite = tree_digest(nnx.state(model, nnx.Param))
    bad = [f"{k} ({n} values)" for k, n in nonfinite.items() if n]
    if bad:
        raise NonFiniteTraining(
            f"not exporting to {out_dir!r}: non-finite parameters in {', '.join(bad[:5])}"
        )
    if jax.process_count() > 1:
        graphdef, params = nnx.split(model)
        model = nnx.merge(graphdef, jax.tree.map(to_host, params))
    if is_main_process():
        save_model(model, out_dir, tokenizer_dir=tokenizer_dir, overwrite=overwrite)


def train(config, workdir: str) -> dict[str, Any]:
    """Runs the configured stage in `workdir` (created; resumed when it holds a checkpoint).

    Every check that can refuse the run (config fields, the workdir's layout and
    checkpoints, data files, tokenizer and model files) runs before anything is written
    into `workdir`: a refused run leaves it as it was. On SIGTERM / SIGINT the RL loop
    saves a checkpoint after the step in progress and `Preempted` is raised.

    Returns:
      A summary: held-out accuracy before and after (by tier) and the workdir's files.
    """
    cfg = config_lib.resolve_config(config)
    workdir = os.path.abspath(workdir)
    pending = _PendingLogs()
    staging = tempfile.mkdtemp(prefix="da3po-staging-")
    try:
        _check_workdir(cfg, workdir)
        mesh = make_mesh(cfg.mesh.shape)
        log.info("mesh %s over %d devices", dict(mesh.shape), mesh.size)
        tokenizer = tokenizer_for(cfg, workdir, staging)
        data = load_datasets(cfg)
        log.info(
            "data: %d train, %d held-out, %d sft problems",
            len(data.train),
            len(data.heldout),
            len(data.sft),
        )
        encoder = PromptEncoder(
            tokenizer, prompt_renderer(cfg, tokenizer), cfg.rollout.prompt_buckets
        )
        model = None if cfg.stage == "sft" else _load_policy(cfg, workdir, tokenizer, mesh)
        _check_teacher_files(cfg)
        accept = lambda: pending.accept(cfg, workdir, staging)  # noqa: E731
        resuming = cfg.stage == "rl" and os.path.isdir(os.path.join(workdir, "checkpoints"))
        if not resuming or os.path.isdir(os.path.join(staging, "tokenizer")):
            accept()  # else once the checkpoint is restored: a damaged one may still refuse
        scorer = RewardScorer(**scorer_kwargs(cfg))
        try:
            with stop_on_signals() as stop:
                ctx = RunContext(cfg, workdir, tokenizer, encoder, data, scorer, mesh, stop)
                if cfg.stage == "sft":
                    return _sft_stage(ctx)
                return _rl_stage(ctx, model, accept)
        finally:
            scorer.close()
    finally:
        pending.close()
        shutil.rmtree(staging, ignore_errors=True)


def _rl_stage(ctx: RunContext, model, accept) -> dict[str, Any]:
    cfg = ctx.cfg
    distil = cfg.algo in config_lib.DISTILLATION
    if distil:
        _build_teacher(ctx)
    if model is None:
        model = _warm_start_policy(ctx)
    teacher, teacher_eval = None, {}
    if distil:
        probes = [ctx.encoder.render(p) for p in ctx.data.train[:2]]
        teacher = load_teacher(cfg, ctx.tokenizer, model, ctx.mesh, probes)
        if cfg.teacher.eval:
            teacher_eval = _teacher_eval(ctx, teacher)
    trainer = build_trainer(ctx, model, teacher, on_resumed=accept)
    try:
        evals = trainer.run()
    finally:
        trainer.close()
    if cfg.train.export_final:
        policy = nnx.merge(trainer.update.graphdef, trainer.state.params)
        final = os.path.join(ctx.workdir, "final_model")
        export_policy(policy, final, tokenizer_dir(cfg, ctx.workdir))
    return _finish(cfg, ctx.workdir, trainer, evals, teacher_eval)


def _check_workdir(cfg, workdir: str) -> None:
    """Refuses a workdir the run cannot use, before anything is written: a file where a
    folder must be, or checkpoints written by an incompatible configuration."""
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise NotADirectoryError(f"--workdir {workdir!r} exists and is not a folder")
    check_directory(os.path.join(workdir, "checkpoints"), "checkpoints")
    for name in ("metrics.jsonl", "config.json", "summary.json"):
        if os.path.isdir(os.path.join(workdir, name)):
            raise IsADirectoryError(f"{os.path.join(workdir, name)!r} is a folder, not a file")
    if cfg.stage == "sft" or not os.path.isdir(os.path.join(workdir, "checkpoints")):
        return
    checkpointer = Checkpointer(workdir, cfg.train.keep_checkpoints)
    try:
        newest = checkpointer.newest_host()
    finally:
        checkpointer.close()
    if newest is not None:
        check_compatible(newest[1].get("config", {}), fingerprint(cfg), checkpointer.directory)
    read_metrics(os.path.join(workdir, "metrics.jsonl"))  # a malformed row is named now


def _check_teacher_files(cfg) -> None:
    """A teacher folder that exists must hold a model (one to be built may be absent)."""
    t = cfg.teacher
    if cfg.algo not in config_lib.DISTILLATION or not t.path or not os.path.exists(t.path):
        return
    if not os.path.isfile(os.path.join(t.path, "config.json")) and not t.sft_steps:
        raise FileNotFoundError(
            f"teacher folder {t.path!r} has no config.json (config.teacher.path)"
        )


def _load_policy(cfg, workdir, tokenizer, mesh):
    """The initial policy when it can be read from a folder (`model.init_checkpoint`, a
    cached SFT warm start, `model.path`) or built at random; None when an SFT warm start
    must train it first."""
    if cfg.model.init_checkpoint:
        return policy_model(cfg, tokenizer, cfg.model.init_checkpoint, mesh)
    if not cfg.sft.enable:
        return policy_model(cfg, tokenizer, mesh=mesh)
    sft_dir = cfg.sft.out_dir or os.path.join(workdir, "sft_model")
    if os.path.isfile(os.path.join(sft_dir, "config.json")):
        log.info("warm start: reusing %s", sft_dir)
        return policy_model(cfg, tokenizer, sft_dir, mesh)
    return None


def _warm_start_policy(ctx: RunContext):
    cfg = ctx.cfg
    sft_dir = cfg.sft.out_dir or os.path.join(ctx.workdir, "sft_model")
    log.info("warm start: %d SFT steps (cached in %s)", cfg.sft.steps, sft_dir)
    model = policy_model(cfg, ctx.tokenizer, mesh=ctx.mesh)
    return sft_warm_start(ctx, model, sft_dir)


def _build_teacher(ctx: RunContext) -> None:
    """Builds a missing `teacher.path` by an SFT warm start of `teacher.sft_steps` steps
    (stopping at `teacher.sft_stop_acc`): the tiny demo's teacher is the student's model
    trained longer. Built once and reused by every run that points at the folder."""
    t = ctx.cfg.teacher
    if t.path and t.sft_steps and not os.path.isfile(os.path.join(t.path, "config.json")):
        log.info("teacher: building %s by up to %d SFT steps", t.path, t.sft_steps)
        build = ctx.cfg.as_configdict()
        build.sft.steps, build.sft.stop_acc = t.sft_steps, t.sft_stop_acc
        build = ctx.replace(cfg=config_dict.FrozenConfigDict(build))
        model = policy_model(build.cfg, ctx.tokenizer, mesh=ctx.mesh)
        sft_warm_start(build, model, t.path, "teacher_logs")


def _teacher_eval(ctx: RunContext, teacher) -> dict[str, float]:
    """The teacher's held-out accuracy (the level OPD pulls the student towards), computed
    once per workdir and cached in `teacher_eval.json`."""
    path = os.path.join(ctx.workdir, "teacher_eval.json")
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    metrics = _heldout_eval(ctx, teacher, "teacher eval")
    k = ctx.cfg.eval.num_samples
    log.info("teacher held-out avg@%d: %.3f", k, metrics.get(f"eval/avg@{k}", float("nan")))
    if is_main_process():
        with open(path, "w") as f:
            json.dump(metrics, f, indent=2)
    return metrics


def _heldout_eval(ctx: RunContext, model, desc: str = "eval") -> dict[str, float]:
    cfg = ctx.cfg
    if not ctx.data.heldout:
        return {}
    graphdef, params = nnx.split(model)
    gen = generate_configs(cfg, ctx.tokenizer)[1]
    problems = ctx.data.heldout[: cfg.eval.max_prompts or None]
    size = min(cfg.eval.prompts_per_call, len(problems))
    engine = make_engine(ctx, graphdef, model.cfg, gen, problems, size)
    rng = jax.random.PRNGKey(cfg.seed + 1)
    return evaluate(engine, params, problems, rng, cfg.eval.group_by, desc)


def _sft_stage(ctx: RunContext) -> dict[str, Any]:
    cfg = ctx.cfg
    out_dir = cfg.sft.out_dir or os.path.join(ctx.workdir, "sft_model")
    model = sft_warm_start(ctx, policy_model(cfg, ctx.tokenizer, mesh=ctx.mesh), out_dir)
    summary: dict[str, Any] = {"sft_model": out_dir}
    if ctx.data.heldout:
        summary["eval"] = _heldout_eval(ctx, model)
        log.info("SFT held-out: %s", summary["eval"])
    return summary


def _finish(cfg, workdir: str, trainer: RLTrainer, evals, teacher_eval=None) -> dict[str, Any]:
    summary: dict[str, Any] = {"algo": cfg.algo, "steps": int(trainer.state.step)}
    if teacher_eval:
        summary["teacher"] = teacher_eval
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    all_evals = [r for r in read_metrics(metrics_path) if r["kind"] == "eval"]
    if all_evals:
        summary["before"] = {k: v for k, v in all_evals[0].items() if k.startswith("eval/")}
        summary["after"] = {k: v for k, v in all_evals[-1].items() if k.startswith("eval/")}
    if jax.process_index() == 0:
        summary["plot"] = plot_curves(metrics_path, os.path.join(workdir, "curves.png"))
        with open(os.path.join(workdir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        _print_summary(cfg, summary)
    return summary


def _print_summary(cfg, summary: dict[str, Any]) -> None:
    k = cfg.eval.num_samples
    before, after = summary.get("before", {}), summary.get("after", {})
    lines = [f"{cfg.algo}: {summary['steps']} RL steps; held-out avg@{k} before -> after"]
    for key in sorted(after):
        if key.startswith(f"eval/avg@{k}"):
            lines.append(f"  {key:<24} {before.get(key, float('nan')):.3f} -> {after[key]:.3f}")
    teacher = summary.get("teacher", {})
    if f"eval/avg@{k}" in teacher:
        lines.append(f"  teacher eval/avg@{k}: {teacher[f'eval/avg@{k}']:.3f}")
    print("\n".join(lines))
