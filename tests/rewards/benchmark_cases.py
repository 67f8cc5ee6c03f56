"""Labelled (family, response, reference, correct?) pairs in the answer formats of the held-out
benchmarks (AIME24/25/26, AMC23, Minerva, OlympiadBench, MATH-500) and of DAPO-Math-17K.

Shared by `test_benchmark_cases.py` (the built-in verifier end to end, and its agreement with
the `math_verify` backend) and `benchmarks/verifier.py`. A reference is a string, or a tuple
of strings: several final answers, the way OlympiadBench's `final_answer` lists them (the
scorer reads a list or tuple as one unordered list of the elements' answers). Families:

* `matrix_env`: `pmatrix`, `bmatrix` and `array` (bare, in `\\left(...\\right)` or
  `\\left[...\\right]`, with `\\\\[2pt]` row spacing) compared entry by entry, in any pairing;
* `multi_answer`: several boxes (`\\boxed{2}` and `\\boxed{-3}`, `\\boxed{2}, \\boxed{-3}`)
  or `\\pm` against a reference of several answers (`2, -3`, or a list of strings);
* `labelled`: `(p, q) = (3, 2)`, ratios (`V_1 : V_2 = 11 : 21`), `x \\approx 11`, `\\angle A`,
  `f(x) = 2x+1`;
* `answer_heading`: `Answer \\[ 9 \\]`, `**Answer** $9$`, `### Final Answer` over display math,
  with numbers after it that the last-expression fallback would read instead;
* `choice_letter`: MATH-500's `\\text{(C)}` and AMC's `\\textbf{(C) }12` (letter and value);
* `units_degrees`: `^\\circ`, `\\text{ cm}^2`, Minerva's `\\mathrm{~km} / \\mathrm{s}`;
* `sci_notation`: Minerva's `6.0 \\times 10^{-27}`, `5.3e-5`, `5.3 \\cdot 10^{-5}`;
* `number_style`: AIME's `033`, AMC23's `27.0`, `\\$32,\\!348`, `\\dfrac`, complex numbers;
* `interval_set`: unions, `\\infty`, `\\mathbb{R}`.

Every family has near-misses that must stay wrong. `MATH_VERIFY_DISAGREEMENTS` labels each
pair on which the `math_verify` backend and the built-in verifier disagree.
"""

from __future__ import annotations

MINERVA = "Final Answer: The final answer is ${}$. I hope it is correct."
PMAT = r"\begin{pmatrix}1&2\\3&4\end{pmatrix}"
BMAT = r"\begin{bmatrix}1 & 2 \\ 3 & 4\end{bmatrix}"
ARRAY = r"\left[\begin{array}{cc}1&2\\3&4\end{array}\right]"
COLUMN = r"\begin{pmatrix} 2 \\ -1 \end{pmatrix}"
FRACTIONS = r"\begin{pmatrix} -\frac{1}{3} \\ \frac{2}{3} \\ \frac{5}{3} \end{pmatrix}"
Case = tuple[str, str, str | tuple[str, ...], bool]

