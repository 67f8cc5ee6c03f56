"""Adversarial model output cannot stall scoring: linear-time brace handling and size caps.

The one-pass `strip_outer_braces` and `_replace_text_groups` are checked against the simple
(quadratic) reference implementations they replaced, on tricky and on random inputs; the
timing tests use bounds that a quadratic implementation would miss by minutes.
"""

import random
import time

import pytest

from da3po_jax.rewards import RewardScorer, normalize_answer
from da3po_jax.rewards.extract import extract_answer, find_closing_brace
from da3po_jax.rewards.normalize import (
    _TEXT_RE,
    _UNIT_POWER_RE,
    _UNIT_TEXT_RE,
    _replace_text_groups,
    strip_outer_braces,
)
from da3po_jax.rewards.scorer import MAX_ANSWER_CHARS, MAX_RESPONSE_CHARS

MB = 1_000_000
TIMEOUT_S = 1.0


def reference_strip_outer_braces(s: str) -> str:
    """The previous (quadratic) implementation: the behaviour to keep."""
    while s.startswith("{") and find_closing_brace(s, 0) == len(s) - 1:
        s = s[1:-1].strip()
    return s


def reference_replace_text_groups(s: str) -> str:
    """The previous (quadratic) implementation: the behaviour to keep."""
    out = []
    pos = 0
    while True:
        m = _TEXT_RE.search(s, pos)
        if m is None:
            break
        close = find_closing_brace(s, m.end() - 1)
        if close is None:
            break
        content = s[m.end() : close]
        rest = s[close + 1 :].strip()
        prefix = "".join(out) + s[pos : m.start()]
        is_unit = (
            _UNIT_TEXT_RE.fullmatch(content.strip()) is not None
            and prefix.strip() != ""
            and (rest == "" or _UNIT_POWER_RE.fullmatch(rest) is not None)
        )
        out.append(s[pos : m.start()])
        if is_unit:
            return "".join(out)
        out.append(content)
        pos = close + 1
    out.append(s[pos:])
    return "".join(out)


