"""Metrics to JSONL and TensorBoard (and W&B when configured), sampled responses, and
the curves redrawn after every eval (`runtime/curves.py`).

Only process 0 writes; other hosts get a logger that does nothing.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from da3po_jax.runtime.curves import plot_curves
from da3po_jax.runtime.metrics_file import truncate_metrics

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
        self.samples_path = os.path.join(workdir, "eval_samples.jsonl")
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

    def write_samples(self, step: int, records: Sequence[Mapping[str, Any]]) -> None:
        """Appends sampled responses (prompt, response, reference, verdict, ...; see
        `evaluation.sample_records`) to `<workdir>/eval_samples.jsonl`, one line each with
        its step, and shows them as TensorBoard text (`eval/samples`)."""
        if not self.enabled or not records:
            return
        if not self._opened:
            self._open()
        with open(self.samples_path, "a") as f:
            f.writelines(
                json.dumps({"step": int(step), **r}, ensure_ascii=False) + "\n" for r in records
            )
        if self._tb is not None:
            _check_tensorboard(self._tb, os.path.join(self.workdir, "tensorboard"))
            self._tb.add_text("eval/samples", samples_markdown(records), step)

    def plot(self) -> str | None:
        """Redraws `curves.png` next to `metrics.jsonl` (e.g. after every eval); a failed
        write is a warning, not the end of the run (the previous PNG stays whole)."""
        if not self.enabled:
            return None
        try:
            return plot_curves(self.path, os.path.join(self.workdir, "curves.png"))
        except OSError as e:
            log.warning("curves.png not written: %s", e)
            return None

    def truncate(self, last_step: int) -> None:
        """Drops rows (metrics and logged samples) written after `last_step` (a resumed
        run rewrites them); only the process that writes the files touches them."""
        if self.enabled:
            truncate_metrics(self.path, last_step)
            truncate_metrics(self.samples_path, last_step)

    def close(self) -> None:
        if self._tb is not None:
            try:  # closing a dead writer would block on its queue
                _check_tensorboard(self._tb, os.path.join(self.workdir, "tensorboard"))
                self._tb.close()
            except OSError as e:
                log.warning("TensorBoard events not closed: %s", e)
        if self._wandb is not None:
            self._wandb.finish()


def samples_markdown(records: Sequence[Mapping[str, Any]]) -> str:
    """Sampled responses as Markdown (TensorBoard's text tab): one section per response,
    its verdict in the heading, prompt and response as code blocks (kept verbatim)."""
    parts = []
    for r in records:
        verdict = "correct" if r.get("correct") else "wrong"
        parts.append(
            f"**{r.get('id', '')}** (sample {r.get('sample', 0)}): **{verdict}**, "
            f"reference `{r.get('reference', '')}`, {r.get('length', 0)} tokens"
            + (" (truncated)" if r.get("truncated") else "")
            + "\n\nprompt:\n\n    "
            + str(r.get("prompt", "")).replace("\n", "\n    ")
            + "\n\nresponse:\n\n    "
            + str(r.get("response", "")).replace("\n", "\n    ")
        )
    return "\n\n---\n\n".join(parts)


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
