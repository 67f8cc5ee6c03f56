"""The training job, `train(config, workdir)`: the one library call behind
`python -m da3po_jax.main`.

Builds the run from its settings: tokenizer, policy (from a HF folder, an SFT warm start
cached in the workdir or `sft.out_dir`, or random init), the frozen teacher of OPD /
RA-OPD (a HF folder, built once by a longer SFT warm start when asked), data, reward
workers; then runs the SFT stage or the RL loop, writes plots and a summary, and exports
the final policy.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from typing import Any

import jax
from flax import nnx

from da3po_jax.config import Settings, resolve_settings
from da3po_jax.parallel import is_main_process, make_mesh
from da3po_jax.rollout import PromptEncoder
from da3po_jax.run.build import build_trainer, eval_runs, eval_sets
from da3po_jax.run.context import RunContext, open_context
from da3po_jax.run.evaluation import evaluate_sets, format_suite_table, suite_table
from da3po_jax.run.inputs import (
    generate_configs,
    load_datasets,
    policy_model,
    prompt_renderer,
    tokenizer_dir,
    tokenizer_for,
)
from da3po_jax.run.loop import RLTrainer
from da3po_jax.run.saved_run import export_policy
from da3po_jax.run.teacher import build_teacher, load_teacher
from da3po_jax.run.validate import usable_prompts, validate_run, workdir_path
from da3po_jax.run.warm_start import sft_warm_start
from da3po_jax.run.workdir import PendingLogs, locked_workdir, sft_dir
from da3po_jax.runtime.curves import plot_curves
from da3po_jax.runtime.metrics_file import read_metrics
from da3po_jax.runtime.signals import stop_on_signals

log = logging.getLogger(__name__)


def train(config, workdir: str) -> dict[str, Any]:
    """Runs the configured stage in `workdir` (created; resumed when it holds a checkpoint).

    Every check that can refuse the run (config fields, the workdir's layout and
    checkpoints, data files, devices, tokenizer, teacher and model files: the order is in
    `run/validate.py`) runs before anything is written into `workdir`: a refused run leaves
    it as it was. Process 0 then holds the workdir's lock (`run.lock`) until the run ends:
    a second run on the same workdir is refused, naming the holder. On SIGTERM / SIGINT
    the RL loop saves a checkpoint after the step in progress and `Preempted` is raised.

    Args:
      config: an ml_collections config of `configs/base.py`'s form (resolved here).

    Returns:
      A summary: held-out accuracy before and after (by tier) and the workdir's files.
    """
    settings = resolve_settings(config)
    workdir = workdir_path(workdir)
    pending = PendingLogs()
    staging = tempfile.mkdtemp(prefix="da3po-staging-")
    try:
        mesh = make_mesh(settings.mesh.shape)
        log.info("mesh %s over %d devices", dict(mesh.shape), mesh.size)
        tokenizer = tokenizer_for(settings, workdir, staging)
        encoder = PromptEncoder(
            tokenizer, prompt_renderer(settings, tokenizer), settings.rollout.buckets
        )
        loaded = load_datasets(settings.data, settings.seed, settings.eval_suites)
        data = usable_prompts(loaded, encoder)
        log.info(
            "data: %d train, %d held-out, %d sft problems; %d eval suites",
            len(data.train),
            len(data.heldout),
            len(data.sft),
            len(data.suites),
        )
        validate_run(settings, workdir, mesh, tokenizer, data, encoder)
        model = (
            None if settings.stage == "sft" else _load_policy(settings, workdir, tokenizer, mesh)
        )
        accept = lambda: pending.accept(settings, workdir, staging)  # noqa: E731
        resuming = settings.stage == "rl" and os.path.isdir(os.path.join(workdir, "checkpoints"))
        with locked_workdir(workdir):
            if not resuming or os.path.isdir(os.path.join(staging, "tokenizer")):
                accept()  # else once the checkpoint is restored: a damaged one may refuse
            with (
                open_context(settings, workdir, tokenizer, data, mesh, encoder) as ctx,
                stop_on_signals() as stop,
            ):
                ctx = ctx.replace(stop=stop)
                if settings.stage == "sft":
                    return _sft_stage(ctx)
                return _rl_stage(ctx, model, accept)
    finally:
        pending.close()
        shutil.rmtree(staging, ignore_errors=True)


def _rl_stage(ctx: RunContext, model, accept) -> dict[str, Any]:
    settings = ctx.settings
    if settings.distillation:
        build_teacher(ctx)
    if model is None:
        model = _warm_start_policy(ctx)
    teacher, teacher_eval = None, {}
    if settings.distillation:
        probes = [ctx.encoder.render(p) for p in ctx.data.train[:2]]
        teacher = load_teacher(settings, ctx.tokenizer, model, ctx.mesh, probes)
        if settings.teacher.eval:
            teacher_eval = _teacher_eval(ctx, teacher)
    trainer = build_trainer(ctx, model, teacher, on_resumed=accept)
    try:
        trainer.run()
    finally:
        trainer.close()
    if settings.train.export_final:
        policy = nnx.merge(trainer.update.graphdef, trainer.state.params)
        final = os.path.join(ctx.workdir, "final_model")
        export_policy(policy, final, tokenizer_dir(settings, ctx.workdir))
    return _finish(settings, ctx, trainer, teacher_eval)


def _load_policy(settings: Settings, workdir: str, tokenizer, mesh):
    """The initial policy when it can be read from a folder (`model.init_checkpoint`, a
    cached SFT warm start, `model.path`) or built at random; None when an SFT warm start
    must train it first."""
    if settings.model.init_checkpoint:
        return policy_model(
            settings.model,
            tokenizer,
            seed=settings.seed,
            path=settings.model.init_checkpoint,
            mesh=mesh,
        )
    if not settings.sft.enable:
        return policy_model(settings.model, tokenizer, seed=settings.seed, mesh=mesh)
    cached = sft_dir(settings, workdir)
    if os.path.isfile(os.path.join(cached, "config.json")):
        log.info("warm start: reusing %s", cached)
        return policy_model(settings.model, tokenizer, seed=settings.seed, path=cached, mesh=mesh)
    return None


def _warm_start_policy(ctx: RunContext):
    settings = ctx.settings
    out = sft_dir(settings, ctx.workdir)
    log.info("warm start: %d SFT steps (cached in %s)", settings.sft.steps, out)
    model = policy_model(settings.model, ctx.tokenizer, seed=settings.seed, mesh=ctx.mesh)
    return sft_warm_start(ctx, model, out)


def _teacher_eval(ctx: RunContext, teacher) -> dict[str, float]:
    """The teacher's held-out accuracy (the level OPD pulls the student towards), computed
    once per workdir and cached in `teacher_eval.json`."""
    path = os.path.join(ctx.workdir, "teacher_eval.json")
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    metrics = _heldout_eval(ctx, teacher, "teacher eval")
    k = ctx.settings.eval.num_samples
    log.info("teacher held-out avg@%d: %.3f", k, metrics.get(f"eval/avg@{k}", float("nan")))
    if is_main_process():
        with open(path, "w") as f:
            json.dump(metrics, f, indent=2)
    return metrics


def _heldout_eval(ctx: RunContext, model, desc: str = "eval") -> dict[str, float]:
    """`model`'s metrics on every set the run evaluates (`build.eval_runs`)."""
    settings = ctx.settings
    graphdef, params = nnx.split(model)
    gen = generate_configs(settings, ctx.tokenizer)[1]
    runs = eval_runs(ctx, graphdef, model.config, gen)
    rng = jax.random.PRNGKey(settings.seed + 1)
    return evaluate_sets(runs, params, rng, settings.eval.group_by, desc=desc)[0]