MATRIX_ENV: list[Case] = [
    ("matrix_env", rf"\boxed{{{PMAT}}}", ARRAY, True),
    ("matrix_env", rf"\boxed{{{ARRAY}}}", PMAT, True),
    (
        "matrix_env",
        r"\boxed{\left(\begin{array}{cc} 1 & 2 \\ 3 & 4 \end{array}\right)}",
        BMAT,
        True,
    ),
    ("matrix_env", r"\boxed{\begin{array}{cc} 1 & 2 \\ 3 & 4 \end{array}}", PMAT, True),
    ("matrix_env", r"\boxed{\left[\begin{array}{c} 2 \\ -1 \end{array}\right]}", COLUMN, True),
    (
        "matrix_env",
        MINERVA.format(r"\left[\begin{array}{ll} 1 & 0 \\ 0 & 1 \end{array}\right]"),
        r"\begin{pmatrix}1&0\\0&1\end{pmatrix}",
        True,
    ),
    (
        "matrix_env",
        r"\boxed{\begin{pmatrix} \dfrac{1}{2} & 0 \\ 0 & 1 \end{pmatrix}}",
        r"\left[\begin{array}{cc}0.5&0\\0&1\end{array}\right]",
        True,
    ),
    ("matrix_env", r"\boxed{\begin{pmatrix} -1/3 \\ 2/3 \\ 5/3 \end{pmatrix}}", FRACTIONS, True),
    ("matrix_env", r"\boxed{\begin{array}{cc} 1 & 2 \\[2pt] 3 & 4 \end{array}}", PMAT, True),
    (
        "matrix_env",
        r"\boxed{\begin{bmatrix} x & 1 \\ 0 & x \end{bmatrix}}",
        r"\left(\begin{array}{cc} x & 1 \\ 0 & x \end{array}\right)",
        True,
    ),
    (
        "matrix_env",
        r"Answer: $\begin{pmatrix} \frac{3}{5} \\ \frac{4}{5} \end{pmatrix}$",
        r"\left[\begin{array}{c} 0.6 \\ 0.8 \end{array}\right]",
        True,
    ),
    ("matrix_env", r"\boxed{\left[\begin{matrix}1&2\\3&4\end{matrix}\right]}", ARRAY, True),
    # near-misses: another shape, entry, order or kind of matrix
    (
        "matrix_env",
        r"\boxed{\begin{array}{cc} 1 & 2 \\ 3 & 4 \end{array}}",
        r"\begin{pmatrix}1&2&3&4\end{pmatrix}",
        False,
    ),
    ("matrix_env", r"\boxed{\begin{array}{cc} 1 & 2 \\ 3 & 5 \end{array}}", PMAT, False),
    (
        "matrix_env",
        r"\boxed{\left[\begin{array}{c} 2 \\ -1 \end{array}\right]}",
        r"\begin{pmatrix} 2 & -1 \end{pmatrix}",
        False,
    ),
    ("matrix_env", r"\boxed{\begin{pmatrix}1&3\\2&4\end{pmatrix}}", ARRAY, False),
    ("matrix_env", r"\boxed{\begin{vmatrix}1&2\\3&4\end{vmatrix}}", ARRAY, False),
    ("matrix_env", r"\boxed{\left|\begin{array}{cc}1&2\\3&4\end{array}\right|}", PMAT, False),
    ("matrix_env", r"\boxed{\begin{bmatrix}1&-2\\3&4\end{bmatrix}}", ARRAY, False),
    (
        "matrix_env",
        r"\boxed{\begin{pmatrix} 0.8 \\ 0.7 \end{pmatrix}}",
        r"\left[\begin{array}{c} \frac{4}{5} \\ \frac{3}{5} \end{array}\right]",
        False,
    ),
    ("matrix_env", r"\boxed{\begin{pmatrix} 1/3 \\ 2/3 \\ 5/3 \end{pmatrix}}", FRACTIONS, False),
    ("matrix_env", rf"\boxed{{{PMAT}{PMAT}}}", ARRAY, False),
    (
        "matrix_env",
        r"\boxed{\begin{bmatrix} x & 1 \\ 0 & y \end{bmatrix}}",
        r"\left(\begin{array}{cc} x & 1 \\ 0 & x \end{array}\right)",
        False,
    ),
]