BRACE_CASES = [
    ("", ""),
    ("{", "{"),
    ("}", "}"),
    ("{}", ""),
    ("{ }", ""),
    ("{{}}", ""),
    ("{5}", "5"),
    ("{{5}}", "5"),
    ("{ {5} }", "5"),
    ("{ \t{\n5\n}\t }", "5"),
    (" {5}", " {5}"),  # no stripping unless a brace pair is removed
    ("{5} ", "{5} "),
    ("{a}{b}", "{a}{b}"),
    ("{{a}{b}}", "{a}{b}"),
    ("{a}}", "{a}}"),
    ("{{a}", "{{a}"),
    ("{{a}}}", "{{a}}}"),
    ("{\\}}", "\\}"),  # an escaped brace is a character
    ("{\\{}", "\\{"),
    ("{a\\}", "{a\\}"),  # the last brace is escaped: unbalanced
    ("{a\\\\}", "a\\\\"),  # an escaped backslash does not escape the brace
    ("\\{a\\}", "\\{a\\}"),
    ("{\\{a\\}}", "\\{a\\}"),
    ("{{\\}}}", "\\}"),
    ("{ {a\\ } }", "a\\"),
    ("{ {a\\} }", "{ {a\\} }"),  # the inner group never closes
    ("{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("{{1}{2}} ", "{{1}{2}} "),
    ("{{{x}} }", "x"),
]

TEXT_CASES = [
    ("\\text{a}", "a"),
    ("\\text{(B)}", "(B)"),
    ("5\\text{ cm}", "5"),
    ("5\\text{ cm}^2", "5"),
    ("5\\text{cm} ^{3}  ", "5"),
    ("5 \\text{cm}  \t^2 ", "5 "),
    ("5\\text{cm}^4", "5cm^4"),  # not a unit power
    ("5\\text{cm}^{2", "5"),  # `^{2` counts as a power
    ("5\\text{cm} x ^2", "5cm x ^2"),
    ("\\text{cm}", "cm"),  # nothing before: not a unit
    ("  \\text{cm}", "  cm"),
    ("\\text{}", ""),
    ("1\\text{}", "1"),
    ("1\\text{ }", "1 "),
    ("\\text{\\text{a}}", "\\text{a}"),  # only top-level groups are unwrapped
    ("\\text{a{b}c}", "a{b}c"),
    ("1\\text{a{b}}", "1a{b}"),
    ("\\text{a{b}", "\\text{a{b}"),  # unbalanced: untouched
    ("x\\text{a}\\text{b", "xa\\text{b"),
    ("\\text{a\\}b}", "a\\}b"),
    ("\\text{\\{1\\}}", "\\{1\\}"),
    ("\\text{a}\\text{b}", "a"),  # the second group is a trailing unit after `a`
    ("\\text{a}1\\text{b}", "a1"),
    ("1\\text{a} 2", "1a 2"),
    ("1\\text{ cm} x", "1 cm x"),
    ("\\mbox {x}", "x"),
    ("2\\textbf{B}", "2"),
    ("\\text{1}" * 5, "11111"),
    ("1" + "\\text{a}" * 5, "1aaaa"),
    ("1\\text{ cm}^2 ^2", "1 cm^2 ^2"),
    ("\\\\text{a}", "\\"),  # the regex does not look at escapes (as before)
]


@pytest.mark.parametrize("s, expected", BRACE_CASES)
def test_strip_outer_braces_matches_the_reference(s, expected):
    assert reference_strip_outer_braces(s) == expected
    assert strip_outer_braces(s) == expected


@pytest.mark.parametrize("s, expected", TEXT_CASES)
def test_replace_text_groups_matches_the_reference(s, expected):
    assert reference_replace_text_groups(s) == expected
    assert _replace_text_groups(s) == expected


def test_brace_functions_match_the_reference_on_random_inputs():
    pieces = ["{", "}", "\\", " ", "\t", "\n", "a", "5", "cm", " cm", "^", "^2", "^{3}", "2"]
    pieces += ["\\text{", "\\text {", "\\mbox{", "\\{", "\\}", "x", "."]
    rng = random.Random(0)
    for _ in range(5_000):
        s = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        assert strip_outer_braces(s) == reference_strip_outer_braces(s), s
        assert _replace_text_groups(s) == reference_replace_text_groups(s), s
        assert strip_outer_braces("{" + s + "}") == reference_strip_outer_braces("{" + s + "}")


def _nested(n: int) -> str:
    return "{" * n + "5" + "}" * n


def _elapsed(fn, arg) -> float:
    start = time.perf_counter()
    fn(arg)
    return time.perf_counter() - start


@pytest.mark.parametrize(
    "fn, text, expected",
    [
        (strip_outer_braces, _nested(MB // 2), "5"),
        (_replace_text_groups, "\\text{a}" * (MB // 8), "a" * (MB // 8 - 1)),  # last: a unit
        (normalize_answer, _nested(MB // 2), "5"),
        (normalize_answer, "\\text{" + _nested(MB // 2) + "}", "5"),
    ],
    ids=["strip_outer_braces", "replace_text_groups", "normalize_nested", "normalize_text"],
)
def test_one_megabyte_input_takes_under_seconds(fn, text, expected):
    start = time.perf_counter()
    assert fn(text) == expected
    # About 0.5 s here; the quadratic versions took minutes (1 MB of `\text{a}`: 1-2 min).
    assert time.perf_counter() - start < 5.0


@pytest.mark.parametrize(
    "fn, make",
    [
        (strip_outer_braces, _nested),
        (_replace_text_groups, lambda n: "1" + "\\text{a}" * (n // 4)),
        (normalize_answer, _nested),
    ],
    ids=["strip_outer_braces", "replace_text_groups", "normalize_answer"],
)
def test_brace_functions_scale_linearly(fn, make):
    small, large = make(16_000), make(128_000)
    t_small = min(_elapsed(fn, small) for _ in range(3))
    t_large = min(_elapsed(fn, large) for _ in range(3))
    # 8x the input: about 8x the time if linear, 64x if quadratic. The floor keeps timer
    # noise on a tiny `t_small` from failing the test.
    assert t_large < 20 * max(t_small, 2e-3), (t_small, t_large)


def test_extract_answer_max_chars():
    assert extract_answer("\\boxed{12}", max_chars=2) == "12"
    assert extract_answer("\\boxed{123}", max_chars=2) is None
    assert extract_answer("\\boxed{123}") == "123"
    assert extract_answer("Answer: 123", max_chars=2) is None
    assert extract_answer("Answer: \\boxed{12} ", max_chars=2) == "12"
    assert extract_answer("\\boxed 123", max_chars=2) is None
    assert extract_answer("\\boxed{" + "{" * MB + "}" * MB + "}", max_chars=10) is None
    assert find_closing_brace("{ab}", 0, max_len=2) == 3
    assert find_closing_brace("{abc}", 0, max_len=2) is None


@pytest.fixture(scope="module")
def math_scorer():
    with RewardScorer(num_workers=1, timeout_s=20.0) as scorer:
        yield scorer


def test_huge_answers_are_scored_quickly_in_the_parent(math_scorer):
    responses = [
        "\\boxed{" + _nested(MB // 2) + "}",  # 1 MB nested braces
        "\\boxed{" + "\\text{a}" * (MB // 8) + "}",  # 1 MB of `\text{a}`
        "Answer: " + "\\text{a}" * (MB // 8),
        "Answer: " + _nested(MB // 2),
        "x" * MAX_RESPONSE_CHARS + "\\boxed{5}",  # past the response cap
        "\\boxed{" + "1" * (MAX_ANSWER_CHARS + 1) + "}",  # past the answer cap
        "\\boxed{" + _nested(2_000) + "}",  # under the cap: normalised to 5
        "\\boxed{" + "\\text{1}" * 500 + "}",  # 4,000 characters: the number 11...1
    ]
    references = ["5", "a", "a", "5", "5", "1", "5", "1" * 500]
    start = time.perf_counter()
    batch = math_scorer.score_batch(responses, references)
    assert time.perf_counter() - start < 5.0  # typically well under 1 s
    assert [r.status for r in batch.results] == ["no_answer"] * 6 + ["ok", "ok"]
    assert batch.correct == [False] * 6 + [True, True]
    assert [r.extracted for r in batch.results[:6]] == [None] * 6
    assert math_scorer._pool.workers == []  # all decided in the parent
    assert batch.stats["no_answer"] == 6 and batch.stats["symbolic"] == 0


def hanging_verify(pred: str, ref: str) -> bool:
    """A custom verifier (runs in the workers) that hangs on demand."""
    if pred == "HANG":
        time.sleep(60)
    return pred == ref


def test_hanging_verification_times_out_next_to_huge_responses():
    with RewardScorer(num_workers=2, timeout_s=TIMEOUT_S, verify_fn=hanging_verify) as scorer:
        scorer.score_batch(["Answer: warm", "Answer: up"], ["warm", "up"])  # start the workers
        responses = [
            "\\boxed{" + _nested(MB // 2) + "}",
            "\\boxed{" + "\\text{a}" * (MB // 8) + "}",
            "Answer: HANG",
            "Answer: a",
        ]
        start = time.perf_counter()
        batch = scorer.score_batch(responses, ["5", "a", "x", "a"])
        elapsed = time.perf_counter() - start
    assert [r.status for r in batch.results] == ["no_answer", "no_answer", "timeout", "ok"]
    assert batch.correct == [False, False, False, True]
    assert TIMEOUT_S <= elapsed < TIMEOUT_S + 10.0  # killed at the limit, not waited for


def test_answers_past_the_cap_are_compared_only_as_exact_text(math_scorer):
    big = "7" * MB
    responses = [
        "\\boxed{" + big + "}",  # the reference itself: correct, with no parsing
        "\\boxed{" + big[:-1] + "8}",  # one digit off: no usable answer, as before
        "The answer is " + big,  # a phrase, read the same way
        "x" * MB + " " + big,  # past the fallback's last-number window: none, not a piece
        "\\boxed{" + "7" * (2 * MB + 8) + "}",  # longer than twice the reference: not read
    ]
    start = time.perf_counter()
    batch = math_scorer.score_batch(responses, [big] * len(responses))
    assert time.perf_counter() - start < 5.0
    assert batch.correct == [True, False, True, False, False]
    assert [r.status for r in batch.results] == ["ok", "no_answer", "ok"] + ["no_answer"] * 2
    assert batch.stats["symbolic"] == 0