def _sft_stage(ctx: RunContext) -> dict[str, Any]:
    settings = ctx.settings
    out = sft_dir(settings, ctx.workdir)
    model = policy_model(settings.model, ctx.tokenizer, seed=settings.seed, mesh=ctx.mesh)
    model = sft_warm_start(ctx, model, out)
    summary: dict[str, Any] = {"sft_model": out}
    if ctx.data.heldout or ctx.data.suites:
        summary["eval"] = _heldout_eval(ctx, model)
        log.info("SFT held-out: %s", summary["eval"])
    return summary


def _finish(settings: Settings, ctx: RunContext, trainer: RLTrainer, teacher_eval=None):
    """summary.json: the first and last evals (and the suites' tables of each, one row per
    benchmark), the teacher's eval and the curves' file; printed as a short table."""
    workdir = ctx.workdir
    summary: dict[str, Any] = {"algo": settings.algo, "steps": int(trainer.state.step)}
    if teacher_eval:
        summary["teacher"] = teacher_eval
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    all_evals = [r for r in read_metrics(metrics_path) if r["kind"] == "eval"]
    if all_evals:
        summary["before"] = {k: v for k, v in all_evals[0].items() if k.startswith("eval/")}
        summary["after"] = {k: v for k, v in all_evals[-1].items() if k.startswith("eval/")}
        sets = eval_sets(ctx)
        tables = {when: suite_table(summary[when], sets) for when in ("before", "after")}
        if tables["after"]:
            summary["suites"] = {
                when: {"step": row["step"], "table": tables[when]}
                for when, row in (("before", all_evals[0]), ("after", all_evals[-1]))
            }
    if is_main_process():
        summary["plot"] = plot_curves(metrics_path, os.path.join(workdir, "curves.png"))
        with open(os.path.join(workdir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        _print_summary(settings, summary)
    return summary


def _print_summary(settings: Settings, summary: dict[str, Any]) -> None:
    k = settings.eval.num_samples
    before, after = summary.get("before", {}), summary.get("after", {})
    lines = [f"{settings.algo}: {summary['steps']} RL steps; held-out avg@{k} before -> after"]
    for key in sorted(after):
        if key.startswith(f"eval/avg@{k}"):
            lines.append(f"  {key:<24} {before.get(key, float('nan')):.3f} -> {after[key]:.3f}")
    teacher = summary.get("teacher", {})
    if f"eval/avg@{k}" in teacher:
        lines.append(f"  teacher eval/avg@{k}: {teacher[f'eval/avg@{k}']:.3f}")
    for when, suites in summary.get("suites", {}).items():
        table = format_suite_table(suites["table"])
        lines += [f"eval suites {when} (step {suites['step']}):", table]
    print("\n".join(lines))
