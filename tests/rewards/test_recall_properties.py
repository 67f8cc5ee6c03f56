"""Property tests: a correct answer stays correct under the rewrites the verifier accepts
(`\\dfrac`/`\\cfrac`/`\\tfrac`, spacing, delimiters, labels, percent words, reordering a set,
`or`/`and`/`;` separators, relations as intervals, scaling an equation, rounding a fraction
to a long decimal, matrix environments), and a changed answer stays wrong."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from da3po_jax.rewards import fast_verdict, is_equivalent

FAST = settings(max_examples=60, deadline=None)
SYMPY = settings(max_examples=15, deadline=None)

ints = st.integers(min_value=-50, max_value=50)
spacing = st.sampled_from(["", " ", "\\,", "\\ ", "~", "\\;", "\\quad "])
delimiters = st.sampled_from([("", ""), ("$", "$"), ("\\(", "\\)"), ("\\boxed{", "}")])


@FAST
@given(
    st.integers(-99, 99),
    st.integers(2, 99),
    st.sampled_from(["\\frac", "\\dfrac", "\\cfrac", "\\tfrac"]),
    spacing,
    delimiters,
    st.sampled_from(["", "x = ", "m=", "AB = "]),
)
def test_fraction_rewrites(num, den, command, space, delims, label):
    ref = f"{num}/{den}"
    body = f"{'-' if num < 0 else ''}{command}{{{abs(num)}}}{space}{{{den}}}"
    answer = f"{delims[0]}{label}{body}{delims[1]}"
    assert fast_verdict(answer, ref) is True
    assert fast_verdict(answer, f"{num + 1}/{den}") is False


@FAST
@given(st.integers(0, 1000), st.sampled_from([" percent", "\\%", "%", "\\text{ percent}"]))
def test_percent_rewrites(n, suffix):
    assert fast_verdict(f"{n}{suffix}", f"{n}\\%") is True
    assert fast_verdict(f"{n}{suffix}", f"{n + 1}\\%") is False


@FAST
@given(
    st.lists(ints, min_size=2, max_size=5, unique=True),
    st.randoms(use_true_random=False),
    st.sampled_from([", ", "; ", " or ", " and ", ",\\ ", " \\text{ or } "]),
    st.booleans(),
    st.booleans(),
)
def test_answer_set_rewrites(values, rng, separator, braces, labels):
    ref = ", ".join(map(str, values))
    shuffled = list(values)
    rng.shuffle(shuffled)
    items = [f"x_{i} = {v}" if labels else str(v) for i, v in enumerate(shuffled)]
    answer = separator.join(items)
    if braces and not labels:
        answer = "\\{" + answer + "\\}"
    assert fast_verdict(answer, ref) is True
    wrong = list(values)
    wrong[0] = max(values) + 1  # one element changed: a different set
    assert fast_verdict(answer, ", ".join(map(str, wrong))) is False
    assert fast_verdict(", ".join(map(str, shuffled[1:])), ref) is False  # one missing


@FAST
@given(ints, st.sampled_from(["<", ">", "\\leq", "\\geq", "\\le", "\\ge", "<=", ">="]))
def test_relations_match_their_intervals_and_mirror_images(a, op):
    latex = {"<=": "\\leq", ">=": "\\geq", "\\le": "\\leq", "\\ge": "\\geq"}.get(op, op)
    mirror = {"<": ">", ">": "<", "\\leq": "\\geq", "\\geq": "\\leq"}[latex]
    closed = "[" if latex == "\\geq" else "("
    interval = {
        "<": f"(-\\infty, {a})",
        "\\leq": f"(-\\infty, {a}]",
    }.get(latex, f"{closed}{a}, \\infty)")
    assert fast_verdict(f"x {op} {a}", interval) is True
    assert fast_verdict(f"{a} {mirror} x", f"x {op} {a}") is True
    assert fast_verdict(f"x {op} {a + 1}", interval) is False
    strict = {"\\leq": "<", "\\geq": ">", "<": "\\leq", ">": "\\geq"}[latex]
    assert fast_verdict(f"x {strict} {a}", interval) is False  # strictness matters


@SYMPY
@given(ints, ints, ints, st.integers(-6, 6), st.sampled_from(["x", "y"]))
def test_scaled_and_rearranged_equations(a, b, c, k, solve_for):
    assume(a != 0 and b != 0 and k != 0)
    ref = f"{a}x + {b}y = {c}"
    answer = f"{k * a}x + {k * b}y - {k * c} = 0"
    assert is_equivalent(answer, ref)
    coefficient, other = (a, b) if solve_for == "x" else (b, a)
    rest = "y" if solve_for == "x" else "x"
    solved = (
        f"{solve_for} = \\frac{{{c}}}{{{coefficient}}} - \\frac{{{other}}}{{{coefficient}}}{rest}"
    )
    assert is_equivalent(solved, ref)
    assert not is_equivalent(f"{k * a}x + {k * b}y = {k * c + k}", ref)  # shifted


@FAST
@given(st.integers(1, 10_000), st.sampled_from([3, 6, 7, 9, 11, 12, 13]), st.integers(4, 8))
def test_long_decimals_match_the_fraction_they_round(num, den, digits):
    value = Fraction(num, den)
    assume((value * 10**digits).denominator != 1)
    assume(value > 1)  # at least 4 significant digits
    scaled = round(value * 10**digits)
    text = f"{scaled // 10**digits}.{scaled % 10**digits:0{digits}d}"
    ref = f"\\frac{{{num}}}{{{den}}}"
    assert fast_verdict(text, ref) is True
    off = scaled + 1
    assert fast_verdict(f"{off // 10**digits}.{off % 10**digits:0{digits}d}", ref) is False
    short = f"{float(value):.2f}"  # too few digits to count as rounded
    assert fast_verdict(short, ref) is False


@FAST
@given(
    st.lists(st.lists(ints, min_size=2, max_size=2), min_size=1, max_size=3),
    st.sampled_from(["pmatrix", "bmatrix", "matrix", "Bmatrix"]),
    spacing,
)
def test_matrix_environments(rows, env, space):
    ref = "\\begin{pmatrix}" + "\\\\".join("&".join(map(str, r)) for r in rows) + "\\end{pmatrix}"
    body = f"{space}\\\\ ".join(f" & {space}".join(map(str, r)) for r in rows)
    answer = f"\\begin{{{env}}}{body}\\end{{{env}}}"
    assert fast_verdict(answer, ref) is True
    changed = [list(r) for r in rows]
    changed[-1][-1] += 1
    wrong = "\\begin{bmatrix}" + "\\\\".join("&".join(map(str, r)) for r in changed)
    assert fast_verdict(answer, wrong + "\\end{bmatrix}") is False


@FAST
@given(st.integers(0, 999), st.integers(0, 99))
def test_decimal_comma(whole, cents):
    digits = f"{cents:02d}" if cents >= 10 else str(cents)
    assert fast_verdict(f"{whole},{digits}", f"{whole}.{digits}") is True
    assert fast_verdict(f"{whole},{digits}", f"{whole}.{digits}1") is False
