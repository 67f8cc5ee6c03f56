"""Final-answer extraction: `Answer:` lines, nested and multiple boxes, malformed input."""

import time

import pytest

from da3po_jax.rewards import extract_answer, extract_answer_line, extract_boxed
from da3po_jax.rewards.extract import extract_reference, find_closing_brace, last_expression


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
        ("**Answer:** $7$", "7"),  # markdown emphasis removed, the math span read
        ("Answer:\n\\[\n\\frac{9}{4}\n\\]", "\\frac{9}{4}"),  # display math on the next lines
        ("Final Answer: The final answer is $9$. I hope it is correct.", "9"),
        ("Answer: 5 apples. Checked twice.", "5"),  # first sentence; a number and a unit
        ("Answer: $2$ and $3$", "$2$ and $3$"),  # several spans: the whole line
        ("\u0130stanbul. ANSWER: 4\nanswers: none", "4"),  # lower() changes the length
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


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Adding the cases, the answer is \\[ 9 \\]", "9"),
        ("the final answer is: $(2, -3)$", "(2, -3)"),
        ("So the answer is **12**.", "12"),
        ("The answer is 5 apples.", "5"),
        ("The answer is 5 but I never box it", "5 but I never box it"),  # not only a unit
        ("The answer is 1 or 2.", "1 or 2"),  # a set, not the number 1
        ("the answer is $\\boxed{4}$", "4"),
        ("\\boxed{4}. To check whether the answer is 5: no.", "4"),  # a box outranks a phrase
        ("Answer: 6. Is the answer is 7?", "6"),  # so does an `Answer:` line
        ("The answer is $\\$12$", "\\$12"),  # an escaped dollar inside the span
    ],
)
def test_an_answer_is_phrase_states_the_answer_when_no_box_or_line_does(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The sum is therefore\n\\[\n\\frac{7}{2}\n\\]", "\\frac{7}{2}"),
        ("Collecting terms we arrive at\n$$x = -4$$", "-4"),  # a variable's value
        ("So the total area is $24\\pi$.", "24\\pi"),
        ("The probability is \\(\\frac{1}{3}\\).", "\\frac{1}{3}"),
        ("Therefore, Janet has 18 dollars left.", "18"),
        ("We find $a=3$, so $a+b = 7$.", "7"),  # the value of an expression
        ("We get $y = 2x$.", "y = 2x"),  # an equation stays whole
        ("$x <= 4$", "x <= 4"),  # so does a relation
        ("Side $6$ cm, so the perimeter is 24 cm.", "24"),  # a later number wins
        ("It costs $5 and $x$ is 3", "3"),  # odd `$` count: prices, not math
        ("It costs 1,250.", "1,250"),
        ("Nothing to see here.", None),
        ("So " + "7" * 100, None),  # a number longer than the window: none, not a piece
        ("Hence there are 1 000 000 ways.", "1 000 000"),
    ],
)
def test_last_expression_fallback(text, expected):
    assert last_expression(text) == expected
    assert extract_answer(text, fallback="last_expression") == expected
    assert extract_answer(text) is None  # the default: no marker, no answer
    assert extract_answer("\\boxed{1" + text, fallback="last_expression") is None  # malformed


def test_unknown_fallback_is_rejected():
    with pytest.raises(ValueError, match="fallback must be one of"):
        extract_answer("5", fallback="last_number")


@pytest.mark.parametrize(
    "reference, expected",
    [
        ("We get $\\sqrt{8}=\\boxed{2\\sqrt2}$.", "2\\sqrt2"),
        ("48+24 = <<48+24=72>>72 clips.\n#### 72", "72"),
        ("The answer is $12$.", "12"),
        ("Answer: 7", "7"),
        ("$\\frac{1}{2}$", "\\frac{1}{2}"),
        ("\\(x = 5\\)", "x = 5"),
        ("$x$ and $y$", "$x$ and $y$"),  # two spans, not one
        ("1, 2, 3", "1, 2, 3"),  # a bare reference is never cut to its last number
        ("x = 5", "x = 5"),
        ("\\text{Monday}", "\\text{Monday}"),
    ],
)
def test_extract_reference(reference, expected):
    assert extract_reference(reference) == expected


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
        "answer is " * 100_000,
        "answer" + " " * 500_000 + "is",
        "Answer: $" + "x" * 1_000_000,  # a span that never closes
        "$" * 1_000_000,
        "\\$" * 500_000 + "$",
        "\\[" * 500_000 + "\\]",
        "1" * 1_000_000,
        "-1," * 300_000,
        "\\fbox" * 200_000,
    ],
)
def test_extraction_is_linear_on_adversarial_text(text):
    start = time.perf_counter()
    extract_answer(text)
    extract_answer(text, max_chars=4_096, fallback="last_expression")
    extract_reference(text)
    assert time.perf_counter() - start < 2.0