MULTI_ANSWER: list[Case] = [
    ("multi_answer", r"The solutions are $\boxed{2}$ and $\boxed{-3}$.", "2, -3", True),
    ("multi_answer", r"$x = \boxed{2}$ or $x = \boxed{-3}$", "-3, 2", True),
    ("multi_answer", r"The roots: $\boxed{2}, \boxed{-3}$", "2, -3", True),
    ("multi_answer", r"\boxed{-3} \quad \boxed{2}", ("$2$", "$-3$"), True),
    ("multi_answer", r"so $x=\boxed{2}$ and $x=\boxed{-3}$.", ("2", "-3"), True),
    ("multi_answer", r"\boxed{2, -3}", ("$2$", "$-3$"), True),
    ("multi_answer", r"\boxed{2 \text{ or } -3}", ("$2$", "$-3$"), True),
    ("multi_answer", r"\boxed{\frac{1}{2}}", (r"$\frac{1}{2}$",), True),
    ("multi_answer", r"\boxed{(1,2)} and \boxed{(2,1)}", ("$(1,2)$", "$(2,1)$"), True),
    ("multi_answer", r"\boxed{1} and \boxed{-1}", ("$x=1$", "$x=-1$"), True),
    (
        "multi_answer",
        r"$\boxed{\sqrt{2}}$ and $\boxed{-\sqrt{2}}$",
        (r"$\sqrt{2}$", r"$-\sqrt{2}$"),
        True,
    ),
    ("multi_answer", MINERVA.format("2, -3"), ("2", "-3"), True),
    ("multi_answer", r"\boxed{\pm 2}", "2, -2", True),
    ("multi_answer", r"\boxed{x = \pm\sqrt{3}}", (r"$\sqrt{3}$", r"$-\sqrt{3}$"), True),
    ("multi_answer", r"\boxed{1 \pm \sqrt{2}}", r"1+\sqrt2, 1-\sqrt2", True),
    # near-misses: one box of two, a wrong or repeated element, an extra box, a tuple
    ("multi_answer", r"The solution is $\boxed{2}$.", "2, -3", False),
    ("multi_answer", r"\boxed{2}", ("$2$", "$-3$"), False),
    ("multi_answer", r"\boxed{-3}", ("$2$", "$-3$"), False),
    ("multi_answer", r"\boxed{2} and \boxed{3}", "2, -3", False),
    ("multi_answer", r"\boxed{2}, \boxed{-3}, \boxed{5}", ("2", "-3"), False),
    ("multi_answer", r"\boxed{2} and \boxed{2}", ("2", "-3"), False),
    ("multi_answer", r"\boxed{(1,2)}", ("$(1,2)$", "$(2,1)$"), False),
    ("multi_answer", r"\boxed{\frac{1}{3}}", (r"$\frac{1}{2}$",), False),
    ("multi_answer", r"\boxed{2, -3}", ("$(2, -3)$",), False),
    (
        "multi_answer",
        r"$\boxed{\sqrt{2}}$ and $\boxed{\sqrt{2}}$",
        (r"$\sqrt{2}$", r"$-\sqrt{2}$"),
        False,
    ),
    ("multi_answer", r"\boxed{1} and \boxed{1}", ("$x=1$", "$x=-1$"), False),
    ("multi_answer", r"\boxed{\pm 2}", "2", False),
    ("multi_answer", r"\boxed{\pm 2}", "2, -3", False),
    ("multi_answer", r"\boxed{1 \pm \sqrt{3}}", r"1+\sqrt2, 1-\sqrt2", False),
]

