"""Answer equivalence: a table of equivalent and non-equivalent answers, normalisation, exact
numbers, the whitelist parser's limits and adversarial inputs (all in-process)."""

import time
from fractions import Fraction

import pytest

from da3po_jax.rewards import (
    ParseError,
    eval_rational,
    fast_verdict,
    is_equivalent,
    normalize_answer,
    parse_math,
    parse_number,
    split_sequence,
)
from da3po_jax.rewards.numeric import TooLarge

BIG = "1" + "0" * 1000  # 10^1000 written out

EQUIVALENT = [
    ("\\frac{1}{2}", "0.5"),
    ("\\frac{1}{2}", "1/2"),
    ("\\dfrac{1}{2}", "\\frac12"),
    ("\\tfrac{3}{4}", "0.75"),
    ("1,000", "1000"),
    ("1{,}000{,}000", "1000000"),
    ("1\\,000", "1000"),
    ("$5$", "5"),
    ("\\(5\\)", "5"),
    ("5\\text{ cm}", "5"),
    ("12 \\text{ square units}", "12"),
    ("5 cm", "5"),
    ("\\$12", "12"),
    ("30^\\circ", "30"),
    ("50\\%", "50"),
    ("\\left(1, 2\\right)", "(1,2)"),
    ("\\left[ 1, 2 \\right)", "[1,2)"),
    ("5.", "5"),
    ("x=5", "5"),
    ("x = \\frac{1}{2}", "0.5"),
    ("y=2x+1", "2x+1"),
    ("x \\in [1,2]", "[1,2]"),
    ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}"),
    ("2\\pi", "\\pi*2"),
    ("\\pi \\cdot 2", "2\\pi"),
    ("-3", "-3.0"),
    ("-0", "0"),
    ("-\\frac{1}{2}", "\\frac{-1}{2}"),
    ("10^{1000}", BIG),
    ("1.5e3", "1500"),
    ("2\\times 10^{3}", "2000"),
    ("2.5\\cdot10^{-1}", "0.25"),
    ("2^{10}", "1024"),
    ("\\frac{6}{4}", "1.5"),
    ("0.1+0.2", "0.3"),  # exact rationals: no floating-point error
    (".5", "0.5"),
    ("2\\frac{1}{2}", "2.5"),  # mixed number
    ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}"),
    ("\\sqrt{8}", "2\\sqrt{2}"),
    ("3\\sqrt{2}", "\\sqrt{18}"),
    ("\\sqrt[3]{8}", "2"),
    ("\\sqrt{3+2\\sqrt{2}}", "1+\\sqrt{2}"),
    ("x^2+2x+1", "(x+1)^2"),
    ("\\frac{x}{2}", "0.5x"),
    ("\\sin^2 x + \\cos^2 x", "1"),
    ("e^{i\\pi}", "-1"),
    ("\\ln(e^2)", "2"),
    ("3+4i", "4i+3"),
    ("a_1 + a_2", "a_2+a_1"),
    ("\u03c0/2", "\\frac{\\pi}{2}"),  # Unicode pi
    ("\\boxed{7}", "7"),
    ("\\{1, 2\\}", "\\{2, 1\\}"),  # sets are unordered
    ("1, 2, 3", "3,2,1"),  # so are bare lists
    ("(1/2, 3)", "(\\frac{1}{2}, 3)"),  # tuples compare element-wise
    ("[0, \\infty)", "[0,\\infty)"),
    ("-\\infty", "-1\\cdot\\infty"),
    ("\\text{Monday}", "monday"),
]

NOT_EQUIVALENT = [
    ("\\frac{1}{2}", "0.51"),
    ("0.333", "\\frac{1}{3}"),  # exact comparison, no rounding
    ("50\\%", "0.5"),  # a percentage is not the fraction
    ("(1, 2)", "[1, 2]"),  # interval types differ
    ("(1, 2)", "(2, 1)"),  # tuples are ordered
    ("(1,2)", "(1,2,3)"),
    ("-5", "5"),
    ("1,000", "1"),
    ("10^{1000}", "1" + "0" * 999 + "1"),
    ("\\sqrt{2}", "1.41421356"),
    ("\\pi", "3.14159"),
    ("x+1", "x-1"),
    ("x^2", "2x"),
    ("2\\pi", "\\pi"),
    ("2\\frac{1}{2}", "1"),  # a mixed number, not 2 * 1/2
    ("\\infty", "-\\infty"),
    ("\\frac{1}{0}", "1"),
    ("\\text{Monday}", "Tuesday"),
    ("", "5"),
    ("\\frac{1}{2} \\text{ and } \\frac{1}{3}", "\\frac{1}{2}"),
]


@pytest.mark.parametrize("pred, ref", EQUIVALENT)
def test_equivalent(pred, ref):
    assert is_equivalent(pred, ref)
    assert is_equivalent(ref, pred)


@pytest.mark.parametrize("pred, ref", NOT_EQUIVALENT)
def test_not_equivalent(pred, ref):
    assert not is_equivalent(pred, ref)
    assert not is_equivalent(ref, pred)


