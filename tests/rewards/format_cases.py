"""Labelled (family, response, reference, correct?) pairs in the answer formats of real outputs.

Shared by `test_format_cases.py` (the built-in verifier end to end), the Math-Verify agreement
test and `benchmarks/verifier.py`. Unlike `recall_cases.py`, responses are written the way
math models state answers (without a box, with thousands separators, as relations) and
references the way datasets store them (bare answers, worked solutions, `$...$`). Families:

* `unboxed`: `Final Answer: The final answer is $X$. I hope it is correct.`, `the answer is
  \\[ 9 \\]`, `**Answer:** 12`, display math at the end, and with no marker at all the last
  math expression (or number) of the response;
* `thousands`: `10,455`, `14{,}916`, `11,\\! 111`, `1\\,000`, `10 455` against tuples and
  lists (a separator only groups exactly three digits);
* `relation`: relation spellings, mirrored and chained relations, intervals and unions;
* `exact_long`: an answer equal to the reference string, past the parser's size caps;
* `gold_solution`: references that are worked solutions (`\\boxed{}`, `#### 72`, `The answer
  is ...`) or carry `$...$`.

Every family has near-misses that must stay wrong. `MATH_VERIFY_DISAGREEMENTS` labels each
pair on which the `math_verify` backend and the built-in verifier disagree.
"""

from __future__ import annotations

MINERVA = "Final Answer: The final answer is ${}$. I hope it is correct."


def _digits(n: int, seed: int) -> str:
    """A deterministic n-digit integer (no leading zero)."""
    out, x = [], seed
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2**31
        out.append(str(x % 10))
    if out[0] == "0":
        out[0] = "7"
    return "".join(out)


BIG = _digits(5_000, 1)
BIG_OFF = BIG[:-1] + ("1" if BIG[-1] != "1" else "2")  # the last digit changed
BIG_SPACED = " ".join(BIG[i : i + 100] for i in range(0, len(BIG), 100))
TUPLE = "(" + ", ".join(str(i * i) for i in range(1, 1_001)) + ")"
TUPLE_TIGHT = TUPLE.replace(" ", "")
TUPLE_OFF = TUPLE.replace(", 250000,", ", 250001,")
POLY = " + ".join(f"{i}x^{{{i}}}" for i in range(1, 600))
BITS = _digits(4_500, 7).replace("9", "1").replace("8", "0")[:4_500]
GSM = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)
MATH_SOLUTION = (
    "We have $x^2 - 5x + 6 = (x-2)(x-3)$, so the roots are $2$ and $3$. Their product is "
    "$2 \\cdot 3 = \\boxed{6}$."
)