LABELLED: list[Case] = [
    ("labelled", r"\boxed{(p, q) = (3, 2)}", "(3, 2)", True),
    ("labelled", r"\boxed{(p,q)=(3,2)}", "(p, q) = (3, 2)", True),
    ("labelled", r"\boxed{(a, b, c) = (1, 2, 3)}", "(1,2,3)", True),
    ("labelled", MINERVA.format("(m, n) = (4, 7)"), "(4,7)", True),
    ("labelled", r"\boxed{(x, y) = \left(\frac{1}{2}, -3\right)}", "(0.5, -3)", True),
    ("labelled", r"\boxed{V_1 : V_2 = 11 : 21}", "11:21", True),
    ("labelled", r"\boxed{11:21}", "V_1 : V_2 = 11 : 21", True),
    ("labelled", r"\boxed{V_1:V_2=11:21}", "11 : 21", True),
    ("labelled", r"\boxed{a:b:c = 2:3:4}", "2:3:4", True),
    ("labelled", r"\boxed{x \approx 11}", "11", True),
    ("labelled", r"\boxed{\approx 11}", "11", True),
    ("labelled", "Answer: $x \\approx 11$", "11", True),
    ("labelled", "\\boxed{x \u2248 11}", "11", True),
    ("labelled", r"\boxed{AB \approx 11}", "AB = 11", True),
    ("labelled", r"\boxed{t \approx 2.5 \text{ s}}", "2.5", True),
    ("labelled", r"\boxed{\angle A = 45^\circ}", r"45^\circ", True),
    ("labelled", r"\boxed{f(x) = 2x+1}", "2x+1", True),
    ("labelled", r"\boxed{f^{-1}(x) = \frac{x-1}{2}}", r"\frac{x-1}{2}", True),
    # near-misses: another value, another label, a ratio reversed, an approximation of pi
    ("labelled", r"\boxed{(p,q)=(2,3)}", "(3, 2)", False),
    ("labelled", r"\boxed{(q,p)=(3,2)}", "(p,q)=(3,2)", False),
    ("labelled", r"\boxed{(a, b, c) = (1, 2, 4)}", "(1,2,3)", False),
    ("labelled", r"\boxed{(x, y) = \left(\frac{1}{2}, 3\right)}", "(0.5, -3)", False),
    ("labelled", r"\boxed{V_1 : V_2 = 21 : 11}", "11:21", False),
    ("labelled", r"\boxed{11:21}", "21:11", False),
    ("labelled", r"\boxed{11:20}", "V_1 : V_2 = 11 : 21", False),
    ("labelled", r"\boxed{V_2 : V_1 = 11 : 21}", "V_1 : V_2 = 11 : 21", False),
    ("labelled", r"\boxed{a:b:c = 2:4:3}", "2:3:4", False),
    ("labelled", r"\boxed{x \approx 12}", "11", False),
    ("labelled", r"\boxed{\approx 11.5}", "11", False),
    ("labelled", r"\boxed{\approx 3.14}", r"\pi", False),
    ("labelled", r"\boxed{AB \approx 11}", "CD = 11", False),
    ("labelled", r"\boxed{\angle A = 45^\circ}", r"\angle B = 45^\circ", False),
    ("labelled", r"\boxed{f(x) = 2x-1}", "2x+1", False),
    ("labelled", r"\boxed{g(x) = 2x+1}", "f(x) = 2x+1", False),
]

ANSWER_HEADING: list[Case] = [
    (
        "answer_heading",
        "So we get nine.\n\nAnswer \\[ 9 \\]\n\nCheck: 4 + 5 = 9 and 2 < 3.",
        "9",
        True,
    ),
    ("answer_heading", "Answer: \\[ 9 \\]\n\nIndeed 4 + 5 = 9 and 2 < 3.", "9", True),
    ("answer_heading", "**Answer** $9$\n\nIndeed 4 + 5 = 9 and 2 < 3.", "9", True),
    ("answer_heading", "**Answer**: $9$ (the other 2 cases fail)", "9", True),
    ("answer_heading", "**Answer**\n\n$$9$$\n\nThe check uses 2 and 3.", "9", True),
    ("answer_heading", "## Final Answer\n\\[ 42 \\]\nwhich is 6 times 7.", "42", True),
    ("answer_heading", "**Final Answer** \\[ \\boxed{9} \\]", "9", True),
    ("answer_heading", "Answer\n$\\frac{1}{2}$, as 1 of 2 cases.", "0.5", True),
    ("answer_heading", "*Answer:* $\\dfrac{3}{4}$ (from 3 of 4 cases)", "0.75", True),
    ("answer_heading", "### Answer\n$$x = 5$$\nsince 2x = 10.", "5", True),
    ("answer_heading", "ANSWER \\(12\\) (2 ways)", "12", True),
    ("answer_heading", "__Answer__ $\\sqrt{3}$, about 1.7.", "\\sqrt3", True),
    # near-misses: a wrong value under the heading, `answer` inside a sentence
    ("answer_heading", "**Answer** $8$\n\nIndeed 4 + 5 = 9 and 2 < 3.", "9", False),
    ("answer_heading", "Answer \\[ 10 \\]\n\nCheck: 9", "9", False),
    ("answer_heading", "## Final Answer\n\\[ 41 \\]\nwhich is 6 times 7.", "42", False),
    ("answer_heading", "Answer\n$\\frac{1}{3}$, as 1 of 2 cases.", "0.5", False),
    (
        "answer_heading",
        "We check the answer $5$ against the equation: it fails, so \\boxed{4}.",
        "5",
        False,
    ),
    ("answer_heading", "$\\boxed{4}$. Then the answer $5$ was wrong.", "5", False),
    ("answer_heading", "$\\boxed{4}$\nThe answer $5$ fails the check.", "5", False),
    ("answer_heading", "**Answer** $2$ and $3$", "2", False),
]

