"""Final-answer extraction: `Answer:` lines, nested and multiple boxes, malformed input."""

import time

import pytest

from da3po_jax.rewards import extract_answer, extract_answer_line, extract_boxed
from da3po_jax.rewards.extract import find_closing_brace


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so the result is \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),  # nested braces
        ("first \\boxed{1}, then \\boxed{2}", "2"),  # last box wins
        ("\\boxed{\\boxed{7}}", "7"),
        ("\\fbox{9}", "9"),
        ("$\\boxed 5$", "5"),  # brace-less form
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped set braces do not count
        ("\\boxed{ }", None),  # empty box
        ("\\boxed{\\frac{1}{2}", None),  # unbalanced: malformed, no answer
        ("\\boxed{3} and later \\boxed{\\frac{1}{2", None),  # last box malformed: no fallback
        ("no box here", None),
        ("\\boxedx{3}", None),  # a different command, not a box
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Reasoning...\nAnswer: 5", "5"),
        ("answer: 1\nmore work\nAnswer: 2\n", "2"),  # last line wins
        ("**Answer:** $7$", "$7$"),  # markdown emphasis removed
        ("Answer:\n  12", "12"),  # answer on the next line
        ("Answer: $\\boxed{3}$ (checked)", "3"),  # a box on the line wins
        ("The answer is 5", None),  # no colon
        ("Answer:   ", None),
    ],
)
def test_extract_answer_line(text, expected):
    assert extract_answer_line(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("\\boxed{4}\nAnswer: 6", "6"),  # the later statement wins
        ("Answer: 6\nActually \\boxed{4}", "4"),
        ("Answer: \\boxed{\\dfrac{3}{4}}\n", "\\dfrac{3}{4}"),
        ("Let me think.", None),
        ("", None),
        (None, None),
    ],
)
def test_extract_answer_picks_the_last_statement(text, expected):
    assert extract_answer(text) == expected


def test_find_closing_brace():
    s = "{a{b}c\\}d}e"
    assert find_closing_brace(s, 0) == 9
    assert find_closing_brace(s, 2) == 4
    assert find_closing_brace("{{}", 0) is None


@pytest.mark.parametrize(
    "text",
    [
        "x" * 1_000_000 + "\\boxed{5}",
        "\\boxed{" * 200_000,  # never closes
        "{" * 500_000 + "\\boxed{1}" + "}" * 10,
        "Answer" + " " * 500_000 + "x",  # backtracking bait for `answer\s*:`
        "answer answer " * 100_000 + "Answer: 3",
        "\\fbox" * 200_000,
    ],
)
def test_extraction_is_linear_on_adversarial_text(text):
    start = time.perf_counter()
    extract_answer(text)
    assert time.perf_counter() - start < 2.0
