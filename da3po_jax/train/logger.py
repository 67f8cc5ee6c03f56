"""Metrics to JSONL and TensorBoard (and W&B when configured), plots and a text summary.

Only process 0 writes; other hosts get a logger that does nothing.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

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


class CurvePanel(NamedTuple):
    """One panel of `curves.png`: the metric keys it draws, from rows of the given kinds.

    A key ending in `*` stands for every key with that prefix (the held-out avg@k overall
    and per tier); among those, a key with no further `/` (the overall value) is drawn
    thicker than its per-tier siblings.
    """

    title: str
    keys: tuple[str, ...]
    kinds: tuple[str, ...]


CURVE_PANELS: tuple[CurvePanel, ...] = (
    CurvePanel("training rollouts: reward / accuracy", ("reward/mean", "reward/acc"), ("train",)),
    CurvePanel("held-out avg@k", ("eval/avg@*",), ("eval",)),
    CurvePanel("loss", ("loss/total", "loss/pg", "sft/loss"), ("train", "sft")),
    CurvePanel("KL", ("loss/approx_kl", "loss/kl_ref", "opd/reverse_kl"), ("train",)),
    CurvePanel("entropy", ("loss/entropy",), ("train",)),
    CurvePanel(
        "response length (tokens)",
        ("response/len_mean", "response/len_max", "eval/response_len"),
        ("train", "eval"),
    ),
    CurvePanel(
        "clip fractions",
        ("loss/clipfrac_low", "loss/clipfrac_high", "loss/clipfrac_dual"),
        ("train",),
    ),
    CurvePanel(
        "dynamic sampling",
        ("ds/kept_frac", "ds/all_correct_frac", "ds/all_wrong_frac"),
        ("train",),
    ),
    CurvePanel("DAA amplification λ", ("daa/lambda_mean", "daa/lambda_max"), ("train",)),
    CurvePanel(
        "DAA positive-advantage share",
        ("daa/pos_share_before", "daa/pos_share_after"),
        ("train",),
    ),
    CurvePanel("gradient norm", ("optim/grad_norm", "sft/grad_norm"), ("train", "sft")),
    CurvePanel("SFT check accuracy", ("sft/check_acc",), ("sft",)),
)


class _Series(NamedTuple):
    """One curve of a panel: its finite points, sorted by step."""

    key: str
    steps: list[int]
    values: list[float]
    kinds: frozenset[str]  # the kinds of the rows that gave points
    width: float


def _value(v: Any) -> float | None:
    """A finite number of a row, or None (null, a string, NaN)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def _matches(pattern: str, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The keys of `rows` that `pattern` names: itself, or for `prefix*` every key with
    that prefix, the overall keys (no further `/`) first, then the rest by name."""
    if not pattern.endswith("*"):
        return [pattern]
    prefix = pattern[:-1]
    keys = {k for r in rows for k in r if k.startswith(prefix)}
    return sorted(keys, key=lambda k: ("/" in k[len(prefix) :], k))


def _series(panel: CurvePanel, rows: Sequence[Mapping[str, Any]]) -> list[_Series]:
    """The curves of `panel` that have at least one finite point, in table order."""
    rows = [r for r in rows if r.get("kind", "train") in panel.kinds]
    out = []
    for pattern in panel.keys:
        for key in _matches(pattern, rows):
            pts = sorted(
                (r["step"], v, r.get("kind", "train"))
                for r in rows
                if (v := _value(r.get(key))) is not None
            )
            if not pts:
                continue
            if not pattern.endswith("*"):
                width = 1.5
            else:  # an overall value above its per-tier breakdown
                width = 1.0 if "/" in key[len(pattern) - 1 :] else 2.5
            steps, values, kinds = zip(*pts)
            out.append(_Series(key, list(steps), list(values), frozenset(kinds), width))
    return out


def _drawn(rows: Sequence[Mapping[str, Any]]) -> list[tuple[CurvePanel, list[_Series]]]:
    """The panels of `CURVE_PANELS` that have data in `rows`, with their curves."""
    return [(p, s) for p in CURVE_PANELS if (s := _series(p, rows))]


def curve_panels(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[str]]]:
    """What `plot_curves` draws for `rows` (as `read_metrics` returns them): one
    `(panel title, [metric keys drawn])` per panel with data, in drawing order."""
    return [(p.title, [s.key for s in series]) for p, series in _drawn(rows)]


def _x_label(series: Sequence[_Series]) -> str:
    """The x label: "SFT step" when every point comes from SFT rows, else "RL step"."""
    return "SFT step" if all(s.kinds == {"sft"} for s in series) else "RL step"


def _draw_panel(ax, panel: CurvePanel, series: Sequence[_Series]) -> None:
    """Draws one panel's curves; sparse ones (eval rows, few points) get markers."""
    for s in series:
        sparse = "eval" in s.kinds or len(s.steps) <= 25
        label = s.key.removeprefix("eval/") if panel.keys[0].endswith("*") else s.key
        ax.plot(
            s.steps,
            s.values,
            label=label,
            linewidth=s.width,
            marker="o" if sparse else None,
            markersize=3,
        )
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel(_x_label(series), fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _save_atomically(fig, out_png: str) -> None:
    """Saves `fig` to a temporary file next to `out_png`, then renames it onto `out_png`:
    a reader (or a kill mid-write) never sees a torn PNG."""
    folder, name = os.path.split(os.path.abspath(out_png))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fig.savefig(tmp, format="png", dpi=100)
        os.replace(tmp, out_png)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def plot_curves(metrics_path: str, out_png: str, ncols: int = 3) -> str | None:
    """Draws the training curves of `metrics_path` (a `metrics.jsonl`) into `out_png`.

    One panel per entry of `CURVE_PANELS` that has data (see `curve_panels`): training
    reward, held-out avg@k overall and by tier, loss, KL, entropy, response length, clip
    fractions, dynamic sampling, DAA amplification, gradient norm and SFT check accuracy;
    `ncols` panels a row. Works for RL runs (`train` and `eval` rows) and SFT runs (`sft`
    rows), and on a file still being written, so it can run after every eval. The PNG is
    written atomically and uses matplotlib's object API (no pyplot state is kept).

    Returns:
      `out_png`, or None (nothing written) when no panel has data: a missing or empty
      file, or rows with none of the keys of `CURVE_PANELS`.
    """
    rows = read_metrics(metrics_path)
    panels = _drawn(rows)
    if not panels:
        return None
    from matplotlib.figure import Figure  # a runtime dependency (pyproject.toml)

    ncols = max(1, min(ncols, len(panels)))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(4.4 * ncols, 3.2 * nrows + 0.4), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, (panel, series) in zip(axes, panels):
        _draw_panel(ax, panel, series)
    for ax in axes[len(panels) :]:
        ax.set_axis_off()
    last = max(r["step"] for r in rows)
    stage = "SFT" if all(r.get("kind") == "sft" for r in rows) else "RL"
    fig.suptitle(f"metrics through {stage} step {last}", fontsize=11)
    _save_atomically(fig, out_png)
    return out_png
