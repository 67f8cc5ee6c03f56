"""Answer equivalence: normalised string match, then answer forms, exact numbers, then sympy.

The check runs in stages, cheapest first, and each stage either decides or passes on:

1. the normalised strings are equal (`normalize_answer`) -> equivalent; a decimal comma is
   read as a point first when that is the only sensible reading (`1,22` against `1.22`);
2. answer forms (`forms`): matrices entry by entry, whatever the environment and brackets
   (`pmatrix`, `bmatrix`, `matrix` and `array` in `\\left(...\\right)` or
   `\\left[...\\right]` are one kind; the shapes must agree; a `vmatrix` or an array in
   `|...|` is a determinant, never a matrix); a choice letter with its value (`(C)12`, from
   `\\textbf{(C) }12`) matches the letter (`C`, `(C)`) or the value (`12`), whichever the
   other side is; a relation that bounds one variable becomes its interval (`x > 3` is
   `(3,\\infty)`, `5 \\leq x` is `x \\geq 5`, `-2 \\le x \\le 7` is `[-2,7]`), `x \\neq 2`
   the two intervals around 2, other relations compare side by side, directly or mirrored;
3. tuples, intervals and lists (a top-level comma; `;`, `or`, `and` and `\\cup` separate
   answers too) are compared element by element: the brackets must agree (`(1, 2)` is not
   `[1, 2]`), tuples and intervals in order, bare lists and `\\{...\\}` sets in any order
   (so several boxes, or a reference given as a list of strings, against a list of answers:
   one box of two is wrong); a labelled answer (`AB=4`, `x_1=2`, `\\angle A=45`, a tuple of
   names `(p,q)=(3,2)`, a ratio of names `V_1:V_2=11:21`; `x \\approx 11` is `x = 11` and a
   leading `\\approx` is dropped) matches a bare value, two labelled answers need equal
   labels; ratios (`11:21`) compare term by term, as written (`11:21` is not `21:11`, nor
   `22:42`);
4. both sides are plain numbers (`parse_number`: integers, decimals, fractions, scientific
   notation such as `5.3e-5`, exact `Fraction`s) -> equal iff the values are equal (`033` is
   `33`, `27.0` is `27`; `6.0 \\times 10^{-27}` is exact arithmetic of stage 5);
5. both sides parse with the whitelist parser (`latex.parse_math`) and evaluate to rationals
   -> equal iff the values are equal; an answer outside the parser's subset (words,
   relations, past a size cap) can only match by string, so -> not equivalent;
6. otherwise sympy decides (`symbolic_equal`): the difference is zero after automatic
   evaluation, or after `sympy.simplify`, or, with no free symbols, numerically to 1e-40.
   Two equations (`y=-\\frac{1}{2}x+\\frac{3}{4}` and `2x+4y-3=0`) are equal when `lhs - rhs`
   of one is a non-zero constant multiple of the other's (`symbolic_equations_equal`).

Stages 1-5 are pure Python with bounded cost and are what `fast_verdict` runs in the parent
process; only stage 6 can be slow, and `RewardScorer` runs it in worker processes under a hard
timeout. Numbers compare exactly (`50\\%` is `50`, not `0.5`), with one exception for rounded
decimals: a decimal with at least 4 digits after the point and at least 4 significant digits
matches an exact rational written as a fraction or expression that rounds to it
(`|decimal - value| <= 0.5 * 10^-k` for k decimals): `2.6667` and `0.3333` match `\\frac{8}{3}`
and `\\frac{1}{3}`, while `0.333` and `0.33` do not match `\\frac{1}{3}`, two decimals always
compare exactly, and an irrational value (`\\pi`, `\\sqrt{2}`) still needs an exact form.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from da3po_jax.rewards.forms import (
    MIRROR,
    as_interval,
    choice_parts,
    decimal_comma,
    equation_sides,
    equations_equal,
    excluded_point,
    has_relation,
    is_plain_decimal,
    matrix_entries,
    ratio_terms,
    relation_parts,
    rounds_to,
    split_label,
)
from da3po_jax.rewards.latex import Node, ParseError, eval_rational, parse_math, to_sympy
from da3po_jax.rewards.normalize import normalize_answer
from da3po_jax.rewards.numeric import TooLarge, parse_number

__all__ = [
    "fast_verdict",
    "is_equivalent",
    "split_sequence",
    "symbolic_equal",
    "symbolic_equations_equal",
]

MAX_SEQUENCE_CHARS = 2_000
MAX_SEQUENCE_ITEMS = 32
MAX_SEQUENCE_NESTING = 4
NUMERIC_TOLERANCE_DIGITS = 40
_OPENERS = {"(": ")", "[": "]", "{": "}"}
_UNORDERED = ("", "{}")


def _top_level_split(s: str) -> list[str] | None:
    """Splits at commas outside brackets; None if the brackets do not balance."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s) and s[i + 1] in "{}":
            depth += 1 if s[i + 1] == "{" else -1
            i += 2
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(s[start:i])
            start = i + 1
        if depth < 0:
            return None
        i += 1
    if depth != 0:
        return None
    parts.append(s[start:])
    return parts


