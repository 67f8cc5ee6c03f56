"""Held-out evaluation: avg@k (mean accuracy over k samples) and pass@k, overall and by
group (the problems' tier by default, or their source or a dataset field), for each set
the run evaluates (`EvalSet`): its held-out set (metric keys `eval/avg@k`, ...) and each
named suite of `eval.suites` (`eval/<name>/avg@k`, ...), with the suites' average
(`eval/average/avg@k`, `eval/average/pass@k`: the mean of their columns, each at its own
k, as a benchmark table's average).

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
import zlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from da3po_jax.data import MathProblem
from da3po_jax.data.suites import SUITE_KEY
from da3po_jax.parallel import is_main_process, to_host
from da3po_jax.rollout import RolloutEngine
from da3po_jax.sampling import prompt_keys

NO_GROUP = "(none)"  # the group of a problem without the field grouped by
AVERAGE = "eval/average"  # the suites' average: <AVERAGE>/avg@k and <AVERAGE>/pass@k


@dataclasses.dataclass
class EvalSet:
    """One set an evaluation reports on.

    Attributes:
      name: "" for the run's held-out set (keys `eval/avg@k`, ...), else the suite's name
        (keys `eval/<name>/avg@k`, ...).
      title: what tables call it (`AIME 2024`).
      problems: its problems.
      k: samples per problem.
    """

    name: str
    title: str
    problems: list[MathProblem]
    k: int

    @property
    def prefix(self) -> str:
        """The start of the set's metric keys."""
        return f"eval/{self.name}" if self.name else "eval"

    def rng(self, rng: jax.Array) -> jax.Array:
        """The set's sampling key: `rng` for the held-out set (as before suites existed),
        folded with a digest of the name for a suite (adding a suite changes no other's)."""
        if not self.name:
            return rng
        return jax.random.fold_in(rng, zlib.crc32(self.name.encode()) & 0x7FFFFFFF)


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


def summarize(
    rows: Sequence[EvalRow], k: int, by: str = "tier", prefix: str = "eval"
) -> dict[str, float]:
    """The metrics of `rows`, overall and per group of `group_of(problem, by)` (no
    per-group keys when every problem is in the same group, or `by` is "").

    Returns:
      `<prefix>/avg@k`, `<prefix>/pass@k`, `<prefix>/avg@k/<group>`,
      `<prefix>/pass@k/<group>`, `<prefix>/response_len`, `<prefix>/truncated_frac`,
      `<prefix>/num_prompts` (`prefix`: `EvalSet.prefix`).
    """
    acc = np.stack([r.correct for r in rows]) if rows else np.zeros((0, k))
    groups: dict[str, list[np.ndarray]] = defaultdict(list)
    for r, row in zip(rows, acc):
        groups[group_of(r.problem, by) if by else ""].append(row)
    metrics = _summary(acc, k, prefix, "")
    if len(groups) > 1 or (len(groups) == 1 and "" not in groups):
        for name, group_rows in sorted(groups.items()):
            metrics.update(_summary(np.stack(group_rows), k, prefix, f"/{name or NO_GROUP}"))
    lengths = np.concatenate([r.lengths for r in rows]) if rows else np.zeros(0)
    truncated = np.concatenate([r.truncated for r in rows]) if rows else np.zeros(0)
    metrics[f"{prefix}/response_len"] = float(lengths.mean()) if rows else 0.0
    metrics[f"{prefix}/truncated_frac"] = float(truncated.mean()) if rows else 0.0
    metrics[f"{prefix}/num_prompts"] = float(len(rows))
    return metrics


def suite_average(metrics: dict[str, float], sets: Sequence[EvalSet]) -> dict[str, float]:
    """`eval/average/avg@k` and `eval/average/pass@k`: the unweighted mean over the suites
    of `sets` (not the held-out set) of their avg@k and pass@k, each at its own k; {}
    without suites."""
    suites = [s for s in sets if s.name and f"{s.prefix}/avg@{s.k}" in metrics]
    if not suites:
        return {}
    return {
        f"{AVERAGE}/{kind}@k": float(np.mean([metrics[f"{s.prefix}/{kind}@{s.k}"] for s in suites]))
        for kind in ("avg", "pass")
    }


def suite_table(metrics: dict[str, float], sets: Sequence[EvalSet]) -> list[dict[str, Any]]:
    """One row per suite of `sets` (name, title, k, avg, pass, prompts) and a last row
    `average`, as a benchmark table reads; [] without suites or their metrics."""
    rows = []
    for s in sets:
        if s.name and f"{s.prefix}/avg@{s.k}" in metrics:
            rows.append(
                {
                    "name": s.name,
                    "title": s.title,
                    "k": s.k,
                    "avg": metrics[f"{s.prefix}/avg@{s.k}"],
                    "pass": metrics[f"{s.prefix}/pass@{s.k}"],
                    "num_prompts": int(metrics[f"{s.prefix}/num_prompts"]),
                }
            )
    if rows:
        average = {
            "name": "average",
            "title": "Average",
            "k": None,
            "avg": metrics[f"{AVERAGE}/avg@k"],
            "pass": metrics[f"{AVERAGE}/pass@k"],
            "num_prompts": sum(r["num_prompts"] for r in rows),
        }
        rows.append(average)
    return rows