UNBOXED: list[tuple[str, str, str, bool]] = [
    ("unboxed", "So $x = 9$.\n\n" + MINERVA.format("9"), "9", True),
    ("unboxed", MINERVA.format("\\frac{3}{4}"), "0.75", True),
    ("unboxed", MINERVA.format("x^2+2x+1"), "(x+1)^2", True),
    ("unboxed", MINERVA.format("\\text{(C)}"), "C", True),
    ("unboxed", MINERVA.format("(2, -3)"), "(2,-3)", True),
    ("unboxed", "Final Answer: The final answer is 3. I hope it is correct.", "3", True),
    ("unboxed", "Adding the cases, the answer is \\[ 9 \\]", "9", True),
    ("unboxed", "Therefore the answer is\n\\[\n\\frac{7}{2}.\n\\]", "3.5", True),
    ("unboxed", "Counting again gives the same.\n\n**Answer:** 12", "12", True),
    ("unboxed", "**Answer:** $\\sqrt{5}$", "\\sqrt5", True),
    ("unboxed", "Answer:\n\\[\n\\frac{9}{4}\n\\]", "2.25", True),
    ("unboxed", "The sum is therefore\n\\[\n\\frac{7}{2}\n\\]", "3.5", True),
    ("unboxed", "Collecting terms we arrive at\n$$x = -4$$", "-4", True),
    ("unboxed", "### Final Answer\n\\[ 42 \\]", "42", True),
    ("unboxed", "**Final Answer**\n\n$$\\frac{1}{6}$$", "1/6", True),
    ("unboxed", "So the total area is $24\\pi$.", "24\\pi", True),
    ("unboxed", "Therefore, Janet has 18 dollars left.", "18", True),
    ("unboxed", "We find $a=3$ and $b=4$, so $a+b = 7$.", "7", True),
    ("unboxed", "The final answer is: $(2, -3)$", "(2,-3)", True),
    ("unboxed", "Hence, the answer is $\\sqrt{5}$.", "\\sqrt{5}", True),
    ("unboxed", "The answer is: 7", "7", True),
    ("unboxed", "so the answer is \\(\\dfrac{5}{2}\\).", "2.5", True),
    ("unboxed", "The answer is 5 apples.", "5", True),
    ("unboxed", "So the answer is **12**.", "12", True),
    ("unboxed", "Final answer: 1/2", "\\frac{1}{2}", True),
    (
        "unboxed",
        "The answer is $\\frac{\\pi}{4}$, since the angle is half.",
        "\\frac{\\pi}{4}",
        True,
    ),
    ("unboxed", "Thus the final answer is $\\text{Monday}$.", "Monday", True),
    ("unboxed", "$\\boxed{5}$\n\nTo double check whether the answer is right: 2+3=5.", "5", True),
    ("unboxed", "The probability is \\(\\frac{1}{3}\\).", "\\frac13", True),
    ("unboxed", "Each side measures $6$ cm, so the perimeter is $24$ cm.", "24", True),
    ("unboxed", "Answer: $2$ and $3$", "2, 3", True),
    ("unboxed", "The answer is $2$ or $-3$.", "-3, 2", True),
    # near-misses: a wrong value in the same format, an intermediate value, a retraction
    ("unboxed", "So $x = 8$.\n\n" + MINERVA.format("8"), "9", False),
    ("unboxed", MINERVA.format("(2, 3)"), "(2,-3)", False),
    ("unboxed", MINERVA.format("\\frac{4}{3}"), "0.75", False),
    ("unboxed", "Adding the cases, the answer is \\[ 10 \\]", "9", False),
    ("unboxed", "**Answer:** 13", "12", False),
    ("unboxed", "The sum is therefore\n\\[\n\\frac{7}{3}\n\\]", "3.5", False),
    ("unboxed", "Therefore, Janet has 17 dollars left.", "18", False),
    ("unboxed", "Let me compute step by step. First 12 + 7", "19", False),
    ("unboxed", "So the total area is $12\\pi$.", "24\\pi", False),
    ("unboxed", "$\\boxed{4}$. To check whether the answer is 5: no.", "5", False),
    ("unboxed", "The answer is not 12; it is 13.", "12", False),
    ("unboxed", "The answer is 5 but I never box it", "5", False),
    ("unboxed", "I could not finish the computation.", "0", False),
    ("unboxed", "We get $x = 3$ and then $y = 2x$.", "6", False),
    ("unboxed", "Answer: $2$ and $4$", "2, 3", False),
    ("unboxed", "The answer is $2$.", "-3, 2", False),
    ("unboxed", "There are 12 eggs and she eats 3 of them, so 9 remain.", "3", False),
    ("unboxed", "I first thought the answer is 5. No: the answer is 6.", "5", False),
]