def _enclosing(s: str) -> tuple[str, str]:
    """(bracket kind, inner) if one bracket pair encloses all of `s`, else ("", s)."""
    if s.startswith("\\{") and s.endswith("\\}") and len(s) >= 4:
        inner = s[2:-2]
        if _top_level_split(inner) is not None:
            return "{}", inner
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]":
        inner = s[1:-1]
        if _top_level_split(inner) is not None:
            return s[0] + s[-1], inner
    return "", s


def split_sequence(s: str) -> tuple[str, list[str]] | None:
    """Splits a normalised tuple, interval, set or list into its elements.

    Args:
      s: a normalised answer.

    Returns:
      `(kind, elements)` with kind one of `"()"`, `"[]"`, `"(]"`, `"[)"`, `"{}"` (a set)
      or `""` (a bare list), or None if `s` has no top-level comma (a single value).
    """
    kind, inner = _enclosing(s)
    parts = _top_level_split(inner)
    if parts is None or len(parts) < 2:
        return None
    return kind, parts


def _sequence_verdict(
    p: tuple[str, list[str]] | None, r: tuple[str, list[str]] | None, symbolic: bool, level: int
) -> bool | None:
    if p is None or r is None or level >= MAX_SEQUENCE_NESTING:
        return False
    (pk, pe), (rk, re_) = p, r
    same_kind = pk == rk or (pk in _UNORDERED and rk in _UNORDERED)
    if not same_kind or len(pe) != len(re_) or len(pe) > MAX_SEQUENCE_ITEMS:
        return False
    if pk in _UNORDERED:
        return _unordered_verdict(pe, re_, symbolic, level)
    undecided = False
    for a, b in zip(pe, re_):
        v = _verdict(a, b, symbolic, level + 1)
        if v is False:
            return False
        undecided |= v is None
    return None if undecided else True


def _unordered_verdict(pe: list[str], re_: list[str], symbolic: bool, level: int) -> bool | None:
    """Matches elements greedily (valid because equivalence is transitive)."""
    unused = list(range(len(re_)))
    for a in pe:
        found = False
        for j in unused:
            v = _verdict(a, re_[j], symbolic, level + 1)
            if v is None:
                return None
            if v:
                unused.remove(j)
                found = True
                break
        if not found:
            return False
    return True


def _value_node(s: str) -> tuple[Node, Any]:
    """(AST, exact value or None) of a normalised scalar answer."""
    number = parse_number(s)
    if number is not None:
        return ("num", number), number
    node = parse_math(s)
    return node, eval_rational(node)


def _rounded_match(p: str, pv: Any, r: str, rv: Any) -> bool:
    """A long decimal on one side that the exact value on the other rounds to (`2.6667`)."""
    if is_plain_decimal(p) and not is_plain_decimal(r):
        return rounds_to(p, rv)
    if is_plain_decimal(r) and not is_plain_decimal(p):
        return rounds_to(r, pv)
    return False


def _scalar_verdict(p: str, r: str, symbolic: bool) -> bool | None:
    if p == r:
        return True
    if not p or not r:
        return False
    try:
        (pn, pv), (rn, rv) = _value_node(p), _value_node(r)
    except (ParseError, TooLarge, RecursionError):
        return False
    if pv is not None and rv is not None:
        return pv == rv or _rounded_match(p, pv, r, rv)
    if not symbolic:
        return None
    return symbolic_equal(pn, rn)


def _matrix_verdict(p: str, r: str, symbolic: bool, level: int) -> bool | None:
    pm, rm = matrix_entries(p), matrix_entries(r)
    if pm is None or rm is None or pm[0] != rm[0] or level >= MAX_SEQUENCE_NESTING:
        return False
    (_, prows), (_, rrows) = pm, rm
    if [len(row) for row in prows] != [len(row) for row in rrows]:
        return False
    undecided = False
    for prow, rrow in zip(prows, rrows):
        for a, b in zip(prow, rrow):
            v = _verdict(a, b, symbolic, level + 1)
            if v is False:
                return False
            undecided |= v is None
    return None if undecided else True


