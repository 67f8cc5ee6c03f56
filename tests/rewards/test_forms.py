"""The answer-form helpers (`rewards/forms.py`) and the new normalisation steps, unit by unit,
plus adversarial inputs for every new path: they stay fast in the parent, and the one slow
step (equations through sympy) is cut off by the worker timeout."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest

from da3po_jax.rewards import RewardScorer, extract_boxes, fast_verdict, normalize_answer
from da3po_jax.rewards.forms import (
    MAX_MATRIX_ENTRIES,
    as_interval,
    decimal_comma,
    equation_sides,
    matrix_entries,
    relation_parts,
    rounds_to,
    split_label,
)

MB = 1_000_000


@pytest.mark.parametrize(
    "s, interval",
    [
        ("x>3", "(3,\\infty)"),
        ("x\\geq3", "[3,\\infty)"),
        ("3<x", "(3,\\infty)"),
        ("x\\leq-2", "(-\\infty,-2]"),
        ("-1<x\\leq2", "(-1,2]"),
        ("2>x\\geq-1", "[-1,2)"),
        ("x>\\frac{1}{2}", "(\\frac{1}{2},\\infty)"),
        ("\\theta<\\pi", "(-\\infty,\\pi)"),
        ("x\\neq3", None),  # not an interval
        ("x+y<1", None),
        ("x<y", None),
        ("1<x>2", None),  # mixed directions
        ("x<1<y<2", None),  # past MAX_RELATIONS
        ("5", None),
    ],
)
def test_as_interval(s, interval):
    assert as_interval(s) == interval


def test_relation_parts():
    assert relation_parts("a<b\\leqc") == (["a", "b", "c"], ["<", "\\leq"])
    assert relation_parts("a\\lt b") == (["a", "b"], ["<"])
    assert relation_parts("<3") is None  # an empty side
    assert relation_parts("x<" * 1000 + "1") is None


def test_matrix_entries():
    assert matrix_entries("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}") == (
        "matrix",
        [["1", "2"], ["3", "4"]],
    )
    assert matrix_entries("\\begin{array}{cc}1&2\\end{array}") == ("matrix", [["1", "2"]])
    assert matrix_entries("\\begin{vmatrix}1\\end{vmatrix}") == ("det", [["1"]])
    assert matrix_entries("(\\begin{matrix}1\\end{matrix})") == ("matrix", [["1"]])
    assert matrix_entries("\\begin{pmatrix}1&\\\\3&4\\end{pmatrix}") is None  # empty entry
    assert matrix_entries("\\begin{pmatrix}1\\end{bmatrix}") is None
    nested = "\\begin{pmatrix}\\begin{pmatrix}1\\end{pmatrix}\\end{pmatrix}"
    assert matrix_entries(nested) is None
    big = "\\begin{pmatrix}" + "1&" * MAX_MATRIX_ENTRIES + "1\\end{pmatrix}"
    assert matrix_entries(big) is None


def test_labels_equations_decimal_styles():
    assert split_label("AB=4") == ("AB", "4")
    assert split_label("x_1=2") == ("x_1", "2")
    assert split_label("2x=4") == (None, "2x=4")
    assert split_label("a=b=1") == (None, "a=b=1")
    assert equation_sides("2x+4y-3=0") == ("2x+4y-3", "0")
    assert equation_sides("x\\leq3") is None and equation_sides("x=1=y") is None
    assert decimal_comma("1,22", "1.22") == "1.22"
    assert decimal_comma("1,000", "1.000") is None
    assert decimal_comma("1,22", "122") is None
    assert rounds_to("0.3333", Fraction(1, 3)) and rounds_to("2.6667", Fraction(8, 3))
    assert not rounds_to("0.333", Fraction(1, 3))  # too few decimals
    assert not rounds_to("0.0001", Fraction(1, 7000))  # too few significant digits
    assert not rounds_to("0.6666", Fraction(2, 3))  # truncated, not rounded
    assert not rounds_to("0.5001", Fraction(1, 2))  # 1/2 has an exact 4-digit decimal


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("(11,7) or (7,11)", "(11,7),(7,11)"),
        ("-12; -11; -10", "-12,-11,-10"),
        ("1, 2, and 3", "1,2,3"),
        ("5 cm and 6 cm", "5,6"),
        ("28 percent", "28"),
        ("\\cfrac{1}{3}", "\\frac{1}{3}"),
        ("x >= 5", "x\\geq5"),
        ("x \\geqslant 5", "x\\geq5"),
        ("The answer is \\text{Monday}.", "monday"),
        ("(1,2)\\cup(3,4)", "(1,2),(3,4)"),
        ("1&2\\\\ 3&4", "1&2\\\\3&4"),  # a row break followed by a space stays a row break
        ("\\text{or}", "or"),  # a lone word is not a separator between answers
    ],
)
def test_new_normalisation_steps(raw, expected):
    assert normalize_answer(raw) == expected


def test_extract_boxes_is_bounded():
    assert extract_boxes("a \\boxed{1} b \\fbox{2}") == ["1", "2"]
    assert extract_boxes("\\boxed{\\boxed{1}+1} \\boxed{2}") == ["\\boxed{1}+1", "2"]
    assert extract_boxes("\\boxed{1}" * 40) is None
    assert extract_boxes("\\boxed{1} \\boxed{}") is None
    start = time.perf_counter()
    assert extract_boxes(("\\boxed{" + "{" * 5_000) * 30, max_chars=4_096) is None
    assert extract_boxes("\\boxed{" * MB) is None
    assert time.perf_counter() - start < 2.0


ADVERSARIAL_FORMS = [
    "\\begin{pmatrix}" + "1&" * 200_000 + "1\\end{pmatrix}",  # huge matrix
    "\\begin{pmatrix}" + "1&1\\\\" * 40 + "\\end{pmatrix}",  # just past the entry cap
    "\\begin{pmatrix}" * 500 + "1" + "\\end{pmatrix}" * 500,  # nested matrices
    "\\{" * 3_000 + "1,2" + "\\}" * 3_000,  # deeply nested sets
    "\\{" * 300 + "1,2" + "\\}" * 300,
    "x or " * 200_000 + "x",  # a pathological "or" chain
    "1 or " * 300 + "1",
    "1" + " " * 500_000 + "and" + " " * 500_000 + "3",
    ";" * MB,
    "x<" * 300_000 + "1",  # a relation chain
    "x<" * 500 + "1",
    "AB=" * 300_000 + "1",
    "the answer is " * 50_000,
    "0." + "3" * 4_000,  # a rounded decimal past the digit caps
    "1" * 4_000 + ",22",
    "\\cup" * 200_000,
]
REFERENCES = ["1", "1, 2", "x = y", "\\begin{pmatrix}1&2\\end{pmatrix}"]


@pytest.mark.parametrize("answer", ADVERSARIAL_FORMS, ids=range(len(ADVERSARIAL_FORMS)))
def test_adversarial_forms_are_fast_in_the_parent(answer):
    start = time.perf_counter()
    for ref in REFERENCES:
        assert fast_verdict(answer, ref) is False
    # About 0.1-0.5 s per reference at 1 MB (the scorer caps answers at 4,096 characters).
    assert time.perf_counter() - start < 10.0


EQUATION_BOMBS = [
    ("x^{10^{10}}=y", "y=x^{10^{10}}"),  # the power is refused before sympy builds it
    ("((x+1)^{100})^{100}=y", "y=((x+1)^{100})^{99}"),  # expands to 10,000 terms
    ("(x+y+z+1)^{100}=0", "(x+y+z+1)^{99}=1"),
    ("x^{99}y^{99}=1", "x^{98}y^{99}=2"),
]


def test_equation_bombs_are_cut_off_by_the_worker_timeout():
    timeout_s = 2.0
    responses = [f"\\boxed{{{a}}}" for a, _ in EQUATION_BOMBS] + ["\\boxed{2x+4y=3}"]
    references = [b for _, b in EQUATION_BOMBS] + ["y=-\\frac{1}{2}x+\\frac{3}{4}"]
    with RewardScorer(num_workers=2, timeout_s=timeout_s) as scorer:
        scorer.score_batch(["\\boxed{\\sqrt{2}}"], ["\\sqrt{3}"])  # start the workers
        start = time.perf_counter()
        batch = scorer.score_batch(responses, references)
        elapsed = time.perf_counter() - start
    assert batch.correct == [False] * len(EQUATION_BOMBS) + [True]
    assert all(r.status in ("ok", "timeout") for r in batch.results)
    # At worst every bomb runs to the limit, two at a time (plus worker restarts).
    assert elapsed < timeout_s * len(EQUATION_BOMBS) / 2 + 20.0
