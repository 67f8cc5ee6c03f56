"""The answer formats of the held-out benchmarks (`benchmark_cases.CASES`), end to end through
`RewardScorer`, and the pieces behind them: matrices in `array` form, several answers (several
boxes, `\\pm`, a reference given as a list of strings), labelled answers (`(p, q) = (3, 2)`,
ratios, `\\approx`, `f(x) =`), `Answer` headings, choice letters, units, scientific notation,
number styles and intervals. Every case is scored in one batch; no pair labelled wrong may
score correct, and every disagreement with the `math_verify` backend is listed with its reason.
"""

from __future__ import annotations

import collections
import time

import pytest
from benchmark_cases import CASES, FAMILIES, MATH_VERIFY_DISAGREEMENTS

from da3po_jax.rewards import RewardScorer, extract_answer, fast_verdict, is_equivalent
from da3po_jax.rewards.extract import extract_reference
from da3po_jax.rewards.forms import choice_parts, is_label, ratio_terms, split_label
from da3po_jax.rewards.normalize import normalize_answer

IDS = [f"{i}-{family}" for i, (family, *_rest) in enumerate(CASES)]
MB = 1_000_000


def _score(**kwargs):
    with RewardScorer(num_workers=2, timeout_s=30.0, **kwargs) as scorer:
        return scorer.score_batch([c[1] for c in CASES], [c[2] for c in CASES])


@pytest.fixture(scope="module")
def scored():
    return _score()


def test_the_cases_cover_every_family_both_ways():
    assert len(CASES) >= 180
    verdicts = collections.defaultdict(set)
    for family, _, _, correct in CASES:
        verdicts[family].add(correct)
    assert set(verdicts) == set(FAMILIES)
    assert all(v == {True, False} for v in verdicts.values()), dict(verdicts)
    assert any(isinstance(c[2], tuple) for c in CASES)  # references given as lists


@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
def test_case_scores_as_labelled(scored, index):
    family, response, reference, correct = CASES[index]
    result = scored.results[index]
    assert result.correct is correct, (family, response, reference, result)


def test_no_false_positive_and_no_timeout(scored):
    false_positives = [c for c, r in zip(CASES, scored.results) if r.correct and not c[3]]
    assert not false_positives
    assert scored.stats["timeout"] == 0 and scored.stats["error"] == 0


def test_an_answer_heading_is_a_marker_without_the_fallback():
    for _, response, reference, correct in (c for c in CASES if c[0] == "answer_heading"):
        answer = extract_answer(response, fallback="none")
        assert answer is not None, response
        if correct:
            assert is_equivalent(answer, reference), (response, answer)
    assert extract_answer("The answer $5$ is wrong.", fallback="none") is None
    assert extract_answer("Answer choices: $A$ to $E$", fallback="none") is None
    assert extract_answer("x" * 20 + " Answer $5$", fallback="none") is None  # not a heading


def test_a_list_reference_is_an_unordered_list_of_its_answers():
    assert extract_reference(["$2$", "$-3$"]) == "2, -3"
    assert extract_reference(("The answer is $\\frac{1}{2}$.",)) == "\\frac{1}{2}"
    with RewardScorer(num_workers=1) as scorer:
        batch = scorer.score_batch(
            ["$\\boxed{-3}$ and $\\boxed{2}$", "\\boxed{2}", "\\boxed{2}"],
            [["$2$", "$-3$"], ["$2$", "$-3$"], ["$2$"]],
        )
        assert [r.correct for r in batch.results] == [True, False, True]
        assert batch.results[0].extracted == "-3, 2"
        with pytest.raises(TypeError, match="lists of strings"):
            scorer.score_batch(["\\boxed{2}"], [[2, -3]])


