"""Metrics to JSONL and TensorBoard (and W&B when configured), plots and a text summary.

Only process 0 writes; other hosts get a logger that does nothing.
"""

from __future__ import annotations

import json
import logging
import math
import os
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


class MetricsLogger:
    """Appends one JSON line per `write` to `<workdir>/metrics.jsonl`; mirrors scalars to
    TensorBoard (`tensorboardX`, if installed) and W&B (if `wandb_project` is set)."""

    def __init__(
        self,
        workdir: str,
        enabled: bool = True,
        wandb_project: str = "",
        config: Mapping[str, Any] | None = None,
    ):
        self.enabled = enabled
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._tb = self._wandb = None
        if not enabled:
            return
        os.makedirs(workdir, exist_ok=True)
        try:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
        except ImportError:
            log.info("tensorboardX not installed; metrics go to metrics.jsonl only")
        if wandb_project:
            import wandb  # an explicit request: a missing package is an error

            self._wandb = wandb.init(
                project=wandb_project, dir=workdir, config=dict(config or {}), resume="allow"
            )

    def write(self, step: int, metrics: Mapping[str, Any], kind: str = "train") -> None:
        if not self.enabled:
            return
        row = {"step": int(step), "kind": kind}
        row.update({k: _scalar(v) for k, v in metrics.items()})
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        for k, v in row.items():
            if k not in ("step", "kind") and v is not None:
                if self._tb is not None:
                    self._tb.add_scalar(k.replace("@", "_at_"), v, step)
        if self._wandb is not None:
            self._wandb.log({f"{kind}/{k}": v for k, v in row.items() if v is not None}, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(path: str) -> list[dict[str, Any]]:
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def truncate_metrics(path: str, last_step: int) -> None:
    """Drops rows written after `last_step` (a resumed run rewrites them)."""
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