THOUSANDS: list[tuple[str, str, str, bool]] = [
    ("thousands", "\\boxed{10,455}", "10455", True),
    ("thousands", "\\boxed{14{,}916}", "14916", True),
    ("thousands", "\\boxed{11,\\! 111}", "11111", True),
    ("thousands", "\\boxed{11,\\!111}", "11111", True),
    ("thousands", "\\boxed{1\\,000}", "1000", True),
    ("thousands", "\\boxed{10 455}", "10455", True),
    ("thousands", "\\boxed{1,234,567}", "1234567", True),
    ("thousands", "\\boxed{1{,}000{,}000}", "1000000", True),
    ("thousands", "\\boxed{1,000,000}", "10^6", True),
    ("thousands", "\\boxed{100\\,000}", "100000", True),
    ("thousands", "\\boxed{-3,000}", "-3000", True),
    ("thousands", "\\boxed{12,345.67}", "12345.67", True),
    ("thousands", "\\boxed{\\$1,250}", "1250", True),
    ("thousands", "\\boxed{5,000 \\text{ dollars}}", "5000", True),
    ("thousands", "\\boxed{2,019}", "2019", True),
    ("thousands", MINERVA.format("10,455"), "10455", True),
    ("thousands", "The answer is 2,500.", "2500", True),
    ("thousands", "So she earns $\\$12{,}500$ per year.", "12500", True),
    ("thousands", "**Answer:** 14,916", "14916", True),
    ("thousands", "\\boxed{10455}", "10,455", True),
    ("thousands", "Answer: 14916", "14{,}916", True),
    ("thousands", "\\boxed{11111}", "11,\\!111", True),
    ("thousands", "\\boxed{1000}", "1\\,000", True),
    ("thousands", "\\boxed{x = 10{,}455}", "10455", True),
    ("thousands", "\\boxed{(1,2)}", "(1, 2)", True),
    ("thousands", "Hence there are 1 000 000 ways.", "10^6", True),
    ("thousands", "\\boxed{1, 2, 3}", "3, 2, 1", True),
    # near-misses: a different number, a tuple or list, groups that are not three digits
    ("thousands", "\\boxed{10,455}", "10455.5", False),
    ("thousands", "\\boxed{10,456}", "10455", False),
    ("thousands", "\\boxed{11,\\! 112}", "11111", False),
    ("thousands", "\\boxed{14{,}916}", "14.916", False),
    ("thousands", "\\boxed{(1,2)}", "12", False),
    ("thousands", "\\boxed{1, 2, 3}", "123", False),
    ("thousands", "\\boxed{1,2}", "12", False),
    ("thousands", "\\boxed{1,23}", "123", False),
    ("thousands", "\\boxed{12,34}", "1234", False),
    ("thousands", "\\boxed{1,0000}", "10000", False),
    ("thousands", "\\boxed{1,000}", "1", False),
    ("thousands", "\\boxed{1,234}", "(1, 234)", False),
    ("thousands", "\\boxed{10 455}", "10455.5", False),
    ("thousands", MINERVA.format("10,454"), "10455", False),
    ("thousands", "Hence there are 1 000 001 ways.", "10^6", False),
]

