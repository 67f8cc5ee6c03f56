"""Synthetic task: determinism, tiers, disjoint splits, and answers checked independently."""

from __future__ import annotations

import ast
import collections
import operator
import re

import pytest

from da3po_jax.data import (
    PROMPT_TEMPLATES,
    SPLITS,
    TIERS,
    corpus,
    format_prompt,
    generate_split,
    generate_splits,
    get_template,
    split_of,
)

SIZES = {"sft": 600, "train": 300, "heldout": 150}

# Independent re-derivation of the answer from the structured fields.
ANSWER_OF = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "addmul": lambda a, b, c: (a + b) * c,
    "muladd": lambda a, b, c: a * b + c,
    "chain": lambda *ops: sum(ops),
}
# The operands as they must appear in the question text.
PROMPT_RE = {
    "add": r"What is (\d+) \+ (\d+)\?",
    "sub": r"What is (\d+) - (\d+)\?",
    "mul": r"What is (\d+) \* (\d+)\?",
    "addmul": r"What is \((\d+) \+ (\d+)\) \* (\d+)\?",
    "muladd": r"What is (\d+) \* (\d+) \+ (\d+)\?",
    "chain": r"What is (\d+)((?: \+ \d+)+)\?",
}
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _evaluate(expr: str) -> int:
    """Integer value of an arithmetic expression over + - * and parentheses (test oracle)."""

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"unexpected syntax in {expr!r}")

    return walk(ast.parse(expr, mode="eval"))


def _canonical(problem) -> tuple:
    """Commuted variants of a problem share this key (computed here, not by the library)."""
    kind, ops = problem.meta["kind"], tuple(problem.meta["operands"])
    if kind in ("add", "mul", "addmul", "muladd"):
        ops = tuple(sorted(ops[:2])) + ops[2:]
    return kind, ops


@pytest.fixture(scope="module")
def splits():
    return generate_splits(SIZES, seed=7)


def test_same_seed_same_problems_other_seed_differs(splits):
    again = generate_splits(SIZES, seed=7)
    assert again == splits
    other = generate_split("train", SIZES["train"], seed=8)
    assert [p.id for p in other] != [p.id for p in splits["train"]]
    # The split a problem belongs to does not depend on the seed.
    assert all(split_of(p) == "train" for p in other)


def test_sizes_tier_counts_and_unique_ids(splits):
    for split, problems in splits.items():
        assert len(problems) == SIZES[split]
        counts = collections.Counter(p.tier for p in problems)
        assert set(counts) == {"easy", "medium", "hard"}  # `harder` has weight 0 by default
        assert max(counts.values()) - min(counts.values()) <= 1  # equal weights, exact
        assert len({p.id for p in problems}) == len(problems)
    skewed = generate_split("train", 100, seed=0, tier_weights={"easy": 1, "hard": 3})
    assert collections.Counter(p.tier for p in skewed) == {"easy": 25, "hard": 75}


def test_tiers_match_their_operations(splits):
    steps = {"easy": 1, "medium": 2, "hard": 3, "harder": 5}
    assert tuple(steps) == TIERS
    harder = generate_split("train", 50, seed=3, tier_weights={"hard": 1, "harder": 1})
    assert collections.Counter(p.tier for p in harder) == {"hard": 25, "harder": 25}
    for p in (p for ps in [*splits.values(), harder] for p in ps):
        kind, ops = p.meta["kind"], p.meta["operands"]
        assert kind == "chain" and len(ops) == steps[p.tier] + 1
        assert 10 <= ops[0] <= 299 and all(1 <= x <= 9 for x in ops[1:])


def test_splits_are_disjoint_even_up_to_commutation(splits):
    ids = {s: {p.id for p in ps} for s, ps in splits.items()}
    keys = {s: {_canonical(p) for p in ps} for s, ps in splits.items()}
    for i, a in enumerate(SPLITS):
        for b in SPLITS[i + 1 :]:
            assert not ids[a] & ids[b]
            assert not keys[a] & keys[b]
    for split, problems in splits.items():
        assert all(split_of(p) == split for p in problems)


def test_answers_prompts_and_worked_solutions_are_correct(splits):
    for p in (p for ps in splits.values() for p in ps):
        kind, ops = p.meta["kind"], tuple(p.meta["operands"])
        expected = ANSWER_OF[kind](*ops)
        assert p.answer == str(expected)
        assert expected >= 0
        match = re.fullmatch(PROMPT_RE[kind], p.prompt)
        assert match, p.prompt
        assert tuple(int(g) for g in re.findall(r"\d+", p.prompt)) == ops
        *work, last = p.solution.split("\n")
        assert last == f"Answer: {expected}"
        for line in work:  # every side of every `=` chain has the same value
            assert {_evaluate(side.strip()) for side in line.split("=")} == {expected}, line
        assert p.source == "synthetic" and p.id.startswith("syn:")


def test_exhausted_tier_and_bad_arguments_raise():
    with pytest.raises(ValueError, match="easy"):
        # ~1% of the ~2600 easy problems are held out: 300 distinct cannot exist.
        generate_split(
            "heldout",
            300,
            seed=0,
            tier_weights={"easy": 1.0},
            split_fractions={"sft": 0.5, "train": 0.49, "heldout": 0.01},
        )
    with pytest.raises(ValueError, match="split"):
        generate_split("test", 10)
    with pytest.raises(ValueError, match="tier"):
        generate_split("train", 10, tier_weights={"impossible": 1.0})


def test_corpus_is_short_texts_over_a_small_alphabet():
    texts = corpus(300, seed=0)
    assert len(texts) == 300
    assert max(len(t) for t in texts) < 100
    allowed = set("0123456789+-*=()?: \nWhatisAnswer")
    assert set("".join(texts)) <= allowed
    assert corpus(300, seed=0) == texts
    assert all(t.rstrip().split("\n")[-1].startswith("Answer: ") for t in texts)


def test_prompt_templates():
    dapo = format_prompt("What is 2 + 2?", "dapo")
    assert dapo == (
        "Solve the following math problem step by step. The last line of your response should "
        "be of the form Answer: $Answer (without quotes) where $Answer is the answer to the "
        "problem.\n\nWhat is 2 + 2?\n\nRemember to put your answer on its own line after "
        '"Answer:".'
    )
    assert format_prompt("  What is 2 + 2?\n", "tiny") == "What is 2 + 2?"
    assert format_prompt(r"Find \{x\}", "raw") == r"Find \{x\}"
    boxed = format_prompt("Find $x$.", "boxed")
    assert boxed.startswith("Find $x$.\n") and boxed.endswith(r"within \boxed{}.")
    custom = r"Q: {problem} -> put it in \boxed{}"
    assert format_prompt("1 + 1", custom) == r"Q: 1 + 1 -> put it in \boxed{}"
    assert get_template("dapo") == PROMPT_TEMPLATES["dapo"]
    with pytest.raises(ValueError, match="unknown prompt template"):
        format_prompt("x", "no-such-template")
