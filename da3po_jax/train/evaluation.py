"""Held-out evaluation: avg@k (mean accuracy over k samples) and pass@k, by tier.

Evaluation runs through a rollout engine (`train/engine.py`), the same kind as training's:
prompts are admitted as the engine has room, prompt i sampled with the key
fold_in(rng, i), and the engine's memory is freed when evaluation ends (`release`), so no
cache stays alive through the next update.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence

import jax
import numpy as np

from da3po_jax.data import MathProblem
from da3po_jax.sampling import prompt_keys
from da3po_jax.train.engine import RolloutEngine


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def evaluate(
    engine: RolloutEngine, params, problems: Sequence[MathProblem], rng: jax.Array
) -> dict[str, float]:
    """avg@k and pass@k over `problems` (k = the engine's group size), overall and per tier.

    Returns:
      `eval/avg@k`, `eval/pass@k`, `eval/avg@k/<tier>`, `eval/pass@k/<tier>`,
      `eval/response_len`, `eval/truncated_frac`, `eval/num_prompts`.
    """
    k = engine.group_size
    problems = list(problems)
    rows = _generate_all(engine, params, problems, rng)
    acc = np.stack([r[0] for r in rows]) if rows else np.zeros((0, k))
    tiers = defaultdict(list)
    for p, row in zip(problems, acc):
        tiers[p.tier or "all"].append(row)
    metrics = _summary(acc, k, "")
    for tier, tier_rows in sorted(tiers.items()):
        if tier != "all":
            metrics.update(_summary(np.stack(tier_rows), k, f"/{tier}"))
    lengths = np.concatenate([r[1] for r in rows]) if rows else np.zeros(0)
    truncated = np.concatenate([r[2] for r in rows]) if rows else np.zeros(0)
    metrics["eval/response_len"] = float(lengths.mean()) if rows else 0.0
    metrics["eval/truncated_frac"] = float(truncated.mean()) if rows else 0.0
    metrics["eval/num_prompts"] = float(len(problems))
    return metrics


def _generate_all(engine: RolloutEngine, params, problems: list[MathProblem], rng):
    """(correct [k], lengths [k], truncated [k]) of every problem, in order."""
    where: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(problems):
        where[id(p)].append(i)
    rows: list = [None] * len(problems)
    engine.sync_weights(params)
    try:
        start = 0
        while start < len(problems) or engine.in_flight():
            n = min(engine.capacity(), len(problems) - start)
            if n > 0:
                engine.admit(problems[start : start + n], prompt_keys(rng, n, start=start))
                start += n
                continue
            for groups in engine.finished():
                s = groups.scores
                for j, p in enumerate(groups.problems):
                    rows[where[id(p)].pop(0)] = (s.correct[j], s.lengths[j], s.truncated[j])
    finally:  # the eval cache is not kept alive past evaluation (what the planner counts)
        engine.release()
    return rows


def _summary(acc: np.ndarray, k: int, suffix: str) -> dict[str, float]:
    if acc.size == 0:
        return {}
    passes = [pass_at_k(k, int(row.sum()), k) for row in acc]
    return {
        f"eval/avg@{k}{suffix}": float(acc.mean()),
        f"eval/pass@{k}{suffix}": float(np.mean(passes)),
    }


@dataclasses.dataclass
class HeldoutEval:
    """The loop's periodic held-out evaluation: `evaluate` on fixed problems, the RNG
    folded with the step so that a resumed run evaluates exactly as an uninterrupted one."""

    engine: RolloutEngine | None
    problems: list[MathProblem]
    seed: int

    def __call__(self, params, step: int) -> dict[str, float]:
        if not self.problems:
            return {}
        rng = jax.random.fold_in(jax.random.PRNGKey(self.seed + 1), step)
        return evaluate(self.engine, params, self.problems, rng)
