"""Held-out evaluation of a checkpoint:
`python -m da3po_jax.eval --checkpoint=WORKDIR[/STEP] [--config=configs/x.py]`.

`--checkpoint` is a training run's folder (its newest checkpoint), one of its steps
(`WORKDIR/checkpoints/N` or `WORKDIR/N`), or a Hugging Face model folder. Of a run's
checkpoint only the policy's parameters are read (never the optimizer state), sharded
over the config's mesh; the architecture and tokenizer are the run's own. The held-out
problems, the prompt template, k (`eval.num_samples`), the sampling settings, the rollout
engine and the verifier come from `--config` (default for a run: the run's own
config.json; a Hugging Face folder needs one), with `--config.<field>=value` overrides.

The sampling keys are those of the training loop's eval at the same step (a model folder:
step 0), so a run's checkpoint evaluated with the run's own config reproduces the eval
the run logged at that step.

Writes `--out` (default `WORKDIR/eval/step_N`, or `FOLDER/eval` for a model folder):
`report.json` (avg@k and pass@k overall and by `--group_by`, lengths, the checkpoint,
settings and timing) and `samples.jsonl` (every response: prompt, response, reference,
verdict, reward, length), and prints the table. An existing non-empty `--out` is replaced
only with `--overwrite`.

Exit status: 0 once the report is written; 1 on an error, whose traceback is followed by
one last line `da3po_jax: error: ...` naming the problem.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from absl import app, flags
from ml_collections import config_flags

from da3po_jax.cli import setup_logging

if TYPE_CHECKING:  # the command imports the package's layers when it runs
    from da3po_jax.config import Settings

log = logging.getLogger("da3po_jax.eval")


class EvalError(ValueError):
    """The evaluation cannot run as asked; nothing was written."""


@dataclasses.dataclass(frozen=True)
class Source:
    """What `--checkpoint` names: a run (`workdir`, `step` None = newest) or a Hugging
    Face model `folder`."""

    workdir: str = ""
    step: int | None = None
    folder: str = ""


def resolve_checkpoint(path: str) -> Source:
    """Reads `--checkpoint`: a run's folder, one of its steps, or a model folder."""
    path = os.path.abspath(path)
    parent, name = os.path.split(path)
    if name.isdigit() and os.path.basename(parent) == "checkpoints" and os.path.isdir(parent):
        return Source(workdir=os.path.dirname(parent), step=int(name))  # kept or not
    if not os.path.isdir(path):
        raise EvalError(f"--checkpoint {path!r} does not exist or is not a folder")
    if os.path.isdir(os.path.join(path, "checkpoints")):
        return Source(workdir=path)
    files = os.listdir(path)
    if "config.json" in files and any(f.endswith(".safetensors") for f in files):
        return Source(folder=path)
    raise EvalError(
        f"--checkpoint {path!r} is neither a training run's folder (with checkpoints/), "
        "one of its steps (WORKDIR/checkpoints/N or WORKDIR/N) nor a Hugging Face model "
        "folder (config.json and *.safetensors)"
    )


def _step_shorthand(path: str) -> str:
    """`WORKDIR/N` (a step of the run in WORKDIR) as `WORKDIR/checkpoints/N`."""
    parent, name = os.path.split(os.path.abspath(path))
    if name.isdigit() and os.path.isdir(os.path.join(parent, "checkpoints")):
        return os.path.join(parent, "checkpoints", name)
    return path


def eval_config(config, source: Source, dtype: str = "", group_by: str | None = None):
    """The settings the evaluation follows: `config`'s, else the run's own; with `dtype`
    and `group_by` (the flags) set on them."""
    from da3po_jax.config import resolve_settings
    from da3po_jax.run.saved_run import read_run_config

    if config is None:
        if not source.workdir:
            raise EvalError("--config is required to evaluate a Hugging Face model folder")
        config = read_run_config(source.workdir)
    values = config.to_dict()
    if dtype:
        values["model"]["param_dtype"] = values["model"]["dtype"] = dtype
    if group_by is not None:
        values["eval"]["group_by"] = group_by
    if source.folder:
        values["model"]["path"] = source.folder
    return resolve_settings(values)


def _check_out(out: str, source: Source, overwrite: bool) -> None:
    """`saved_run.check_out`'s refusals, as this command's error."""
    from da3po_jax.run.saved_run import SavedRunError, check_out

    try:
        check_out(out, source.workdir or source.folder, overwrite, own=default_out(source))
    except SavedRunError as e:
        raise EvalError(str(e)) from None


def default_out(source: Source, step: int | None = None) -> str:
    """Where the report goes by default: `FOLDER/eval`, `WORKDIR/eval/step_N` (without
    `step`, the folder of every step's report: the one place in a run eval may write)."""
    if source.folder:
        return os.path.join(source.folder, "eval")
    if step is None:
        return os.path.join(source.workdir, "eval")
    return os.path.join(source.workdir, "eval", f"step_{step}")