RELATION: list[tuple[str, str, str, bool]] = [
    ("relation", "\\boxed{x \\gt 3}", "x > 3", True),
    ("relation", "\\boxed{3 \\lt x}", "x > 3", True),
    ("relation", "\\boxed{x \\ge 3}", "3 \\le x", True),
    ("relation", "\\boxed{x \\geq 3}", "[3,\\infty)", True),
    ("relation", "\\boxed{x \u2265 3}", "x \\geq 3", True),
    ("relation", "\\boxed{x \u2264 5}", "(-\\infty, 5]", True),
    ("relation", "\\boxed{x != 2}", "x \\neq 2", True),
    ("relation", "\\boxed{x \u2260 2}", "x \\ne 2", True),
    ("relation", "\\boxed{x <= 4}", "x \\leqslant 4", True),
    ("relation", "\\boxed{n >= 5}", "n \\geq 5", True),
    ("relation", "\\boxed{a \\geq b}", "b \\leq a", True),
    ("relation", "\\boxed{-2 \\le x \\le 7}", "[-2, 7]", True),
    ("relation", "\\boxed{x \\in [-2, 7]}", "-2 \\le x \\le 7", True),
    ("relation", "\\boxed{[-2,7]}", "-2 \\leq x \\leq 7", True),
    ("relation", "\\boxed{[\u22122,7]}", "[-2,7]", True),
    ("relation", "\\boxed{7 \\ge x \\ge -2}", "[-2,7]", True),
    ("relation", "\\boxed{-2 \\lt x \\lt 7}", "(-2, 7)", True),
    ("relation", "\\boxed{x \\in \\left[ -2, 7 \\right]}", "[-2,7]", True),
    ("relation", "\\boxed{1 < x \\le 4}", "(1, 4]", True),
    ("relation", "\\boxed{x\\in(-\\infty,3)}", "x<3", True),
    ("relation", "\\boxed{t \\geq 0}", "[0, \\infty)", True),
    ("relation", "\\boxed{x > -\\sqrt{2}}", "(-\\sqrt{2}, \\infty)", True),
    ("relation", "\\boxed{x > \\frac{1}{2}}", "(\\frac12, \\infty)", True),
    ("relation", "\\boxed{x <= -1 \\text{ or } x >= 3}", "(-\\infty,-1]\\cup[3,\\infty)", True),
    (
        "relation",
        "\\boxed{x \\in (-\\infty, -1] \\cup [3, \\infty)}",
        "x \\le -1 or x \\ge 3",
        True,
    ),
    ("relation", "\\boxed{x < -2 \\text{ or } x > 2}", "(-\\infty,-2) \\cup (2,\\infty)", True),
    ("relation", "\\boxed{x \\in [1, 3) \\cup (5, 8]}", "(5,8] \\cup [1,3)", True),
    ("relation", "\\boxed{x \\neq 0}", "(-\\infty, 0) \\cup (0, \\infty)", True),
    ("relation", "\\boxed{(-\\infty, 2) \\cup (2, \\infty)}", "x \\ne 2", True),
    ("relation", "\\boxed{x \\geq -2 \\text{ and } x \\leq 7}", "[-2, 7]", True),
    ("relation", "\\boxed{x > 1 \\text{ and } x < 4}", "1 < x < 4", True),
    ("relation", "The solution set is $x \\ge 3$.", "[3, \\infty)", True),
    ("relation", MINERVA.format("-2 \\le x \\le 7"), "[-2,7]", True),
    # near-misses: strict against non-strict, open against closed, the other direction
    ("relation", "\\boxed{x>3}", "x\\ge 3", False),
    ("relation", "\\boxed{[\u22122,7]}", "(\u22122,7)", False),
    ("relation", "\\boxed{[-2,7]}", "(-2,7)", False),
    ("relation", "\\boxed{x \\gt 3}", "x < 3", False),
    ("relation", "\\boxed{3 \\lt x}", "x \\lt 3", False),
    ("relation", "\\boxed{-2 \\le x < 7}", "[-2,7]", False),
    ("relation", "\\boxed{x \\in (-2, 7]}", "-2 \\le x \\le 7", False),
    ("relation", "\\boxed{x < -1 \\text{ or } x > 3}", "(-\\infty,-1]\\cup[3,\\infty)", False),
    ("relation", "\\boxed{x \\neq 2}", "x \\neq 3", False),
    ("relation", "\\boxed{x \\le 5}", "x \\ge 5", False),
    ("relation", "\\boxed{x \\geq 3}", "(3,\\infty)", False),
    ("relation", "\\boxed{x \u2264 5}", "(-\\infty,5)", False),
    ("relation", "\\boxed{x \\geq -2 \\text{ and } x \\leq 7}", "(-2, 7)", False),
    ("relation", "\\boxed{x \\neq 0}", "(-\\infty, 0) \\cup (1, \\infty)", False),
    ("relation", "\\boxed{x > 1 \\text{ or } x < 4}", "1 < x < 4", False),
    ("relation", "\\boxed{x \\in [1, 3) \\cup (5, 8]}", "[1,3] \\cup (5,8]", False),
]

EXACT_LONG: list[tuple[str, str, str, bool]] = [
    ("exact_long", "\\boxed{" + BIG + "}", BIG, True),
    ("exact_long", "Answer: " + BIG, BIG, True),
    ("exact_long", "The number is\n\\boxed{" + BIG_SPACED + "}", BIG, True),
    ("exact_long", "\\boxed{" + BIG + "}", BIG_SPACED, True),
    ("exact_long", "\\boxed{" + TUPLE + "}", TUPLE_TIGHT, True),
    ("exact_long", "\\boxed{" + POLY + "}", POLY, True),
    ("exact_long", "Answer: " + BITS, BITS, True),
    ("exact_long", "\\boxed{" + BIG + "}", "$" + BIG + "$", True),
    # near-misses: one digit, one element, one digit fewer, a short reference
    ("exact_long", "\\boxed{" + BIG_OFF + "}", BIG, False),
    ("exact_long", "\\boxed{" + BIG[:-1] + "}", BIG, False),
    ("exact_long", "\\boxed{" + TUPLE_OFF + "}", TUPLE_TIGHT, False),
    ("exact_long", "\\boxed{" + BIG + "}", "5", False),
    ("exact_long", "\\boxed{" + POLY + " + 1}", POLY, False),
    ("exact_long", "Answer: " + BITS[1:], BITS, False),
]

