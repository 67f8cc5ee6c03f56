"""Recall of the built-in verifier on labelled cases (`recall_cases.CASES`), end to end.

Every case is scored once through `RewardScorer` (extraction, the parent's fast path, sympy
in the worker processes), and the answers are also checked with the pure functions. The
kinds: unordered answer sets (`or` / `and` / `;`), set braces, labelled answers, several
boxes in one response, relations and intervals, percent, decimal commas, `\\cfrac`-style
fractions, equations up to scale, rounded decimals, matrices and text answers, each with
near-misses that must stay wrong.
"""

from __future__ import annotations

import collections

import pytest
from recall_cases import CASES

from da3po_jax.rewards import RewardScorer, extract_answer, fast_verdict, is_equivalent

IDS = [f"{i}-{kind}" for i, (kind, *_rest) in enumerate(CASES)]
# Kinds made only of numbers, so the parent decides them without sympy (other kinds have
# symbols, roots or equations: fast_verdict may leave them to a worker).
PARENT_KINDS = {"set_braces", "label", "percent", "decimal_comma", "rounded"}


@pytest.fixture(scope="module")
def scored():
    with RewardScorer(num_workers=2, timeout_s=20.0) as scorer:
        batch = scorer.score_batch([c[1] for c in CASES], [c[2] for c in CASES])
    return batch


def test_the_cases_cover_every_kind_both_ways():
    assert len(CASES) >= 200
    verdicts = collections.defaultdict(set)
    for kind, _, _, correct in CASES:
        verdicts[kind].add(correct)
    assert len(verdicts) >= 13
    assert all(v == {True, False} for v in verdicts.values()), dict(verdicts)


@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
def test_case_scores_as_labelled_end_to_end(scored, index):
    kind, response, reference, correct = CASES[index]
    result = scored.results[index]
    assert result.correct is correct, (kind, response, reference, result)
    assert result.status == ("no_answer" if result.extracted is None else "ok")


def test_the_batch_had_no_timeouts_or_errors(scored):
    assert scored.stats["timeout"] == 0 and scored.stats["error"] == 0
    assert scored.stats["symbolic"] > 0  # equations went through the worker processes
    assert scored.stats["correct"] == sum(c[3] for c in CASES)


SINGLE_ANSWER = [
    (i, c) for i, c in enumerate(CASES) if c[0] != "multi_box" and extract_answer(c[1]) is not None
]


@pytest.mark.parametrize("index, case", SINGLE_ANSWER, ids=[IDS[i] for i, _ in SINGLE_ANSWER])
def test_case_with_the_pure_functions(index, case):
    kind, response, reference, correct = case
    answer = extract_answer(response)
    assert is_equivalent(answer, reference) is correct
    fast = fast_verdict(answer, reference)
    assert fast in (correct, None)
    if kind in PARENT_KINDS:
        assert fast is correct  # decided in the parent, no worker needed


@pytest.mark.parametrize(
    "response, reference, correct",
    [
        (r"\boxed{1} and \boxed{2}", "1, 2", True),
        (r"\boxed{1} and \boxed{2}", "2", True),  # a single reference: the last box
        (r"\boxed{2} and \boxed{1}", "2", False),
        (r"\boxed{\boxed{1}} and \boxed{2}", "1, 2", False),  # the outer box holds a box
        (r"\boxed{1} \boxed{2} \boxed{3}", r"\{1, 2, 3\}", True),
        ("".join(rf"\boxed{{{i}}}" for i in range(40)), "0, 39", False),  # too many boxes
        (r"\boxed{1} and \boxed{2", "1, 2", False),  # the last box is malformed
    ],
)
def test_several_boxes_form_one_answer_set_only_for_a_set_reference(response, reference, correct):
    with RewardScorer(num_workers=1) as scorer:
        result = scorer.score(response, reference)
    assert result.correct is correct, result