def _relation_verdict(p: str, r: str, symbolic: bool, level: int) -> bool | None:
    """Relations that are not intervals: side by side, directly or mirrored."""
    pp, rp = relation_parts(p), relation_parts(r)
    if pp is None or rp is None or level >= MAX_SEQUENCE_NESTING:
        return False
    (ps, pops), (rs, rops) = pp, rp
    if len(pops) != len(rops):
        return False
    candidates = []
    if pops == rops:
        candidates.append(rs)
    if pops == [MIRROR[op] for op in reversed(rops)]:
        candidates.append(rs[::-1])
    undecided = False
    for sides in candidates:
        verdicts = [_verdict(a, b, symbolic, level + 1) for a, b in zip(ps, sides)]
        if all(v is True for v in verdicts):
            return True
        undecided |= False not in verdicts
    return None if undecided else False


def _pairwise(pairs: Iterable[tuple[str, str]], symbolic: bool, level: int) -> bool | None:
    """True if every pair is equivalent, False if one is not, else None (undecided)."""
    undecided = False
    for a, b in pairs:
        v = _verdict(a, b, symbolic, level + 1)
        if v is False:
            return False
        undecided |= v is None
    return None if undecided else True


def _ratio_verdict(
    pt: list[str] | None, rt: list[str] | None, symbolic: bool, level: int
) -> bool | None:
    """Ratios term by term, as written (`11:21` is not `22:42`)."""
    if pt is None or rt is None or len(pt) != len(rt) or level >= MAX_SEQUENCE_NESTING:
        return False
    return _pairwise(zip(pt, rt), symbolic, level)


def _choice_verdict(p: str, r: str, pc, rc, symbolic: bool, level: int) -> bool | None:
    """A choice letter with its value (`(C)12`) against a letter (`C`, `(C)`: the letters
    decide), a value (`12`: the values decide) or both (both must agree); `pc`, `rc` are
    the two sides' `choice_parts`."""
    if level >= MAX_SEQUENCE_NESTING:
        return False
    if pc is not None and rc is not None:
        if pc[0] != rc[0]:
            return False
        return _verdict(pc[1], rc[1], symbolic, level + 1) if pc[1] and rc[1] else True
    value, other = (pc[1], r) if pc is not None else (rc[1], p)
    return _verdict(value, other, symbolic, level + 1)


def _is_tuple_label(s: str) -> bool:
    label = split_label(s)[0] if "=" in s else None
    return label is not None and label.startswith("(")


def _label_verdict(p: str, r: str, symbolic: bool, level: int) -> bool | None:
    """`AB=4` against `4` (the value decides) or `AB=4` (the labels must agree too)."""
    (pl, pv), (rl, rv) = split_label(p), split_label(r)
    if pl is not None and rl is not None and pl != rl:
        return False
    return _verdict(pv, rv, symbolic, level)


def _verdict(p: str, r: str, symbolic: bool, level: int = 0) -> bool | None:
    p, r = p.strip(), r.strip()
    if p == r:
        return True
    if len(p) > MAX_SEQUENCE_CHARS or len(r) > MAX_SEQUENCE_CHARS:
        return _scalar_verdict(p, r, symbolic)
    if "\\begin" in p or "\\begin" in r:
        return _matrix_verdict(p, r, symbolic, level)
    pc, rc = choice_parts(p), choice_parts(r)
    if (pc and rc) or (pc and pc[1]) or (rc and rc[1]):
        return _choice_verdict(p, r, pc, rc, symbolic, level)
    p, r = (as_interval(p) or excluded_point(p) or p), (as_interval(r) or excluded_point(r) or r)
    if _is_tuple_label(p) or _is_tuple_label(r):  # `(p,q)=(3,2)`: not a list of two
        return _label_verdict(p, r, symbolic, level)
    ps, rs = split_sequence(p), split_sequence(r)
    if ps is not None or rs is not None:
        return _sequence_verdict(ps, rs, symbolic, level)
    (pk, pi), (rk, ri) = _enclosing(p), _enclosing(r)
    if (pk == "{}") != (rk == "{}") and level < MAX_SEQUENCE_NESTING:  # `\{0\}` is `0`
        return _verdict(pi if pk == "{}" else p, ri if rk == "{}" else r, symbolic, level + 1)
    if has_relation(p) or has_relation(r):
        return _relation_verdict(p, r, symbolic, level)
    if split_label(p)[0] is not None or split_label(r)[0] is not None:
        return _label_verdict(p, r, symbolic, level)
    if ":" in p or ":" in r:
        return _ratio_verdict(ratio_terms(p), ratio_terms(r), symbolic, level)
    return _scalar_verdict(p, r, symbolic)