GOLD_SOLUTION: list[tuple[str, str, str, bool]] = [
    ("gold_solution", "\\boxed{6}", MATH_SOLUTION, True),
    ("gold_solution", "The product of the roots is 6.", MATH_SOLUTION, True),
    ("gold_solution", "The answer is 72.", GSM, True),
    ("gold_solution", "\\boxed{72}", GSM, True),
    ("gold_solution", "\\boxed{0.5}", "$\\frac{1}{2}$", True),
    ("gold_solution", "\\boxed{5}", "$x=5$", True),
    ("gold_solution", "\\boxed{12}", "The answer is $12$.", True),
    ("gold_solution", "**Answer:** 7", "Answer: 7", True),
    ("gold_solution", "\\boxed{1200}", "She pays 4 * 300 = <<4*300=1200>>1,200.\n#### 1,200", True),
    ("gold_solution", "\\boxed{(2,3)}", "$(2, 3)$", True),
    ("gold_solution", "\\boxed{18}", "$\\$18$", True),
    ("gold_solution", "\\boxed{\\frac{3}{4}}", "Hence $p = \\boxed{\\dfrac{3}{4}}$.", True),
    (
        "gold_solution",
        MINERVA.format("\\frac{\\sqrt{3}}{2}"),
        "Since $\\sin 60^\\circ = \\frac{\\sqrt3}{2}$, "
        "the answer is $\\boxed{\\frac{\\sqrt{3}}{2}}$.",
        True,
    ),
    (
        "gold_solution",
        "\\boxed{x \\ge 3}",
        "Solving, $x \\geq 3$, that is $\\boxed{[3, \\infty)}$.",
        True,
    ),
    ("gold_solution", "\\boxed{8}", "So $x=4$, and thus $y = 2x = \\boxed{8}$.", True),
    (
        "gold_solution",
        "\\boxed{\\text{(B)}}",
        "The correct option is $\\boxed{\\text{(B)}}$.",
        True,
    ),
    (
        "gold_solution",
        "\\boxed{-1}",
        "Final Answer: The final answer is $-1$. I hope it is correct.",
        True,
    ),
    ("gold_solution", "\\boxed{10}", "$$10$$", True),
    ("gold_solution", "\\boxed{10}", "\\(10\\)", True),
    ("gold_solution", "\\boxed{2\\sqrt{2}}", "We get $\\sqrt{8}=\\boxed{2\\sqrt2}$", True),
    # near-misses: an intermediate value of the solution, a wrong final value
    ("gold_solution", "\\boxed{4}", "So $x=4$, and thus $y = 2x = \\boxed{8}$.", False),
    ("gold_solution", "\\boxed{5}", MATH_SOLUTION, False),
    ("gold_solution", "\\boxed{2}", MATH_SOLUTION, False),
    ("gold_solution", "\\boxed{24}", GSM, False),
    ("gold_solution", "The answer is 71.", GSM, False),
    ("gold_solution", "\\boxed{0.25}", "$\\frac{1}{2}$", False),
    ("gold_solution", "\\boxed{11}", "The answer is $12$.", False),
    ("gold_solution", "\\boxed{(3,2)}", "$(2, 3)$", False),
    (
        "gold_solution",
        "\\boxed{1201}",
        "She pays 4 * 300 = <<4*300=1200>>1,200.\n#### 1,200",
        False,
    ),
    (
        "gold_solution",
        "\\boxed{1}",
        "Final Answer: The final answer is $-1$. I hope it is correct.",
        False,
    ),
    (
        "gold_solution",
        "\\boxed{x > 3}",
        "Solving, $x \\geq 3$, that is $\\boxed{[3, \\infty)}$.",
        False,
    ),
]