def load_policy(settings: Settings, source: Source, mesh, dtype: str = ""):
    """(step, tokenizer, policy) of `source`, sharded over `mesh`; step None for a folder.
    A folder loads in the settings' model dtypes (which `dtype` has set), a run's
    checkpoint in the run's own unless `dtype` is given."""
    from da3po_jax.models.tokenizer import Tokenizer
    from da3po_jax.run.inputs import policy_model, tokenizer_dir
    from da3po_jax.run.saved_run import read_run_config, restore_policy

    if source.folder:
        tokenizer = Tokenizer.load(settings.tokenizer.path or source.folder)
        log.info("loading %s", source.folder)
        policy = policy_model(
            settings.model, tokenizer, seed=settings.seed, path=source.folder, mesh=mesh
        )
        return None, tokenizer, policy
    run = read_run_config(source.workdir)
    tokenizer = Tokenizer.load(tokenizer_dir(run, source.workdir))
    step, policy = restore_policy(run, source.workdir, source.step, mesh, dtype)
    return step, tokenizer, policy


def run_eval(
    config, checkpoint: str, out: str = "", *, dtype: str = "", group_by=None, overwrite=False
) -> dict[str, Any]:
    """Evaluates `checkpoint` (see the module docstring); returns the report written to
    `<out>/report.json`.

    Every refusal (bad `checkpoint`, no held-out problems, an unknown group field, `out`
    in the way) comes before anything is written."""
    from da3po_jax.parallel import is_main_process, make_mesh
    from da3po_jax.run.evaluation import check_group_by, sample_records, suite_table
    from da3po_jax.run.inputs import load_datasets
    from da3po_jax.run.saved_run import flag_path

    source = resolve_checkpoint(_step_shorthand(flag_path("checkpoint", checkpoint)))
    settings = eval_config(config, source, dtype, group_by)
    data = load_datasets(settings.data, settings.seed, settings.eval_suites)
    problems = data.heldout[: settings.eval.max_prompts or None]
    problems += [p for s in data.suites for p in s.problems]
    if not problems:
        raise EvalError(
            "the config has no held-out problems (data.eval_path / synthetic_eval) and no "
            "eval.suites"
        )
    check_group_by(problems, settings.eval.group_by)
    if out:
        _check_out(os.path.abspath(out), source, overwrite)
    mesh = make_mesh(settings.mesh.shape)
    t0 = time.perf_counter()
    step, tokenizer, policy = load_policy(settings, source, mesh, dtype)
    out = os.path.abspath(out or default_out(source, step))
    _check_out(out, source, overwrite)
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    metrics, rows, sets, render = _generate(settings, out, tokenizer, data, mesh, policy, step)
    seconds = time.perf_counter() - t1
    report = {
        "checkpoint": source.folder or source.workdir,
        "step": step,
        "k": settings.eval.num_samples,
        "group_by": settings.eval.group_by,
        "num_prompts": sum(len(s.problems) for s in sets),
        "heldout": any(not s.name for s in sets),
        "suites": suite_table(metrics, sets),
        "metrics": metrics,
        "settings": _report_settings(settings, policy, mesh),
        "seconds": {"load": round(load_s, 3), "generate_and_score": round(seconds, 3)},
        "out": out,
    }
    if is_main_process():
        write_report(out, report, sample_records(rows, tokenizer, render))
    return report


def _generate(settings: Settings, out: str, tokenizer, data, mesh, policy, step):
    """(metrics, every evaluated problem's `EvalRow` with its tokens, the sets evaluated,
    the prompt renderer): each set sampled with the keys of the training loop's eval at
    `step` (a model folder: step 0)."""
    import jax
    from flax import nnx

    from da3po_jax.run.build import eval_runs
    from da3po_jax.run.context import open_context
    from da3po_jax.run.evaluation import evaluate_sets
    from da3po_jax.run.inputs import generate_configs
    from da3po_jax.run.validate import usable_prompts

    gen = generate_configs(settings, tokenizer)[1]
    with open_context(settings, out, tokenizer, data, mesh) as ctx:
        # prompts longer than the largest bucket skipped (and named), as the run skips them
        ctx = ctx.replace(data=usable_prompts(ctx.data, ctx.encoder))
        graphdef, params = nnx.split(policy)
        runs = eval_runs(ctx, graphdef, policy.config, gen)
        for s, _ in runs:
            log.info(
                "evaluating %s: %d prompts x %d samples on %d devices",
                s.title,
                len(s.problems),
                s.k,
                mesh.size,
            )
        rng = jax.random.fold_in(jax.random.PRNGKey(settings.seed + 1), step or 0)
        metrics, rows_of = evaluate_sets(
            runs, params, rng, settings.eval.group_by, keep_samples=True, desc="eval"
        )
        rows = [row for s, _ in runs for row in rows_of[s.name]]
        return metrics, rows, [s for s, _ in runs], ctx.encoder.render