CHOICE_LETTER: list[Case] = [
    ("choice_letter", r"\boxed{\text{(C)}}", r"\text{(C)}", True),
    ("choice_letter", r"\boxed{C}", r"\text{(C)}", True),
    ("choice_letter", r"\boxed{(C)}", r"\text{(C)}", True),
    ("choice_letter", r"\boxed{\textbf{(C)}}", "C", True),
    ("choice_letter", r"\boxed{\textbf{(C) }12}", r"\text{(C)}", True),
    ("choice_letter", r"\boxed{\textbf{(C) }12}", "12", True),
    ("choice_letter", r"\boxed{\text{(B) } \frac{1}{2}}", r"\frac12", True),
    ("choice_letter", r"\boxed{B}", r"\textbf{(B) }\frac{1}{2}", True),
    ("choice_letter", r"\boxed{\frac12}", r"\textbf{(B) }\frac{1}{2}", True),
    ("choice_letter", r"The answer is $\boxed{\mathrm{(E)}}$.", "E", True),
    ("choice_letter", r"\boxed{\textbf{(D)}~27}", "27.0", True),
    ("choice_letter", r"\boxed{\text{(A), (C)}}", r"\text{(C), (A)}", True),
    # near-misses: another letter, another value
    ("choice_letter", r"\boxed{\text{(D)}}", r"\text{(C)}", False),
    ("choice_letter", r"\boxed{D}", r"\text{(C)}", False),
    ("choice_letter", r"\boxed{\textbf{(C) }12}", "D", False),
    ("choice_letter", r"\boxed{\textbf{(C) }12}", "13", False),
    ("choice_letter", r"\boxed{\text{(B) } \frac{1}{3}}", r"\frac12", False),
    ("choice_letter", r"\boxed{\frac13}", r"\textbf{(B) }\frac{1}{2}", False),
    ("choice_letter", r"\boxed{C}", r"\textbf{(B) }\frac{1}{2}", False),
    ("choice_letter", r"\boxed{\textbf{(B) }\frac{1}{2}}", r"\textbf{(C) }\frac{1}{2}", False),
    ("choice_letter", r"\boxed{\textbf{(D)}~26}", "27.0", False),
    ("choice_letter", r"\boxed{\text{(A), (B)}}", r"\text{(C), (A)}", False),
]

