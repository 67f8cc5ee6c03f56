"""`curves.png`: the training curves of a `metrics.jsonl`, one panel per group of metrics
(`CURVE_PANELS`), redrawn after every eval and written atomically."""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from da3po_jax.runtime.metrics_file import read_metrics


class CurvePanel(NamedTuple):
    """One panel of `curves.png`: the metric keys it draws, from rows of the given kinds.

    A key ending in `*` stands for every key with that prefix (the held-out avg@k overall
    and per tier); among those, a key with no further `/` (the overall value) is drawn
    thicker than its per-tier siblings. A key with a `*` before its end is a pattern of
    `/`-separated parts, each `*` matching within one part (`eval/*/avg@*`: each suite's
    avg@k, not its per-tier values); the suites' average is drawn thicker.
    """

    title: str
    keys: tuple[str, ...]
    kinds: tuple[str, ...]


CURVE_PANELS: tuple[CurvePanel, ...] = (
    CurvePanel("training rollouts: reward / accuracy", ("reward/mean", "reward/acc"), ("train",)),
    CurvePanel("held-out avg@k", ("eval/avg@*",), ("eval",)),
    CurvePanel("eval suites avg@k", ("eval/*/avg@*",), ("eval",)),
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
    if "*" in pattern[:-1]:
        parts = re.compile("[^/]*".join(re.escape(p) for p in pattern.split("*")))
        return sorted({k for r in rows for k in r if parts.fullmatch(k)})
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
            if "*" in pattern[:-1]:
                width = 2.5 if key.startswith("eval/average/") else 1.5
            elif not pattern.endswith("*"):
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
