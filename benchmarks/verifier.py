"""The built-in verifier's recall by family, false positives, agreement with Math-Verify and
scoring throughput, as JSON.

    python benchmarks/verifier.py                          # this tree: recall, agreement, speed
    python benchmarks/verifier.py --compare /tmp/verifier_head   # before (that tree) vs after

The labelled cases are always this tree's `tests/rewards/recall_cases.py`,
`tests/rewards/format_cases.py` and `tests/rewards/benchmark_cases.py` (the answer formats of
the held-out benchmarks; some of its references are tuples of strings, several answers, as
the scorer takes them); `--src` (or each side of `--compare`) only chooses which
source tree `da3po_jax` is imported from, so an older checkout (`git worktree add
/tmp/verifier_head HEAD`) is measured with the same cases and the same script.

* recall: per family, the share of pairs labelled correct that score correct; a false
  positive is a pair labelled wrong that scores correct (the count must be 0);
* agreement: the share of pairs on which the `math_verify` backend gives the built-in
  verifier's verdict, per case set, with every disagreement listed;
* throughput: items/s of `RewardScorer.score_batch` on a batch of `--batch` responses built
  from the cases (reasoning text of mixed lengths before each stated answer), workers warm.
  With `--compare`, each side runs `--rounds` times in fresh processes, alternately, and
  the ratio after/before of the median items/s is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES_DIR = os.path.join(ROOT, "tests", "rewards")
REASONS: dict[tuple[str, str], str] = {}  # the cases' MATH_VERIFY_DISAGREEMENTS
FILLER = (
    "We expand the expression and collect like terms: $(x+1)^2 = x^2 + 2x + 1$. "
    "Substituting $x = 3$ gives $16$, and checking the boundary values 0, 1 and 2 shows "
    "nothing smaller works.\n"
)


def _import(src: str):
    """(RewardScorer, case sets) with `da3po_jax` imported from the tree at `src`."""
    sys.path.insert(0, os.path.abspath(src))
    sys.path.insert(0, CASES_DIR)
    import benchmark_cases
    import format_cases
    import recall_cases

    from da3po_jax.rewards import RewardScorer

    assert os.path.abspath(sys.modules["da3po_jax"].__file__).startswith(os.path.abspath(src))
    modules = {
        "recall_cases": recall_cases,
        "format_cases": format_cases,
        "benchmark_cases": benchmark_cases,
    }
    for module in modules.values():
        REASONS.update(module.MATH_VERIFY_DISAGREEMENTS)
    return RewardScorer, {name: module.CASES for name, module in modules.items()}


def _as_string(reference) -> str:
    """A reference of several answers (a tuple of strings) as one bare list, `2, -3`."""
    return reference if isinstance(reference, str) else ", ".join(reference)


def _score(scorer_cls, cases, **kwargs) -> list[bool]:
    """The verdicts on `cases`; a source tree whose scorer takes only string references (an
    older checkout under `--compare`) gets each tuple reference joined into a bare list."""
    responses, references = [c[1] for c in cases], [c[2] for c in cases]
    with scorer_cls(num_workers=2, timeout_s=30.0, **kwargs) as scorer:
        try:
            batch = scorer.score_batch(responses, references)
        except TypeError:
            batch = scorer.score_batch(responses, [_as_string(r) for r in references])
    return batch.correct


def recall_report(scorer_cls, case_sets) -> dict:
    """Recall by family and false positives of the built-in verifier on every case set."""
    out = {}
    for name, cases in case_sets.items():
        verdicts = _score(scorer_cls, cases)
        families: dict[str, list[int]] = {}
        false_positives = []
        for (family, response, reference, label), got in zip(cases, verdicts):
            hits = families.setdefault(family, [0, 0])
            if label:
                hits[0] += got
                hits[1] += 1
            elif got:
                false_positives.append([family, response[:200], reference[:200]])
        recall = {
            f: {"correct": h, "of": n, "recall": round(h / n, 4) if n else None}
            for f, (h, n) in families.items()
        }
        found = sum(h for h, _ in families.values())
        total = sum(n for _, n in families.values())
        out[name] = {
            "cases": len(cases),
            "recall": round(found / total, 4),
            "by_family": recall,
            "false_positives": len(false_positives),
            "false_positive_cases": false_positives,
        }
    return out


def agreement_report(scorer_cls, case_sets) -> dict:
    """Agreement of the built-in verifier with the `math_verify` backend, per case set."""
    out = {}
    for name, cases in case_sets.items():
        builtin = _score(scorer_cls, cases)
        mv = _score(scorer_cls, cases, verifier="math_verify")
        disagreements = [
            {
                "family": c[0],
                "response": c[1][:160],
                "reference": c[2][:160],
                "label": c[3],
                "builtin": b,
                "math_verify": m,
                "right": "builtin" if b == c[3] else "math_verify",
                "why": REASONS.get((c[1], c[2])),
            }
            for c, b, m in zip(cases, builtin, mv)
            if b != m
        ]
        out[name] = {
            "cases": len(cases),
            "agreement": round(1 - len(disagreements) / len(cases), 4),
            "disagreements": len(disagreements),
            "builtin_right": sum(d["right"] == "builtin" for d in disagreements),
            "math_verify_right": sum(d["right"] == "math_verify" for d in disagreements),
            "math_verify_accuracy": round(
                sum(m == c[3] for c, m in zip(cases, mv)) / len(cases), 4
            ),
            "list": disagreements,
        }
    return out


def throughput_batch(case_sets, n: int) -> tuple[list[str], list[str]]:
    """`n` responses cycling through the cases, each after 0-15 paragraphs of reasoning."""
    cases = [
        c for cs in case_sets.values() for c in cs if len(c[1]) + len(_as_string(c[2])) < 4_000
    ]
    responses, references = [], []
    for i in range(n):
        _, response, reference, _ = cases[i % len(cases)]
        responses.append(FILLER * ((i * 7) % 16) + response)
        references.append(_as_string(reference))  # the same input for every source tree
    return responses, references


def throughput(scorer_cls, case_sets, n: int, repeats: int) -> float:
    """Best items/s of `score_batch` over `repeats` batches, after a warm-up batch."""
    responses, references = throughput_batch(case_sets, n)
    best = 0.0
    with scorer_cls(num_workers=2, timeout_s=30.0) as scorer:
        scorer.score_batch(responses[:200], references[:200])  # start and warm the workers
        for _ in range(repeats):
            start = time.perf_counter()
            scorer.score_batch(responses, references)
            best = max(best, n / (time.perf_counter() - start))
    return best


def compare(args) -> dict:
    """Throughput of `--compare` (before) and this tree (after), alternately, fresh processes."""
    sides = {"before": args.compare, "after": args.src}
    rates: dict[str, list[float]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for side, src in sides.items():
            cmd = [sys.executable, __file__, "--src", src, "--only-throughput"]
            cmd += ["--batch", str(args.batch), "--repeats", str(args.repeats)]
            line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rates[side].append(json.loads(line)["items_per_s"])
    before, after = statistics.median(rates["before"]), statistics.median(rates["after"])
    return {
        "batch": args.batch,
        "rounds": args.rounds,
        "items_per_s": rates,
        "median_before": round(before, 1),
        "median_after": round(after, 1),
        "ratio_after_over_before": round(after / before, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--src", default=ROOT, help="source tree to import da3po_jax from")
    p.add_argument("--compare", default=None, help="a 'before' source tree for recall and speed")
    p.add_argument("--batch", type=int, default=4_000, help="responses in the throughput batch")
    p.add_argument("--repeats", type=int, default=3, help="timed batches per process")
    p.add_argument("--rounds", type=int, default=3, help="--compare: processes per side")
    p.add_argument("--no-math-verify", action="store_true", help="skip the agreement check")
    p.add_argument("--only-throughput", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.only_throughput:
        scorer_cls, case_sets = _import(args.src)
        rate = throughput(scorer_cls, case_sets, args.batch, args.repeats)
        print(json.dumps({"items_per_s": round(rate, 1)}))
        return
    report: dict = {"src": os.path.abspath(args.src)}
    if args.compare:
        cmd = [sys.executable, __file__, "--src", args.compare, "--no-math-verify"]
        cmd += ["--batch", "0"]
        before = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        report["before"] = json.loads(before)["recall"]
    scorer_cls, case_sets = _import(args.src)
    report["recall"] = recall_report(scorer_cls, case_sets)
    if not args.no_math_verify:
        report["math_verify_agreement"] = agreement_report(scorer_cls, case_sets)
    if args.compare:
        report["throughput"] = compare(args)
    elif args.batch:
        rate = throughput(scorer_cls, case_sets, args.batch, args.repeats)
        report["throughput"] = {"batch": args.batch, "items_per_s": round(rate, 1)}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