UNITS_DEGREES: list[Case] = [
    ("units_degrees", r"\boxed{30^\circ}", "30", True),
    ("units_degrees", r"\boxed{30}", r"30^\circ", True),
    ("units_degrees", "\\boxed{30\u00b0}", r"30^{\circ}", True),
    ("units_degrees", r"\boxed{x = 30^\circ}", "30", True),
    ("units_degrees", r"\boxed{12\text{ cm}^2}", "12", True),
    ("units_degrees", r"\boxed{12 \, \mathrm{cm}^2}", "12", True),
    ("units_degrees", r"\boxed{3.3 \mathrm{~km} / \mathrm{s}}", "3.3", True),
    ("units_degrees", r"\boxed{6.0 \times 10^{-27} \mathrm{~erg} \cdot \mathrm{s}}", "6e-27", True),
    ("units_degrees", r"\boxed{10^{20} \mathrm{~cm}^{-3}}", "1e20", True),
    ("units_degrees", r"\boxed{\frac{1}{2} \text{ m/s}}", "0.5", True),
    ("units_degrees", r"\boxed{1.6}", r"1.6 \mathrm{~cm}", True),
    ("units_degrees", r"\boxed{5\text{ in}^3}", "5", True),
    ("units_degrees", r"\boxed{\$18.90}", "18.90", True),
    ("units_degrees", r"\boxed{4 \text{ days}}", "4", True),
    ("units_degrees", r"\boxed{2.5 \text{ km/h}}", "2.5", True),
    ("units_degrees", r"\boxed{6.62 \times 10^{-27} \, \mathrm{erg \cdot s}}", "6.62e-27", True),
    ("units_degrees", r"\boxed{3 \times 10^{8} \mathrm{~m} \mathrm{~s}^{-1}}", "3e8", True),
    # near-misses: another value with the same unit
    ("units_degrees", r"\boxed{30^\circ}", "60", False),
    ("units_degrees", r"\boxed{31^\circ}", r"30^\circ", False),
    ("units_degrees", r"\boxed{3.3 \mathrm{~km} / \mathrm{s}}", "3.4", False),
    (
        "units_degrees",
        r"\boxed{6.0 \times 10^{-27} \mathrm{~erg} \cdot \mathrm{s}}",
        "6e-28",
        False,
    ),
    ("units_degrees", r"\boxed{2 \times 10^{20} \mathrm{~cm}^{-3}}", "1e20", False),
    ("units_degrees", r"\boxed{\frac{1}{3} \text{ m/s}}", "0.5", False),
    ("units_degrees", r"\boxed{12\text{ cm}^2}", "144", False),
    ("units_degrees", r"\boxed{\$18.90}", "18.09", False),
    ("units_degrees", r"\boxed{1.7}", r"1.6 \mathrm{~cm}", False),
    ("units_degrees", r"\boxed{3 \times 10^{7} \mathrm{~m} \mathrm{~s}^{-1}}", "3e8", False),
]

SCI_NOTATION: list[Case] = [
    ("sci_notation", MINERVA.format(r"6.0 \times 10^{-27}"), "6e-27", True),
    ("sci_notation", r"\boxed{6.0 \times 10^{-27}}", r"6 \times 10^{-27}", True),
    ("sci_notation", r"\boxed{5.3e-5}", r"5.3 \times 10^{-5}", True),
    ("sci_notation", r"\boxed{5.3 \cdot 10^{-5}}", "5.3e-5", True),
    ("sci_notation", r"\boxed{5.3\times10^{-5}}", "0.000053", True),
    ("sci_notation", r"\boxed{5.30e-05}", r"5.3 \times 10^{-5}", True),
    ("sci_notation", r"\boxed{5.3E-5}", "5.3e-5", True),
    ("sci_notation", r"\boxed{4.5 \times 10^{3}}", "4500", True),
    ("sci_notation", r"\boxed{1.5 \times 10^{8} \text{ km}}", "1.5e8", True),
    ("sci_notation", r"\boxed{7.5 \times 10^{-3}\,\text{M}}", "7.5e-3", True),
    ("sci_notation", r"\boxed{\approx 6.0 \times 10^{-27}}", "6e-27", True),
    ("sci_notation", r"\boxed{10^{-3}}", "0.001", True),
    # near-misses: another exponent or mantissa
    ("sci_notation", r"\boxed{5.3 \times 10^{-6}}", "5.3e-5", False),
    ("sci_notation", r"\boxed{5.4e-5}", "5.3e-5", False),
    ("sci_notation", r"\boxed{6.0 \times 10^{27}}", "6.0e-27", False),
    ("sci_notation", r"\boxed{1.5 \times 10^{8} \text{ km}}", "1.5e9", False),
    ("sci_notation", r"\boxed{4.5 \times 10^{3}}", "450", False),
    ("sci_notation", r"\boxed{5.3e5}", "5.3e-5", False),
    ("sci_notation", r"\boxed{5.3}", "5.3e-5", False),
    ("sci_notation", MINERVA.format(r"6.0 \times 10^{-26}"), "6e-27", False),
]