CASES: list[tuple[str, str, str, bool]] = (
    UNBOXED + THOUSANDS + RELATION + EXACT_LONG + GOLD_SOLUTION
)
FAMILIES = ("unboxed", "thousands", "relation", "exact_long", "gold_solution")

# Pairs (response, reference) on which the `math_verify` backend (Math-Verify 0.9.0 behind
# the scorer's own extraction) and the built-in verifier disagree, with who is right.
# Every one of them is a pair the built-in verifier scores as labelled; the reason says what
# Math-Verify misses.
_THIN = "builtin: `\\,` between digit groups is a thousands separator; Math-Verify reads "
_THIN += "`1\\,000` as the product 1*0"
_INTERVAL = "builtin: a relation on one variable is the interval it describes; Math-Verify "
_INTERVAL += "parses `x >= 3` and `Interval(3, oo)` and scores them unequal"
_UNION = "builtin: `or` of one-sided relations is the union of their intervals; Math-Verify "
_UNION += "compares the set {x >= 3, x <= -1} with the Union and scores them unequal"
_AND = "builtin: two bounds joined by `and` are their intersection (a chain); Math-Verify "
_AND += "reads the set {x >= -2, x <= 7}, unequal to the interval or the chain"
_NEQ = "builtin: `x \\neq 0` is the line without 0; Math-Verify scores Ne(x, 0) unequal to "
_NEQ += "the union of the two open intervals"
MATH_VERIFY_DISAGREEMENTS: dict[tuple[str, str], str] = {
    ("\\boxed{1\\,000}", "1000"): _THIN,
    ("\\boxed{100\\,000}", "100000"): _THIN,
    ("\\boxed{1000}", "1\\,000"): _THIN,
    ("Hence there are 1 000 000 ways.", "10^6"): "builtin: digit groups split by spaces are "
    "one number; Math-Verify reads `1 000 000` as the product 1*0*0",
    ("\\boxed{x = 10{,}455}", "10455"): "builtin: `{,}` groups thousands after a label too; "
    "Math-Verify reads `x = 10{,}455` as x equal to the set {10, 455}",
    ("\\boxed{x \\geq 3}", "[3,\\infty)"): _INTERVAL,
    ("\\boxed{x \u2264 5}", "(-\\infty, 5]"): _INTERVAL,
    ("\\boxed{-2 \\le x \\le 7}", "[-2, 7]"): _INTERVAL,
    ("\\boxed{7 \\ge x \\ge -2}", "[-2,7]"): _INTERVAL,
    ("\\boxed{-2 \\lt x \\lt 7}", "(-2, 7)"): _INTERVAL,
    ("\\boxed{1 < x \\le 4}", "(1, 4]"): _INTERVAL,
    ("\\boxed{t \\geq 0}", "[0, \\infty)"): _INTERVAL,
    ("\\boxed{x > -\\sqrt{2}}", "(-\\sqrt{2}, \\infty)"): _INTERVAL,
    ("\\boxed{x > \\frac{1}{2}}", "(\\frac12, \\infty)"): _INTERVAL,
    ("The solution set is $x \\ge 3$.", "[3, \\infty)"): _INTERVAL,
    (MINERVA.format("-2 \\le x \\le 7"), "[-2,7]"): _INTERVAL,
    (
        "\\boxed{x \\ge 3}",
        "Solving, $x \\geq 3$, that is $\\boxed{[3, \\infty)}$.",
    ): _INTERVAL,
    ("\\boxed{x <= -1 \\text{ or } x >= 3}", "(-\\infty,-1]\\cup[3,\\infty)"): _UNION,
    ("\\boxed{x \\in (-\\infty, -1] \\cup [3, \\infty)}", "x \\le -1 or x \\ge 3"): _UNION,
    ("\\boxed{x < -2 \\text{ or } x > 2}", "(-\\infty,-2) \\cup (2,\\infty)"): _UNION,
    ("\\boxed{x \\neq 0}", "(-\\infty, 0) \\cup (0, \\infty)"): _NEQ,
    ("\\boxed{x \\geq -2 \\text{ and } x \\leq 7}", "[-2, 7]"): _AND,
    ("\\boxed{x > 1 \\text{ and } x < 4}", "1 < x < 4"): _AND,
}