def format_suite_table(table: Sequence[dict[str, Any]]) -> str:
    """`suite_table` as text: one line per benchmark (k, avg@k, pass@k, prompts), then the
    same numbers as the two rows of a paper's table (percent, benchmarks as columns)."""
    if not table:
        return ""
    lines = [f"  {'benchmark':<16} {'k':>3}  {'avg@k':>6}  {'pass@k':>6}  {'prompts':>7}"]
    for r in table:
        k = "" if r["k"] is None else str(r["k"])
        lines.append(
            f"  {r['title']:<16} {k:>3}  {r['avg']:>6.3f}  {r['pass']:>6.3f}  {r['num_prompts']:>7}"
        )
    head = " | ".join(r["title"] for r in table)
    lines += ["", f"  | | {head} |", "  |" + "---|" * (len(table) + 1)]
    for kind in ("avg", "pass"):
        cells = " | ".join(f"{100 * r[kind]:.1f}" for r in table)
        lines.append(f"  | {kind}@k | {cells} |")
    return "\n".join(lines)


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
    verdict (`correct`), reward, length, truncated, tier, source and suite ("" for the
    held-out set)."""
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
                    "suite": p.meta.get(SUITE_KEY, ""),
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


def _summary(acc: np.ndarray, k: int, prefix: str, suffix: str) -> dict[str, float]:
    if acc.size == 0:
        return {}
    passes = [pass_at_k(k, int(row.sum()), k) for row in acc]
    return {
        f"{prefix}/avg@{k}{suffix}": float(acc.mean()),
        f"{prefix}/pass@{k}{suffix}": float(np.mean(passes)),
    }


EvalRun = tuple[EvalSet, RolloutEngine]  # a set and the engine that samples it


def evaluate_sets(
    runs: Sequence[EvalRun],
    params,
    rng: jax.Array,
    by: str = "tier",
    *,
    keep_samples: bool | int = False,
    desc: str = "",
) -> tuple[dict[str, float], dict[str, list[EvalRow]]]:
    """Every set of `runs` sampled (keys `EvalSet.rng(rng)`) and summarized under its
    prefix, with the suites' average (`suite_average`).

    Args:
      keep_samples: keep the response tokens of every row (True), or of as many rows as
        hold n samples (an int) in each set, for `sample_records`.
      desc: the progress bars' name (the suite's name appended).

    Returns:
      (metrics, each set's `EvalRow`s by set name).
    """
    metrics: dict[str, float] = {}
    rows_of: dict[str, list[EvalRow]] = {}
    for s, engine in runs:
        keep = keep_samples if keep_samples is True else -(-int(keep_samples) // s.k)
        label = f"{desc} {s.name}" if desc and s.name else desc
        rows = generate(engine, params, s.problems, s.rng(rng), keep_tokens=keep, desc=label)
        metrics.update(summarize(rows, s.k, by, s.prefix))
        rows_of[s.name] = rows
    metrics.update(suite_average(metrics, [s for s, _ in runs]))
    return metrics, rows_of


@dataclasses.dataclass
class HeldoutEval:
    """The loop's periodic evaluation of every set (`evaluate_sets`) on fixed problems,
    the RNG folded with the step so that a resumed run evaluates exactly as an
    uninterrupted one.

    With `log_samples` = n > 0 (and a `tokenizer`), n responses of each set (those of its
    first problems, all k of each) are decoded after each eval and passed to
    `on_samples(step, records)` (`sample_records`)."""

    runs: list[EvalRun]
    seed: int
    by: str = "tier"
    tokenizer: Any = None
    render: Callable[[MathProblem], str] | None = None
    log_samples: int = 0
    on_samples: Callable[[int, list[dict[str, Any]]], None] | None = None

    @property
    def sets(self) -> list[EvalSet]:
        return [s for s, _ in self.runs]

    def __call__(self, params, step: int) -> dict[str, float]:
        if not self.runs:
            return {}
        rng = jax.random.fold_in(jax.random.PRNGKey(self.seed + 1), step)
        logged = self.log_samples if self.tokenizer is not None and self.on_samples else 0
        metrics, rows_of = evaluate_sets(
            self.runs, params, rng, self.by, keep_samples=logged, desc=f"eval at step {step}"
        )
        if logged:
            records = []
            for s in self.sets:
                records += sample_records(rows_of[s.name], self.tokenizer, self.render)[:logged]
            self.on_samples(step, records)
        return metrics