NUMBER_STYLE: list[Case] = [
    ("number_style", r"\boxed{033}", "33", True),
    ("number_style", r"\boxed{33}", "033", True),
    ("number_style", r"\boxed{27}", "27.0", True),
    ("number_style", r"\boxed{\frac{27}{1}}", "27.0", True),
    ("number_style", r"\boxed{1{,}000}", "1000", True),
    ("number_style", r"\boxed{\dfrac{9\sqrt{3}}{4}}", r"\frac{9\sqrt3}{4}", True),
    ("number_style", r"\boxed{\$32,\!348}", r"\$32,\!348", True),
    ("number_style", r"\boxed{32348}", r"\$32,\!348", True),
    ("number_style", r"\boxed{-5i+6}", "6 - 5i", True),
    ("number_style", "The total is 34.\n\nAnswer: 34", "34", True),
    ("number_style", r"Answer: $\boxed{34}$", "34", True),
    ("number_style", r"\boxed{1/2}", r"\dfrac{1}{2}", True),
    # near-misses
    ("number_style", r"\boxed{034}", "33", False),
    ("number_style", r"\boxed{330}", "033", False),
    ("number_style", r"\boxed{26.9}", "27.0", False),
    ("number_style", r"\boxed{1{,}001}", "1000", False),
    ("number_style", r"\boxed{\dfrac{9\sqrt{2}}{4}}", r"\frac{9\sqrt3}{4}", False),
    ("number_style", r"\boxed{32349}", r"\$32,\!348", False),
    ("number_style", r"\boxed{6+5i}", "6 - 5i", False),
    ("number_style", "The total is 34.\n\nAnswer: 43", "34", False),
]

INTERVAL_SET: list[Case] = [
    ("interval_set", r"\boxed{(-\infty, 2) \cup (3, \infty)}", r"(-\infty,2)\cup(3,\infty)", True),
    (
        "interval_set",
        r"\boxed{x \in (-\infty, -1) \cup (1, \infty)}",
        r"(-\infty,-1)\cup(1,\infty)",
        True,
    ),
    (
        "interval_set",
        r"\boxed{(-\infty, -1) \cup (1, +\infty)}",
        r"(-\infty,-1)\cup(1,\infty)",
        True,
    ),
    ("interval_set", r"\boxed{\mathbb{R}}", r"(-\infty, \infty)", True),
    ("interval_set", r"\boxed{(-\infty,\infty)}", r"\mathbb{R}", True),
    ("interval_set", r"\boxed{x \in \mathbb{R}}", r"(-\infty,\infty)", True),
    ("interval_set", r"\boxed{[2, \infty)}", r"[2,\infty)", True),
    ("interval_set", r"\boxed{+\infty}", r"\infty", True),
    ("interval_set", r"\boxed{\left[-\frac{1}{2}, 3\right)}", "[-0.5, 3)", True),
    # near-misses: a closed end for an open one, the other infinity, another set
    ("interval_set", r"\boxed{(-\infty, 2] \cup (3, \infty)}", r"(-\infty,2)\cup(3,\infty)", False),
    ("interval_set", r"\boxed{(2, \infty)}", r"[2,\infty)", False),
    ("interval_set", r"\boxed{-\infty}", r"\infty", False),
    ("interval_set", r"\boxed{\mathbb{R}}", r"(0, \infty)", False),
    ("interval_set", r"\boxed{(-\infty, 0]}", r"(-\infty, 0)", False),
    ("interval_set", r"\boxed{\left[-\frac{1}{2}, 3\right]}", "[-0.5, 3)", False),
    ("interval_set", r"\boxed{(-\infty, 1) \cup (1, \infty)}", r"\mathbb{R}", False),
]

CASES: list[Case] = (
    MATRIX_ENV
    + MULTI_ANSWER
    + LABELLED
    + ANSWER_HEADING
    + CHOICE_LETTER
    + UNITS_DEGREES
    + SCI_NOTATION
    + NUMBER_STYLE
    + INTERVAL_SET
)
FAMILIES = (
    "matrix_env",
    "multi_answer",
    "labelled",
    "answer_heading",
    "choice_letter",
    "units_degrees",
    "sci_notation",
    "number_style",
    "interval_set",
)

