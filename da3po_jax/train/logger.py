"""Metrics to JSONL and TensorBoard (and W&B when configured), plots and a text summary.

Only process 0 writes; other hosts get a logger that does nothing.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


def _scalar(v: Any) -> float | None:
    try:
        f = float(np.asarray(v))
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


class _ThreadDeaths:
    """Exceptions that ended background threads, by thread (installed once, chained to
    the previous `threading.excepthook`): tensorboardX's writer thread dies on a failed
    write (a full disk), after which a put into its bounded queue would block forever."""

    errors: dict[int, BaseException] = {}
    _installed = False

    @classmethod
    def install(cls) -> None:
        if cls._installed:
            return
        cls._installed = True
        previous = threading.excepthook

        def hook(args):
            if args.thread is not None:
                cls.errors[args.thread.ident] = args.exc_value
            previous(args)

        threading.excepthook = hook


def _check_tensorboard(tb, logdir: str) -> None:
    """Raises instead of letting a write block on a dead tensorboardX writer thread."""
    writer = getattr(getattr(tb, "file_writer", None), "event_writer", None)
    worker = getattr(writer, "_worker", None)
    if worker is None or worker.is_alive():
        return
    cause = _ThreadDeaths.errors.get(worker.ident)
    raise OSError(
        f"the TensorBoard writer of {logdir!r} stopped"
        + (f": {type(cause).__name__}: {cause}" if cause else "")
    ) from cause


class MetricsLogger:
    """Appends one JSON line per `write` to `<workdir>/metrics.jsonl`; mirrors scalars to
    TensorBoard (`tensorboardX`) and W&B (if `wandb_project` is set)."""

    def __init__(
        self,
        workdir: str,
        enabled: bool = True,
        wandb_project: str = "",
        config: Mapping[str, Any] | None = None,
    ):
        self.enabled = enabled
        self.workdir = workdir
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._tb = self._wandb = None
        self._wandb_project, self._config = wandb_project, dict(config or {})
        self._opened = False
        if enabled and wandb_project:
            import wandb  # noqa: F401  (an explicit request: a missing package is an error)

    def _open(self) -> None:
        """Starts the writers at the first row (nothing is written before)."""
        self._opened = True
        os.makedirs(self.workdir, exist_ok=True)
        from tensorboardX import SummaryWriter  # a runtime dependency (pyproject.toml)

        _ThreadDeaths.install()
        # a queue far larger than a row's scalars: it never fills while the writer lives
        self._tb = SummaryWriter(os.path.join(self.workdir, "tensorboard"), max_queue=1024)
        if self._wandb_project:
            import wandb

            self._wandb = wandb.init(
                project=self._wandb_project,
                dir=self.workdir,
                config=self._config,
                id=_wandb_run_id(self.workdir, wandb),
                resume="allow",
            )

    def write(self, step: int, metrics: Mapping[str, Any], kind: str = "train") -> None:
        if not self.enabled:
            return
        if not self._opened:
            self._open()
        row = {"step": int(step), "kind": kind}
        row.update({k: _scalar(v) for k, v in metrics.items()})
        bad = sorted(k for k, v in row.items() if v is None and k in metrics)
        if bad:  # JSON has no NaN: written as null, and said so
            log.warning(
                "step %d: non-finite or non-numeric metrics %s (written as null)", step, bad
            )
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            logdir = os.path.join(self.workdir, "tensorboard")
            for k, v in row.items():
                if k not in ("step", "kind") and v is not None:
                    _check_tensorboard(self._tb, logdir)
                    self._tb.add_scalar(k.replace("@", "_at_"), v, step)
        if self._wandb is not None:
            # keys are already namespaced (reward/mean, eval/avg@k): logged as they are
            scalars = {k: v for k, v in row.items() if k not in ("step", "kind") and v is not None}
            self._wandb.log(scalars, step=step)

    def truncate(self, last_step: int) -> None:
        """Drops rows written after `last_step` (a resumed run rewrites them); only the
        process that writes the file touches it."""
        if self.enabled:
            truncate_metrics(self.path, last_step)

    def close(self) -> None:
        if self._tb is not None:
            try:  # closing a dead writer would block on its queue
                _check_tensorboard(self._tb, os.path.join(self.workdir, "tensorboard"))
                self._tb.close()
            except OSError as e:
                log.warning("TensorBoard events not closed: %s", e)
        if self._wandb is not None:
            self._wandb.finish()


def _wandb_run_id(workdir: str, wandb) -> str:
    """The W&B run id of this workdir, made once and kept in `<workdir>/wandb_id.txt`, so
    every restart of the run resumes the same W&B run instead of starting a new one."""
    path = os.path.join(workdir, "wandb_id.txt")
    if os.path.isfile(path):
        with open(path) as f:
            run_id = f.read().strip()
        if run_id:
            return run_id
    run_id = wandb.util.generate_id()
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(run_id + "\n")
    os.replace(tmp, path)
    return run_id


class MetricsFileError(ValueError):
    """metrics.jsonl has a malformed row that is not the torn last line of a kill."""


def read_metrics(path: str) -> list[dict[str, Any]]:
    """The rows of `path`. A torn final line (a process killed while writing it) is
    dropped with a warning; a malformed row elsewhere is an error naming file and line."""
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        lines = f.read().split("\n")
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    rows = []
    for j, (lineno, line) in enumerate(numbered):
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                raise ValueError("not a metrics row (an object with an integer 'step')")
        except ValueError as e:
            if j == len(numbered) - 1:  # the row being written when the run was killed
                log.warning("%s: dropping a torn last line %d (%s)", path, lineno, line[:80])
                break
            raise MetricsFileError(
                f"{path}: line {lineno} is not a metrics row ({e}); fix or remove that line"
            ) from e
        rows.append(row)
    return rows


def truncate_metrics(path: str, last_step: int) -> None:
    """Keeps the rows of steps up to `last_step` (a resumed run rewrites the later ones;
    -1 keeps none) and drops a torn last line."""
    if not os.path.exists(path):
        return
    rows = [r for r in read_metrics(path) if r["step"] <= last_step]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(tmp, path)


def plot_curves(metrics_path: str, out_png: str) -> str | None:
    """Reward / accuracy curves (train) and held-out accuracy by tier (eval) as one PNG."""
    rows = read_metrics(metrics_path)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for key in ("reward/mean", "reward/acc"):
        pts = [(r["step"], r[key]) for r in train if r.get(key) is not None]
        if pts:
            axes[0].plot(*zip(*pts), label=key)
    axes[0].set(title="training rollouts", xlabel="RL step")
    keys = sorted({k for r in evals for k in r if k.startswith("eval/avg@")})
    for key in keys:
        pts = [(r["step"], r[key]) for r in evals if r.get(key) is not None]
        if pts:
            axes[1].plot(*zip(*pts), marker="o", label=key.removeprefix("eval/"))
    axes[1].set(title="held-out accuracy", xlabel="RL step")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png