def test_label_ratio_and_choice_forms():
    assert split_label("(p,q)=(3,2)") == ("(p,q)", "(3,2)")
    assert split_label("V_1:V_2=11:21") == ("V_1:V_2", "11:21")
    assert split_label("\\angle A=45") == ("\\angle A", "45")
    assert split_label("f^{-1}(x)=2x") == ("f^{-1}(x)", "2x")
    assert split_label("(1,2)=(3,2)") == (None, "(1,2)=(3,2)")
    assert is_label("(a,b,c)") and not is_label("(a)") and not is_label("2x")
    assert ratio_terms("11:21") == ["11", "21"] and ratio_terms("11:") is None
    assert ratio_terms("a:b=1:2") is None and ratio_terms(":".join("1" * 9)) is None
    assert choice_parts("(C)12") == ("C", "12") and choice_parts("C") == ("C", "")
    assert choice_parts("(A),(C)") is None and choice_parts("(F)") is None


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("\\approx 11", "11"),
        ("x \\approx 11", "11"),
        ("AB \\approx 11", "AB=11"),
        ("\\frac{22}{7} \\approx 3.14", "\\frac{22}{7}\\approx3.14"),  # not a label: kept
        ("3.3 \\mathrm{~km} / \\mathrm{s}", "3.3"),
        ("6 \\, \\text{erg} \\cdot \\text{s}", "6"),
        ("10^{20} \\mathrm{~cm}^{-3}", "10^{20}"),
        ("x \\, \\text{m/s}", "xm/s"),  # no number before it: not removed as a unit
        ("1 & 2 \\\\[2pt] 3 & 4", "1&2\\\\3&4"),
        ("\\mathbb{R}", "(-\\infty,\\infty)"),
        ("x = \\pm 2", "2,-2"),
        ("1 \\pm \\sqrt{2}", "1+\\sqrt{2},1-\\sqrt{2}"),
        ("(\\pm 1, 0)", "(\\pm1,0)"),  # a comma: left as it is
        ("\\pm 1 \\pm 2", "\\pm1\\pm2"),  # two signs: left as it is
    ],
)
def test_benchmark_normalisation_steps(raw, expected):
    assert normalize_answer(raw) == expected


ADVERSARIAL = [
    "(p," * 300_000 + "q)=(1,2)",  # a label past the size cap
    "a:" * 500_000 + "1",  # a ratio of too many terms
    "\\approx" * 120_000 + "1",
    "(A)" * 300_000,  # choice letters all the way down
    "(C)" + "(C)12" * 200_000,
    "5" + " \\mathrm{ km} /" * 60_000 + " \\mathrm{s}",  # a unit of many groups
    "1 \\\\[2pt]" * 100_000,
    "x \\approx (p,q) = " * 50_000,
    "\\pm" * 300_000 + "1",
    "f(x)=" * 200_000 + "1",
]


@pytest.mark.parametrize("answer", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_adversarial_benchmark_forms_are_fast_in_the_parent(answer):
    start = time.perf_counter()
    for ref in ("1", "(1,2)", "11:21", "(C)", "\\begin{pmatrix}1\\end{pmatrix}"):
        assert fast_verdict(answer, ref) is False
    assert time.perf_counter() - start < 10.0


@pytest.mark.parametrize(
    "text",
    [
        "**Answer**\n" * 200_000 + "$1$",
        ("answer" + " " * 1_000) * 1_000 + "$1$",
        "Answer" + " " * MB + "$1$",
        "#" * 15 + ("answer ** " * 200_000),
        "x" * MB + "Answer $1$",
    ],
)
def test_adversarial_answer_headings_are_fast(text):
    start = time.perf_counter()
    extract_answer(text, max_chars=4_096)
    assert time.perf_counter() - start < 2.0


def test_every_disagreement_with_math_verify_is_labelled(scored):
    pytest.importorskip("math_verify")
    mv = _score(verifier="math_verify")
    disagree = {}
    for case, b, m in zip(CASES, scored.correct, mv.correct):
        if b != m:
            disagree[(case[1], case[2])] = (case[3], b)
    print(f"benchmark cases: {len(disagree)} disagreements in {len(CASES)}")
    assert set(disagree) == set(MATH_VERIFY_DISAGREEMENTS)
    for key, (label, b) in disagree.items():
        right = MATH_VERIFY_DISAGREEMENTS[key].split(":")[0]
        assert (b == label) is (right == "builtin"), key
    assert mv.stats["timeout"] == 0 and mv.stats["error"] == 0
