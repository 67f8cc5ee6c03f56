"""Synthetic arithmetic task with difficulty tiers: the embedded demo's data, no downloads.

Every problem is a chain of one small skill, adding a single digit to a number below 330
(`47 + 8 = 55`), so a ~1M-parameter model learns the skill in a short supervised warm-up
and the tiers differ by how many times it must be applied without a slip:

- easy:   one step, `47 + 8`.
- medium: two steps, `47 + 8 + 6` worked as `47 + 8 + 6 = 55 + 6 = 61`.
- hard:   three steps, `47 + 8 + 6 + 9 = 55 + 6 + 9 = 61 + 9 = 70`.
- harder: five steps, `47 + 8 + 6 + 9 + 3 + 5 = ... = 78`; off by default (weight 0), half
  of the hard task (`configs/tiny_math_hard.py`).

A step's success rate p gives a tier rate of about p, p^2, p^3 (p^5), so after warm-up the
hard tier has a low but non-zero pass rate (the regime DA3PO is about), and held-out
problems are new chains of steps that the training problems also contain. A warm start
too weak to have learned the step guesses near the answer instead, and its tiers barely
differ (docs/results.md, the hard task). Problems built on multi-digit addition or
multiplication are also available through `make_problem`, but a model of this size does
not learn them in minutes on a CPU.

The id of a problem is its expression (`syn:47+8+6`), so it is the same for every seed, and
its split (`sft`, `train`, `heldout`) is a hash of its *split key*, the expression with the
operands of commutative operations sorted: splits never overlap, whatever the seed or
sizes, and `8 + 47` cannot be held out while `47 + 8` is trained on. Within a split, the
seed drives which problems are drawn and in what order; the same (seed, split, size,
weights) always gives the same list.

The character set is small on purpose (digits, `+ - * = ( ) ? :`, space, newline and the
letters of "What is" and "Answer") because the demo trains a tiny BPE tokenizer on
`corpus()`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from da3po_jax.data.prompts import format_prompt
from da3po_jax.data.records import MathProblem

TIERS = ("easy", "medium", "hard", "harder")
SPLITS = ("sft", "train", "heldout")
DEFAULT_SPLIT_FRACTIONS: Mapping[str, float] = {"sft": 0.4, "train": 0.4, "heldout": 0.2}
DEFAULT_TIER_WEIGHTS: Mapping[str, float] = {"easy": 1.0, "medium": 1.0, "hard": 1.0, "harder": 0.0}
SOURCE = "synthetic"
_MAX_MISSES = 20_000


@dataclasses.dataclass(frozen=True)
class _Kind:
    """A problem family: operation name and inclusive operand ranges."""

    name: str
    ranges: tuple[tuple[int, int], ...]


_TIER_KINDS: Mapping[str, tuple[_Kind, ...]] = {
    "easy": (_Kind("chain", ((10, 299), (1, 9))),),
    "medium": (_Kind("chain", ((10, 299), (1, 9), (1, 9))),),
    "hard": (_Kind("chain", ((10, 299), (1, 9), (1, 9), (1, 9))),),
    "harder": (_Kind("chain", ((10, 299), (1, 9), (1, 9), (1, 9), (1, 9), (1, 9))),),
}


def _mul_steps(a: int, b: int) -> str:
    tens, ones = b - b % 10, b % 10
    return f"{a} * {b} = {a} * {tens} + {a} * {ones} = {a * tens} + {a * ones} = {a * b}"


def _add(a: int, b: int) -> tuple[str, int, str]:
    return f"{a} + {b}", a + b, f"{a} + {b} = {a + b}"


def _sub(a: int, b: int) -> tuple[str, int, str]:
    return f"{a} - {b}", a - b, f"{a} - {b} = {a - b}"


def _mul(a: int, b: int) -> tuple[str, int, str]:
    return f"{a} * {b}", a * b, _mul_steps(a, b)


def _addmul(a: int, b: int, c: int) -> tuple[str, int, str]:
    s = a + b
    return f"({a} + {b}) * {c}", s * c, f"({a} + {b}) * {c} = {s} * {c} = {s * c}"


def _muladd(a: int, b: int, c: int) -> tuple[str, int, str]:
    p = a * b
    return f"{a} * {b} + {c}", p + c, f"{a} * {b} + {c} = {p} + {c} = {p + c}"


def _chain(*ops: int) -> tuple[str, int, str]:
    """a + b + c + ...: worked one addition at a time (`a + b + c = s + c = t`)."""
    expr = " + ".join(map(str, ops))
    steps, total = [expr], ops[0]
    for i in range(1, len(ops)):
        total += ops[i]
        steps.append(" + ".join(map(str, (total, *ops[i + 1 :]))))
    return expr, total, " = ".join(steps)


# name -> (expression, answer, worked line) of the operands.
_BUILDERS: Mapping[str, Callable[..., tuple[str, int, str]]] = {
    "add": _add,
    "sub": _sub,
    "mul": _mul,
    "addmul": _addmul,
    "muladd": _muladd,
    "chain": _chain,
}
# name -> how many leading operands commute (a + b, a * b, (a + b) * c, a * b + c).
_COMMUTING = {"add": 2, "sub": 0, "mul": 2, "addmul": 2, "muladd": 2, "chain": 0}


def _split_key(kind: str, operands: tuple[int, ...]) -> str:
    # A chain keeps its order: `47 + 8 + 6` and `47 + 6 + 8` are different worked problems.
    k = _COMMUTING[kind]
    canonical = tuple(sorted(operands[:k])) + operands[k:]
    return f"{kind}:" + ",".join(map(str, canonical))


def make_problem(kind: str, operands: Sequence[int], tier: str) -> MathProblem:
    """Builds the synthetic problem of one operation on given operands.

    Args:
      kind: `"add"`, `"sub"`, `"mul"`, `"addmul"` (`(a + b) * c`) or `"muladd"`
        (`a * b + c`).
      operands: the integers, in the order they appear in the expression.
      tier: difficulty label to attach.

    Returns:
      The problem; `meta` holds `kind` and `operands` so the answer can be re-derived.
    """
    if kind not in _BUILDERS:
        raise ValueError(f"unknown synthetic problem kind {kind!r}; use one of {list(_BUILDERS)}")
    operands = tuple(int(x) for x in operands)
    expr, answer, worked = _BUILDERS[kind](*operands)
    return MathProblem(
        id="syn:" + expr.replace(" ", ""),
        prompt=f"What is {expr}?",
        answer=str(answer),
        tier=tier,
        solution=f"{worked}\nAnswer: {answer}",
        source=SOURCE,
        meta={"kind": kind, "operands": operands, "split_key": _split_key(kind, operands)},
    )


def _normalised_fractions(split_fractions: Mapping[str, float] | None) -> list[float]:
    fractions = dict(DEFAULT_SPLIT_FRACTIONS if split_fractions is None else split_fractions)
    unknown = set(fractions) - set(SPLITS)
    if unknown:
        raise ValueError(f"unknown split(s) {sorted(unknown)}; splits are {SPLITS}")
    values = [float(fractions.get(s, 0.0)) for s in SPLITS]
    if min(values) < 0 or sum(values) <= 0:
        raise ValueError(f"split fractions must be >= 0 with a positive sum, got {fractions}")
    return [v / sum(values) for v in values]


def _split_by_hash(problem_id: str, fractions: Sequence[float]) -> str:
    """Split of an id given normalised fractions in `SPLITS` order."""
    digest = hashlib.blake2b(problem_id.encode("utf-8"), digest_size=8).digest()
    u = int.from_bytes(digest, "big") / 2.0**64
    cumulative = 0.0
    for split, fraction in zip(SPLITS, fractions):
        cumulative += fraction
        if u < cumulative:
            return split
    return [s for s, f in zip(SPLITS, fractions) if f > 0][-1]  # rounding at u ~ 1


def _key(problem: MathProblem) -> str:
    return str(problem.meta.get("split_key", problem.id))


def split_of(problem: MathProblem | str, split_fractions: Mapping[str, float] | None = None) -> str:
    """The split a problem belongs to: a stable hash of its split key against the fractions.

    Args:
      problem: a synthetic problem (hashed by `meta["split_key"]`), or a key string.
      split_fractions: relative sizes of `sft`, `train`, `heldout` (default 0.4/0.4/0.2).
    """
    key = problem if isinstance(problem, str) else _key(problem)
    return _split_by_hash(key, _normalised_fractions(split_fractions))


def _tier_counts(size: int, tier_weights: Mapping[str, float] | None) -> dict[str, int]:
    """Exact per-tier counts summing to `size` (largest remainder), in `TIERS` order."""
    weights = dict(DEFAULT_TIER_WEIGHTS if tier_weights is None else tier_weights)
    unknown = set(weights) - set(TIERS)
    if unknown:
        raise ValueError(f"unknown tier(s) {sorted(unknown)}; tiers are {TIERS}")
    w = np.array([float(weights.get(t, 0.0)) for t in TIERS])
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"tier weights must be >= 0 with a positive sum, got {weights}")
    exact = size * w / w.sum()
    counts = np.floor(exact).astype(int)
    by_remainder = np.argsort(-(exact - counts), kind="stable")
    counts[by_remainder[: size - counts.sum()]] += 1
    return dict(zip(TIERS, counts.tolist()))


def _draw(rng: np.random.Generator, tier: str) -> MathProblem:
    kinds = _TIER_KINDS[tier]
    kind = kinds[int(rng.integers(len(kinds)))]
    ops = [int(rng.integers(lo, hi + 1)) for lo, hi in kind.ranges]
    if kind.name == "sub" and ops[1] > ops[0]:  # keep results non-negative
        ops.reverse()
    elif kind.name == "add" and tier == "medium" and rng.integers(2):
        ops.reverse()  # the 3-digit operand may come first or second
    return make_problem(kind.name, ops, tier)


def _sample_tier(
    rng: np.random.Generator, tier: str, count: int, split: str, fractions: Sequence[float]
) -> list[MathProblem]:
    """`count` distinct problems of `tier` whose split keys hash into `split`."""
    out: dict[str, MathProblem] = {}
    misses = 0  # draws since the last new problem; many in a row means the tier ran out
    while len(out) < count and misses < _MAX_MISSES:
        p = _draw(rng, tier)
        if p.id not in out and _split_by_hash(_key(p), fractions) == split:
            out[p.id], misses = p, 0
        else:
            misses += 1
    if len(out) < count:
        raise ValueError(
            f"could only draw {len(out)} of {count} distinct {tier!r} problems for split "
            f"{split!r}; that tier has too few problems for this size and split fraction"
        )
    return list(out.values())


def generate_split(
    split: str,
    size: int,
    *,
    seed: int = 0,
    tier_weights: Mapping[str, float] | None = None,
    split_fractions: Mapping[str, float] | None = None,
) -> list[MathProblem]:
    """Draws `size` distinct problems of one split, with exact per-tier counts, shuffled.

    Args:
      split: `"sft"` (supervised warm-up), `"train"` (RL prompts) or `"heldout"` (eval).
      size: number of problems.
      seed: non-negative seed; with the other arguments it fixes the list exactly.
      tier_weights: relative share of each tier (default: easy, medium, hard in equal
        thirds, no `harder`).
      split_fractions: relative sizes of the splits' id spaces (default 0.4/0.4/0.2).
        Must be the same for every split of one run, or the splits may overlap.

    Raises:
      ValueError: unknown split/tier, or more problems asked of a tier than it holds.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; splits are {SPLITS}")
    if size < 0 or seed < 0:
        raise ValueError(f"size and seed must be >= 0, got size={size}, seed={seed}")
    fractions = _normalised_fractions(split_fractions)
    rng = np.random.default_rng([seed, SPLITS.index(split)])
    problems: list[MathProblem] = []
    for tier, count in _tier_counts(size, tier_weights).items():
        problems.extend(_sample_tier(rng, tier, count, split, fractions))
    return [problems[i] for i in rng.permutation(len(problems))]