@pytest.mark.parametrize(
    "pred, ref, verdict",
    [
        ("1,000", "1000", True),  # normalised string match
        ("\\frac{1}{2}", "0.5", True),  # exact numbers
        ("2\\cdot 3+1", "7", True),  # rational arithmetic
        ("0.333", "\\frac{1}{3}", False),
        ("monday", "tuesday", False),  # words: outside the parser, string compare only
        ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", None),  # needs sympy
        ("(1, \\sqrt{2})", "(1, \\sqrt{3})", None),
        ("(1, 2)", "(1, 3)", False),
    ],
)
def test_fast_verdict_decides_without_sympy_when_it_can(pred, ref, verdict):
    assert fast_verdict(pred, ref) is verdict


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("  $\\dfrac{1}{2}$. ", "\\frac{1}{2}"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("1,234,567.5", "1234567.5"),
        ("(1,000)", "(1,000)"),  # thousands separators only in a lone number
        ("10\\text{ cm}^2", "10"),
        ("\\text{(B)}", "(B)"),
        ("\\pi r^2", "\\pi r^2"),  # the space after a command before a letter is kept
        ("\\frac12", "\\frac{1}{2}"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("-3/4", "-\\frac{3}{4}"),
        ("x \\le 3", "x\\leq3"),
        ("{{5}}", "5"),
        ("No Solution", "nosolution"),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


@pytest.mark.parametrize(
    "s, value",
    [
        ("42", Fraction(42)),
        ("-0.125", Fraction(-1, 8)),
        ("1.5e-3", Fraction(3, 2000)),
        ("3\\times10^{2}", Fraction(300)),
        ("-2^{3}", Fraction(-8)),
        ("\\frac{-3}{4}", Fraction(-3, 4)),
        ("7/2", Fraction(7, 2)),
        ("1\\frac{1}{3}", Fraction(4, 3)),
        ("x", None),
        ("1/0", None),
        ("10^{100000}", None),  # past MAX_BITS: not evaluated
        ("1e99999999", None),
        ("9" * 5000, None),  # past MAX_DIGITS
    ],
)
def test_parse_number(s, value):
    assert parse_number(s) == value


def test_split_sequence():
    assert split_sequence("(1,2]") == ("(]", ["1", "2"])
    assert split_sequence("\\{a,b,c\\}") == ("{}", ["a", "b", "c"])
    assert split_sequence("1,(2,3)") == ("", ["1", "(2,3)"])
    assert split_sequence("(1)+(2)") is None
    assert split_sequence("(5)") is None


def test_parser_builds_the_expected_tree():
    assert parse_math("2x^2") == ("mul", ("num", 2), ("pow", ("sym", "x"), ("num", 2)))
    assert parse_math("-2^2") == ("neg", ("pow", ("num", 2), ("num", 2)))
    assert eval_rational(parse_math("\\frac{1}{2}+\\frac{1}{3}")) == Fraction(5, 6)
    assert eval_rational(parse_math("2^{-2}")) == Fraction(1, 4)
    assert eval_rational(parse_math("\\sqrt{4}")) is None  # roots are left to sympy


@pytest.mark.parametrize(
    "s",
    [
        "import os",  # words
        "\\input{x}",  # commands outside the whitelist
        "x<3",
        "3!",
        "|x|",
        "1e5",  # scientific notation is handled by parse_number, not the parser
        "(" * 100 + "1" + ")" * 100,  # nesting past MAX_DEPTH
        "1+" * 300 + "1",  # past MAX_CHARS / MAX_TOKENS
        "2+",
        "",
    ],
)
def test_parser_rejects(s):
    with pytest.raises(ParseError):
        parse_math(s)


def test_rational_power_cap():
    with pytest.raises(TooLarge):
        eval_rational(parse_math("9^{9^{9}}"))


ADVERSARIAL = [
    "9**9**9**9",
    "9^{9^{9^{9}}}",
    "2^{2^{2^{2^{2^{2}}}}}",
    "10^{10^{10}}",
    "1e99999999",
    "(" * 10_000 + "1" + ")" * 10_000,
    "\\frac{" * 5_000 + "1",
    "1" * 1_000_000,
    "1,000" * 200_000 + "x",
    "\\text{" * 20_000 + "a",
    "\\" + "a" * 500_000 + " b",
    "x" + " " * 500_000 + "cm",
    "(" * 3_000 + "1,2" + ")" * 3_000,
    "\\{" * 3_000 + "1,2" + "\\}" * 3_000,
    "\\sqrt[1000000000]{2}",
    "\\sqrt{10^{40000}}",
    "e^{10^{4000}}",
    "(x+1)^{1000000}",
]


@pytest.mark.parametrize("answer", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_adversarial_answers_fail_fast(answer):
    start = time.perf_counter()
    assert not is_equivalent(answer, "1")
    assert time.perf_counter() - start < 2.0