def _report_settings(settings: Settings, policy, mesh) -> dict[str, Any]:
    """The settings that decide the report's numbers."""
    return {
        "temperature": settings.eval.temperature,
        "top_p": settings.eval.top_p,
        "max_new_tokens": settings.eval_max_new_tokens,
        "param_dtype": policy.config.param_dtype,
        "dtype": policy.config.dtype,
        "mesh": dict(mesh.shape),
        "verifier": settings.reward.verifier,
        "template": settings.data.template,
    }


def write_report(out: str, report: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """`report.json` and `samples.jsonl` in `out`, each written whole then renamed (a
    reader never sees half a file)."""
    os.makedirs(out, exist_ok=True)
    for name, text in (
        ("samples.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)),
        ("report.json", json.dumps(report, indent=2) + "\n"),
    ):
        path = os.path.join(out, name)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)


def format_report(report: dict[str, Any]) -> str:
    """The table printed at the end: avg@k and pass@k of the held-out set, overall and per
    group, then one row per suite with their average (`format_suite_table`)."""
    from da3po_jax.run.evaluation import format_suite_table

    step = report["step"]
    where = report["checkpoint"] + (f" (step {step})" if step is not None else "")
    lines = _heldout_lines(report, where) if report.get("heldout", True) else []
    suites = report.get("suites")
    if suites:
        count = sum(r["num_prompts"] for r in suites[:-1])
        lines += [f"{where}: {len(suites) - 1} eval suites, {count} prompts"]
        lines.append(format_suite_table(suites))
    lines.append(f"  report: {report['out']}")
    return "\n".join(lines)


def _heldout_lines(report: dict[str, Any], where: str) -> list[str]:
    """The held-out set's rows of the printed table."""
    k, m = report["k"], report["metrics"]
    n = int(m["eval/num_prompts"])
    lines = [f"{where}: {n} prompts x {k} samples", f"  {'':<20} avg@{k:<5} pass@{k}"]
    names = [""] + sorted(key.split("/", 2)[2] for key in m if key.startswith(f"eval/avg@{k}/"))
    for name in names:
        suffix = f"/{name}" if name else ""
        avg, passed = m[f"eval/avg@{k}{suffix}"], m[f"eval/pass@{k}{suffix}"]
        lines.append(f"  {name or 'all':<20} {avg:<9.3f} {passed:.3f}")
    lines.append(
        f"  mean response {m['eval/response_len']:.1f} tokens, "
        f"{100 * m['eval/truncated_frac']:.1f}% truncated"
    )
    return lines


def define_flags() -> dict[str, Any]:
    """The command's flags, defined when it runs (`python -m da3po_jax.eval`), not when
    the module is imported: the library functions can be imported next to other entry
    points that define flags of the same names."""
    return {
        "config": config_flags.DEFINE_config_file(
            "config",
            None,
            "Config file giving the held-out data, k, sampling and verifier settings "
            "(default for a run's checkpoint: the run's own config.json). Overrides: "
            "--config.<field>=value, e.g. --config.eval.num_samples=16.",
            lock_config=True,
        ),
        "checkpoint": flags.DEFINE_string(
            "checkpoint",
            None,
            "A run's folder (newest checkpoint), WORKDIR/checkpoints/N or WORKDIR/N "
            "(step N), or a Hugging Face model folder.",
            required=True,
        ),
        "out": flags.DEFINE_string(
            "out", "", "Report folder (default: WORKDIR/eval/step_N, or FOLDER/eval)."
        ),
        "group_by": flags.DEFINE_string(
            "group_by",
            None,
            "Report avg@k / pass@k per 'tier', 'source' or a dataset field (default: the "
            "config's eval.group_by); '' = overall only.",
        ),
        "dtype": flags.DEFINE_enum(
            "dtype",
            "",
            ["", "float32", "bfloat16"],
            "Parameter and compute dtype (default: a run's own; for a model folder, the "
            "config's model.param_dtype / model.dtype).",
        ),
        "overwrite": flags.DEFINE_bool("overwrite", False, "Replace a non-empty --out."),
    }


def main(argv: list[str], f: dict[str, Any]) -> None:
    """The command: the report's table on stdout; exit status 1 and a last stderr line
    naming the problem on any error."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from da3po_jax.runtime.signals import run_reporting_errors  # after flags: fast --help

    setup_logging()

    def run() -> None:
        report = run_eval(
            f["config"].value,
            f["checkpoint"].value,
            f["out"].value,
            dtype=f["dtype"].value,
            group_by=f["group_by"].value,
            overwrite=f["overwrite"].value,
        )
        print(format_report(report))

    code = run_reporting_errors(run)
    if code is not None:
        sys.stdout.flush()
        sys.exit(code)


if __name__ == "__main__":
    _flags = define_flags()
    app.run(lambda argv: main(argv, _flags))