def generate_splits(
    sizes: Mapping[str, int],
    *,
    seed: int = 0,
    tier_weights: Mapping[str, float] | None = None,
    split_fractions: Mapping[str, float] | None = None,
) -> dict[str, list[MathProblem]]:
    """`generate_split` for several splits at once, e.g. `{"sft": 4000, "heldout": 300}`."""
    return {
        split: generate_split(
            split, n, seed=seed, tier_weights=tier_weights, split_fractions=split_fractions
        )
        for split, n in sizes.items()
    }


def corpus(size: int = 3000, *, seed: int = 0, template: str = "tiny") -> list[str]:
    """Texts to train the demo's tiny tokenizer on: templated prompts with their solutions.

    Draws about `size` problems spread over all splits and tiers, so every token the demo
    will see (numbers of every size, operators, the answer line) is in the corpus.

    Args:
      size: number of problems (texts).
      seed: generation seed.
      template: prompt template applied to each question (see `prompts.format_prompt`).
    """
    sizes = {s: size // len(SPLITS) + (i < size % len(SPLITS)) for i, s in enumerate(SPLITS)}
    texts = []
    for problems in generate_splits(sizes, seed=seed).values():
        texts.extend(f"{format_prompt(p.prompt, template)}\n{p.solution}" for p in problems)
    return texts