def _equation_verdict(pred: str, ref: str, symbolic: bool) -> bool | None:
    """Whole equations (`y=2x+1` against `2x-y+1=0`), or None/False when not both equations.

    Skipped when both left sides are the same label: the label-stripped comparison already
    compared the right sides.
    """
    p, r = normalize_answer(pred, strip_label=False), normalize_answer(ref, strip_label=False)
    pe, re_ = equation_sides(p), equation_sides(r)
    if pe is None or re_ is None:
        return False
    if pe[0] == re_[0] and split_label(p)[0] is not None:
        return False
    try:
        nodes = [parse_math(side) for side in (*pe, *re_)]
    except (ParseError, RecursionError):
        return False
    if not symbolic:
        return None
    return symbolic_equations_equal(nodes[:2], nodes[2:])


def _top_verdict(pred: str, ref: str, symbolic: bool) -> bool | None:
    """The whole check: normalise, read a decimal comma, compare, then try equations."""
    p, r = normalize_answer(pred), normalize_answer(ref)
    p = decimal_comma(p, r) or p
    r = decimal_comma(r, p) or r
    verdict = _verdict(p, r, symbolic)
    if verdict is True or "=" not in pred or "=" not in ref:
        return verdict
    equations = _equation_verdict(pred, ref, symbolic)
    if equations is True:
        return True
    return None if None in (verdict, equations) else False


def fast_verdict(pred: str, ref: str) -> bool | None:
    """Decides equivalence with the cheap stages 1-4 only (no sympy, bounded time).

    Args:
      pred: the extracted model answer (not yet normalised).
      ref: the reference answer (not yet normalised).

    Returns:
      True or False when decided, None when only the symbolic stage can tell.
    """
    return _top_verdict(pred, ref, symbolic=False)


def is_equivalent(pred: str, ref: str) -> bool:
    """Full equivalence check, sympy included. Runs in-process with no timeout.

    For untrusted model output at scale use `RewardScorer`, which runs this under a hard
    per-response timeout in worker processes.

    Args:
      pred: the extracted model answer (not yet normalised).
      ref: the reference answer (not yet normalised).

    Returns:
      Whether the answers are mathematically equivalent.
    """
    return bool(_top_verdict(pred, ref, symbolic=True))


def _is_tiny(sympy: Any, diff: Any, scale: Any) -> bool:
    digits = NUMERIC_TOLERANCE_DIGITS + 15
    value = sympy.N(diff, digits)
    magnitude = sympy.N(scale, digits)
    if not (value.is_number and magnitude.is_number) or value.has(sympy.nan, sympy.zoo):
        return False
    bound = sympy.Float(10, digits) ** (-NUMERIC_TOLERANCE_DIGITS)
    try:
        return bool(abs(value) <= bound * max(sympy.Integer(1), abs(magnitude)))
    except TypeError:  # not comparable (complex, infinite, ...)
        return False


def symbolic_equal(a: Node, b: Node) -> bool:
    """Whether two parsed answers are equal according to sympy.

    Equal if `a == b` structurally, or `a - b` is zero after sympy's automatic evaluation or
    after `sympy.simplify`; for expressions without free symbols, also if
    `|a - b| <= 1e-40 * max(1, |a|)` at 55 significant digits (catches identities simplify
    misses; an exact rational difference is never rounded away). Infinities match only
    structurally.

    Args:
      a: AST of the first answer (`latex.parse_math`).
      b: AST of the second answer.

    Returns:
      True if equal; False if not, or if an operand would be too large to build.
    """
    import sympy

    try:
        x, y = to_sympy(a), to_sympy(b)
    except (TooLarge, ZeroDivisionError):
        return False
    if x == y:  # also the only way infinities match (oo - oo is nan)
        return True
    diff = x - y
    if diff == 0:
        return True
    if diff.has(sympy.nan, sympy.zoo, sympy.oo, -sympy.oo):
        return False
    if diff.is_Rational:
        return False
    if sympy.simplify(diff) == 0:
        return True
    if diff.free_symbols or x.free_symbols or y.free_symbols:
        return False
    return _is_tiny(sympy, diff, x)


def symbolic_equations_equal(a: list[Node], b: list[Node]) -> bool:
    """Whether two equations, given as `[lhs, rhs]` ASTs, are equal up to a non-zero factor.

    See `forms.equations_equal`; False if a side would be too large to build.
    """
    import sympy

    try:
        x = (to_sympy(a[0]), to_sympy(a[1]))
        y = (to_sympy(b[0]), to_sympy(b[1]))
    except (TooLarge, ZeroDivisionError):
        return False
    return equations_equal(sympy, x, y)