# Pairs (response, reference) on which the `math_verify` backend (Math-Verify 0.9.0 behind the
# scorer's own extraction) and the built-in verifier disagree, with who is right. In every one
# the built-in verifier scores the pair as labelled; the reason says what Math-Verify misses.
_E = "builtin: `6e-27` is scientific notation; Math-Verify reads the `e` as Euler's number "
_E += "(`6e-27` is 6e - 27)"
_CHOICE = "builtin: a choice letter with its value (`(C) 12`) matches the letter or the value; "
_CHOICE += "Math-Verify reads the product of a variable and the value"
MATH_VERIFY_DISAGREEMENTS: dict[tuple[str, str | tuple[str, ...]], str] = {
    (r"\boxed{\begin{array}{cc} 1 & 2 \\[2pt] 3 & 4 \end{array}}", PMAT): "builtin: `\\\\[2pt]` "
    "is a row break with spacing; Math-Verify reads the entry `2pt]3` as 2*p*t*3",
    (r"\boxed{2, -3}", ("$(2, -3)$",)): "builtin: a bare list of answers is not an ordered "
    "pair; Math-Verify accepts the set {2, -3} for the tuple",
    (r"\boxed{a:b:c = 2:4:3}", "2:3:4"): "builtin: a ratio compares term by term; Math-Verify "
    "reads `2:4:3` and `2:3:4` as the quotients (2/4)/3 and (2/3)/4, both 1/6",
    (r"\boxed{AB \approx 11}", "CD = 11"): "builtin: two labelled answers need the same "
    "label; Math-Verify drops the label `AB` and accepts",
    (r"\boxed{\textbf{(C) }12}", r"\text{(C)}"): _CHOICE,
    (r"\boxed{\textbf{(C) }12}", "12"): _CHOICE,
    (r"\boxed{\text{(B) } \frac{1}{2}}", r"\frac12"): _CHOICE,
    (r"\boxed{B}", r"\textbf{(B) }\frac{1}{2}"): _CHOICE,
    (r"\boxed{\frac12}", r"\textbf{(B) }\frac{1}{2}"): _CHOICE,
    (r"\boxed{\textbf{(D)}~27}", "27.0"): _CHOICE,
    (r"\boxed{\text{(A), (C)}}", r"\text{(C), (A)}"): "builtin: lists of choice letters "
    "compare as sets; Math-Verify compares the letters in order",
    ("\\boxed{30\u00b0}", r"30^{\circ}"): "builtin: the `\u00b0` sign is `^\\circ`; "
    "Math-Verify does not parse it",
    (r"\boxed{6.0 \times 10^{-27} \mathrm{~erg} \cdot \mathrm{s}}", "6e-27"): _E,
    (r"\boxed{10^{20} \mathrm{~cm}^{-3}}", "1e20"): _E,
    (r"\boxed{6.62 \times 10^{-27} \, \mathrm{erg \cdot s}}", "6.62e-27"): _E,
    (r"\boxed{3 \times 10^{8} \mathrm{~m} \mathrm{~s}^{-1}}", "3e8"): _E,
    (MINERVA.format(r"6.0 \times 10^{-27}"), "6e-27"): _E,
    (r"\boxed{5.3e-5}", r"5.3 \times 10^{-5}"): _E,
    (r"\boxed{5.3 \cdot 10^{-5}}", "5.3e-5"): _E,
    (r"\boxed{5.30e-05}", r"5.3 \times 10^{-5}"): _E,
    (r"\boxed{5.3E-5}", "5.3e-5"): _E,
    (r"\boxed{1.5 \times 10^{8} \text{ km}}", "1.5e8"): _E,
    (r"\boxed{7.5 \times 10^{-3}\,\text{M}}", "7.5e-3"): _E,
    (r"\boxed{\approx 6.0 \times 10^{-27}}", "6e-27"): "builtin: a leading `\\approx` "
    "announces the value; Math-Verify reads the answer as 10",
}
