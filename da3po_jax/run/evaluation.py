"""Held-out evaluation: avg@k (mean accuracy over k samples) and pass@k, overall and by
group (the problems' tier by default, or their source or a dataset field).

Evaluation runs through a rollout engine (`rollout/protocol.py`), the same kind as training's:
prompts are admitted as the engine has room, prompt i sampled with the key
fold_in(rng, i), and the engine's memory is freed when evaluation ends (`release`), so no
cache stays alive through the next update. `generate` returns one `EvalRow` per problem
(with the response tokens when asked), `summarize` the metrics of rows, and
`sample_records` the decoded responses with their verdicts (what the eval command writes
and the training loop logs).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from da3po_jax.data import MathProblem
from da3po_jax.parallel import is_main_process, to_host
from da3po_jax.rollout import RolloutEngine
from da3po_jax.sampling import prompt_keys

NO_GROUP = "(none)"  # the group of a problem without the field grouped by


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


@dataclasses.dataclass
class EvalRow:
    """One problem's k samples.

    Attributes:
      problem: the problem.
      correct: [k] float, 1.0 where the verifier accepted the response.
      rewards: [k] float, the (unshaped) rewards.
      lengths: [k] int, response lengths in tokens.
      truncated: [k] bool, responses cut at the length cap.
      tokens: [k, N] response tokens (only when `generate` was asked to keep them).
    """

    problem: MathProblem
    correct: np.ndarray
    rewards: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray
    tokens: np.ndarray | None = None


def group_of(problem: MathProblem, by: str) -> str:
    """The group `problem` falls in when grouping `by` "tier", "source" or a dataset
    field (a key of the row the problem was read from, or of its `meta`); "" when the
    problem has no such value."""
    if by in ("tier", "source"):
        return str(getattr(problem, by))
    fields = problem.meta.get("fields", {})
    value = fields.get(by, problem.meta.get(by, ""))
    return "" if value is None else str(value)


def check_group_by(problems: Sequence[MathProblem], by: str) -> None:
    """Refuses a `by` that no problem has a value for (a misspelt field would otherwise
    report one group, silently)."""
    if not by or by in ("tier", "source") or not problems:
        return
    if any(group_of(p, by) for p in problems):
        return
    seen = sorted({k for p in problems for k in p.meta.get("fields", {})} | {"tier", "source"})
    raise ValueError(
        f"eval.group_by={by!r}: no problem has that field; the fields are {', '.join(seen)}"
    )


def evaluate(
    engine: RolloutEngine,
    params,
    problems: Sequence[MathProblem],
    rng: jax.Array,
    by: str = "tier",
    desc: str = "",
) -> dict[str, float]:
    """avg@k and pass@k over `problems` (k = the engine's group size), overall and per
    group (`summarize`); with `desc`, a progress bar of that name counts the prompts."""
    rows = generate(engine, params, problems, rng, desc=desc)
    return summarize(rows, engine.group_size, by)


def summarize(rows: Sequence[EvalRow], k: int, by: str = "tier") -> dict[str, float]:
    """The metrics of `rows`, overall and per group of `group_of(problem, by)` (no
    per-group keys when every problem is in the same group, or `by` is "").

    Returns:
      `eval/avg@k`, `eval/pass@k`, `eval/avg@k/<group>`, `eval/pass@k/<group>`,
      `eval/response_len`, `eval/truncated_frac`, `eval/num_prompts`.
    """
    acc = np.stack([r.correct for r in rows]) if rows else np.zeros((0, k))
    groups: dict[str, list[np.ndarray]] = defaultdict(list)
    for r, row in zip(rows, acc):
        groups[group_of(r.problem, by) if by else ""].append(row)
    metrics = _summary(acc, k, "")
    if len(groups) > 1 or (len(groups) == 1 and "" not in groups):
        for name, group_rows in sorted(groups.items()):
            metrics.update(_summary(np.stack(group_rows), k, f"/{name or NO_GROUP}"))
    lengths = np.concatenate([r.lengths for r in rows]) if rows else np.zeros(0)
    truncated = np.concatenate([r.truncated for r in rows]) if rows else np.zeros(0)
    metrics["eval/response_len"] = float(lengths.mean()) if rows else 0.0
    metrics["eval/truncated_frac"] = float(truncated.mean()) if rows else 0.0
    metrics["eval/num_prompts"] = float(len(rows))
    return metrics


def generate(
    engine: RolloutEngine,
    params,
    problems: Sequence[MathProblem],
    rng: jax.Array,
    *,
    keep_tokens: bool | int = False,
    desc: str = "",
) -> list[EvalRow]:
    """Samples and scores every problem; its `EvalRow`s in the order of `problems`.

    Args:
      keep_tokens: keep the response tokens of every row (True) or of the first n rows
        (an int), for `sample_records`.
      desc: with a name, a progress bar of that name counts the problems finished
        (process 0 only; gone once done).
    """
    problems = list(problems)
    keep = len(problems) if keep_tokens is True else int(keep_tokens)
    where: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(problems):
        where[id(p)].append(i)
    rows: list[Any] = [None] * len(problems)
    engine.sync_weights(params)
    bar = _progress_bar(len(problems), desc)
    try:
        start = 0
        while start < len(problems) or engine.in_flight():
            n = min(engine.capacity(), len(problems) - start)
            if n > 0:
                engine.admit(problems[start : start + n], prompt_keys(rng, n, start=start))
                start += n
                continue
            for groups in engine.finished():
                _collect(groups, where, rows, keep)
                bar.update(len(groups.problems))
    finally:  # the eval cache is not kept alive past evaluation (what the planner counts)
        engine.release()
        bar.close()
    return rows


def _collect(groups, where, rows: list, keep: int) -> None:
    """Files the finished `groups` into `rows` at their problems' positions."""
    s, real = groups.scores, len(groups.problems)
    at = [where[id(p)].pop(0) for p in groups.problems]
    tokens = None
    if any(i < keep for i in at):  # every host takes part in gathering (a collective)
        tokens = to_host(groups.batch.tokens)[:real]
    for j, (i, p) in enumerate(zip(at, groups.problems)):
        rows[i] = EvalRow(
            problem=p,
            correct=s.correct[j],
            rewards=s.rewards[j],
            lengths=s.lengths[j],
            truncated=s.truncated[j],
            tokens=tokens[j] if tokens is not None and i < keep else None,
        )


def sample_records(
    rows: Sequence[EvalRow], tokenizer, render: Callable[[MathProblem], str] | None = None
) -> list[dict[str, Any]]:
    """The decoded responses of the rows that kept their tokens, one record per sample:
    problem id, prompt (as rendered by `render`, else the question), response, reference,
    verdict (`correct`), reward, length, truncated, tier and source."""
    out = []
    for r in rows:
        if r.tokens is None:
            continue
        p = r.problem
        prompt = render(p) if render is not None else p.prompt
        for g, (toks, n) in enumerate(zip(r.tokens, r.lengths)):
            out.append(
                {
                    "id": p.id,
                    "sample": g,
                    "prompt": prompt,
                    "response": tokenizer.decode(np.asarray(toks)[: int(n)]),
                    "reference": p.answer,
                    "correct": bool(r.correct[g] > 0),
                    "reward": float(r.rewards[g]),
                    "length": int(n),
                    "truncated": bool(r.truncated[g]),
                    "tier": p.tier,
                    "source": p.source,
                }
            )
    return out


def _progress_bar(total: int, desc: str):
    """A bar over evaluated prompts, shown when `desc` names it, on process 0 only."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="prompt",
        dynamic_ncols=True,
        leave=False,
        disable=not desc or not is_main_process(),
    )


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
    folded with the step so that a resumed run evaluates exactly as an uninterrupted one.

    With `log_samples` = n > 0 (and a `tokenizer`), n responses (those of the first
    problems, all k of each) are decoded after each eval and passed to
    `on_samples(step, records)` (`sample_records`)."""

    engine: RolloutEngine | None
    problems: list[MathProblem]
    seed: int
    by: str = "tier"
    tokenizer: Any = None
    render: Callable[[MathProblem], str] | None = None
    log_samples: int = 0
    on_samples: Callable[[int, list[dict[str, Any]]], None] | None = None

    def __call__(self, params, step: int) -> dict[str, float]:
        if not self.problems:
            return {}
        rng = jax.random.fold_in(jax.random.PRNGKey(self.seed + 1), step)
        logged = self.log_samples if self.tokenizer is not None and self.on_samples else 0
        k = self.engine.group_size
        rows = generate(
            self.engine,
            params,
            self.problems,
            rng,
            keep_tokens=-(-logged // k),
            desc=f"eval at step {step}",
        )
        if logged:
            records = sample_records(rows, self.tokenizer, self.render)[:logged]
            self.on_samples(step, records)
        return summarize(rows, self.engine.group_size, self.by)
