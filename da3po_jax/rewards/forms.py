"""Answer forms beyond one value: relations, matrices, labels, equations, decimal styles.

`verify` compares single values, tuples, intervals and sets; this module recognises the other
shapes final answers take and maps them onto those comparisons. Every function here works on
a normalised answer (`normalize_answer`) and is pure Python with bounded cost: a linear scan
or a regex without nested quantifiers, over strings that `verify` has already capped at
`MAX_FORM_CHARS`. The one slow step, comparing two equations with sympy
(`equations_equal`), runs only where `symbolic_equal` runs: in the scorer's killable workers.

* relations (`x \\geq 5`, `5 \\leq x`, `3 < x \\leq 7`): a variable bounded by values
  becomes the interval it describes (`[5,\\infty)`), so it matches an interval or the same
  relation written the other way round; `x \\neq 2` becomes the two intervals of the line
  without 2 (`(-\\infty,2)\\cup(2,\\infty)`); two bounds joined by `and` become one chain
  (`intersect_bounds`, called by `normalize_answer`); other relations match side by side,
  directly or mirrored (`a < b` is `b > a`);
* matrices (`pmatrix`, `bmatrix`, `matrix`, `array`, ...): rows and entries, compared entry
  by entry (a determinant `vmatrix` only matches another `vmatrix`);
* labels (`AB = 4`, `x_1 = 2`, `\\angle A = 45`, `f(x) = 2x`, `(p, q) = (3, 2)`, `a:b = 2:3`):
  a short name, a tuple of names or a ratio of names on the left of one `=`; a labelled
  answer matches a bare value, and two labelled answers need the same label;
* ratios (`11:21`): their terms, compared term by term;
* multiple-choice letters (`(C)`, `C`, and `(C)12` from `\\textbf{(C) }12`): the letter and
  the value written after it;
* equations (`2x + 4y - 3 = 0`): equal when `lhs - rhs` of one is a non-zero constant
  multiple of that of the other;
* a decimal comma (`1,22` for `1.22`) and rounded decimals (`2.6667` for `8/3`).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from da3po_jax.rewards.extract import find_closing_brace
from da3po_jax.rewards.latex import GREEK

__all__ = [
    "MAX_FORM_CHARS",
    "MAX_MATRIX_ENTRIES",
    "MIRROR",
    "as_interval",
    "choice_parts",
    "decimal_comma",
    "excluded_point",
    "equation_sides",
    "equations_equal",
    "has_relation",
    "intersect_bounds",
    "is_label",
    "is_plain_decimal",
    "matrix_entries",
    "ratio_terms",
    "relation_parts",
    "rounds_to",
    "split_label",
]

MAX_FORM_CHARS = 2_000
MAX_MATRIX_ENTRIES = 64
MAX_RELATIONS = 2  # `a < x < b`; longer chains are compared as strings only
MIN_ROUNDED_DECIMALS = 4
MIN_ROUNDED_SIGNIFICANT = 4
MAX_ROUNDED_DECIMALS = 60

_MATRIX_BEGIN_RE = re.compile(r"\\begin\{([pbBvV]?matrix|array|smallmatrix)\}")
_RELATION_RE = re.compile(r"\\leq|\\geq|\\neq|<|>|\\lt(?![a-zA-Z])|\\gt(?![a-zA-Z])")
_RELATION_NAMES = {"\\lt": "<", "\\gt": ">"}
MIRROR = {"<": ">", ">": "<", "\\leq": "\\geq", "\\geq": "\\leq", "\\neq": "\\neq"}
_VARIABLE_RE = re.compile(r"(?:[A-Za-z]|\\([a-zA-Z]{2,8}))(?:_\{?[A-Za-z0-9]{1,3}\}?)?")
_NAME = (
    r"(?:[A-Za-z]{1,3}|\\[a-zA-Z]{2,8}|\\angle ?[A-Z]{1,3}|[A-Za-z](?:\^\{-1\})?\([a-z]\))"
    r"(?:_\{?[A-Za-z0-9]{1,3}\}?)?"
)
# A label: one name (`AB`, `x_1`, `\\angle A`, `f(x)`), a tuple of names (`(p,q)`) or a
# ratio of names (`V_1:V_2`); at most 8 names.
_LABEL_RE = re.compile(rf"{_NAME}|\((?:{_NAME},){{1,7}}{_NAME}\)|(?:{_NAME}:){{1,7}}{_NAME}")
_CHOICE_RE = re.compile(r"\(([A-E])\)((?:[^,].*)?)", re.DOTALL)  # not `(A),(C)`: a list
MAX_RATIO_TERMS = 8
_COMMAND_RE = re.compile(r"\\[a-zA-Z]+")
_DECIMAL_COMMA_RE = re.compile(r"[+-]?\d+,\d{1,2}")
_POINT_DECIMAL_RE = re.compile(r"[+-]?\d*\.\d+")
_PLAIN_DECIMAL_RE = re.compile(r"[+-]?(\d*)\.(\d+)|[+-]?\d+")


def has_relation(s: str) -> bool:
    """Whether `s` holds an order or inequality relation (`<`, `\\leq`, `\\neq`, ...)."""
    return "<" in s or ">" in s or "\\leq" in s or "\\geq" in s or "\\neq" in s or "\\lt" in s


def relation_parts(s: str) -> tuple[list[str], list[str]] | None:
    """Splits `a < b \\leq c` into `(["a", "b", "c"], ["<", "\\leq"])`.

    Returns:
      The sides and the relations between them, or None if `s` has no relation, more than
      `MAX_RELATIONS` of them, an empty side, or is longer than `MAX_FORM_CHARS`.
    """
    if len(s) > MAX_FORM_CHARS:
        return None
    sides: list[str] = []
    ops: list[str] = []
    pos = 0
    for m in _RELATION_RE.finditer(s):
        if len(ops) == MAX_RELATIONS:
            return None
        sides.append(s[pos : m.start()].strip())
        ops.append(_RELATION_NAMES.get(m.group(), m.group()))
        pos = m.end()
    sides.append(s[pos:].strip())
    if not ops or not all(sides):
        return None
    return sides, ops


def _is_variable(s: str) -> bool:
    """One variable: a letter or a Greek letter (not `\\pi`), with an optional subscript."""
    m = _VARIABLE_RE.fullmatch(s)
    return m is not None and (m.group(1) is None or m.group(1) in GREEK)


def _is_value(s: str) -> bool:
    """A side without variables: letters only in non-Greek commands (`\\frac`, `\\pi`)."""
    if "=" in s or "," in s:
        return False
    if any(m.group()[1:] in GREEK for m in _COMMAND_RE.finditer(s)):
        return False
    return not any(c.isalpha() for c in _COMMAND_RE.sub("", s))


def _bound(value: str, closed: bool, lower: bool) -> str:
    return ("[" if closed else "(") + value if lower else value + ("]" if closed else ")")


def as_interval(s: str) -> str | None:
    """The interval a variable-bounding relation describes, as a normalised string.

    `x > 3` -> `(3,\\infty)`, `5 \\leq x` -> `[5,\\infty)`, `3 < x \\leq 7` -> `(3,7]`.

    Returns:
      The interval, or None if `s` is not one variable bounded by values on one side or
      between two (`x \\neq 3`, `x + y < 1` and `x < y` are not intervals).
    """
    parts = relation_parts(s)
    if parts is None:
        return None
    sides, ops = parts
    if "\\neq" in ops:
        return None
    if len(ops) == 1:
        if _is_variable(sides[1]) and _is_value(sides[0]):
            sides, ops = sides[::-1], [MIRROR[ops[0]]]
        if not (_is_variable(sides[0]) and _is_value(sides[1])):
            return None
        op, value = ops[0], sides[1]
        if op in ("<", "\\leq"):
            return "(-\\infty," + _bound(value, op == "\\leq", lower=False)
        return _bound(value, op == "\\geq", lower=True) + ",\\infty)"
    low, var, high = sides
    if not (_is_variable(var) and _is_value(low) and _is_value(high)):
        return None
    if all(op in (">", "\\geq") for op in ops):
        low, high, ops = high, low, [MIRROR[ops[1]], MIRROR[ops[0]]]
    if not all(op in ("<", "\\leq") for op in ops):
        return None
    return _bound(low, ops[0] == "\\leq", lower=True) + "," + _bound(high, ops[1] == "\\leq", False)


def _one_bound(s: str) -> tuple[str, bool, str, str] | None:
    """`x \\geq -2` -> `("x", True, "-2", "\\leq")`: (variable, is a lower bound, value,
    the relation as written in a chain `value op x` or `x op value`); None if `s` is not one
    variable bounded on one side by a value."""
    parts = relation_parts(s)
    if parts is None or len(parts[1]) != 1 or parts[1][0] == "\\neq":
        return None
    (lhs, rhs), op = parts[0], parts[1][0]
    if _is_variable(rhs) and _is_value(lhs):
        lhs, rhs, op = rhs, lhs, MIRROR[op]
    if not (_is_variable(lhs) and _is_value(rhs)):
        return None
    lower = op in (">", "\\geq")
    return lhs, lower, rhs, MIRROR[op] if lower else op


def intersect_bounds(a: str, b: str) -> str | None:
    """Two bounds on one variable, one lower and one upper, as the chain they mean together:
    `x \\geq -2` and `x \\leq 7` -> `-2 \\leq x \\leq 7` (None for any other pair)."""
    first, second = _one_bound(a), _one_bound(b)
    if first is None or second is None or first[0] != second[0] or first[1] == second[1]:
        return None
    low, high = (first, second) if first[1] else (second, first)
    return f"{low[2]} {low[3]} {low[0]} {high[3]} {high[2]}"


def excluded_point(s: str) -> str | None:
    """`x \\neq 2` -> `(-\\infty,2),(2,\\infty)`: the line without one point, as the list of
    its two intervals (what `(-\\infty,2)\\cup(2,\\infty)` normalises to); else None."""
    parts = relation_parts(s)
    if parts is None or parts[1] != ["\\neq"]:
        return None
    lhs, rhs = parts[0]
    if _is_variable(rhs) and _is_value(lhs):
        lhs, rhs = rhs, lhs
    if not (_is_variable(lhs) and _is_value(rhs)):
        return None
    return f"(-\\infty,{rhs}),({rhs},\\infty)"


def _unwrap_matrix(s: str) -> str:
    """`(\\begin{matrix}...\\end{matrix})` -> the environment (brackets written outside)."""
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and s[1:].startswith("\\begin{"):
        return s[1:-1]
    return s


def matrix_entries(s: str) -> tuple[str, list[list[str]]] | None:
    """Splits a matrix environment into `(kind, rows of entries)`.

    `kind` is "det" for `vmatrix` / `Vmatrix` and "matrix" for every other environment (the
    bracket style of a matrix does not change its value). Rows are separated by `\\\\`,
    entries by `&`; a trailing empty row is ignored; `array`'s column spec is skipped.

    Returns:
      `(kind, rows)`, or None if `s` is not one matrix environment, holds a nested one, or
      has more than `MAX_MATRIX_ENTRIES` entries or `MAX_FORM_CHARS` characters.
    """
    s = _unwrap_matrix(s)
    if len(s) > MAX_FORM_CHARS:
        return None
    m = _MATRIX_BEGIN_RE.match(s)
    if m is None:
        return None
    end = "\\end{" + m.group(1) + "}"
    if not s.endswith(end) or len(s) < m.end() + len(end):
        return None
    body = s[m.end() : len(s) - len(end)]
    if m.group(1) == "array" and body.startswith("{"):
        close = find_closing_brace(body, 0)
        body = body[close + 1 :] if close is not None else body
    if "\\begin" in body or body.count("&") + body.count("\\\\") >= MAX_MATRIX_ENTRIES:
        return None
    rows = [row.strip() for row in body.split("\\\\")]
    if rows and not rows[-1]:
        rows.pop()
    entries = [[e.strip() for e in row.split("&")] for row in rows]
    if not entries or any(not e for row in entries for e in row):
        return None
    return ("det" if m.group(1) in ("vmatrix", "Vmatrix") else "matrix"), entries


def is_label(s: str) -> bool:
    """Whether `s` (whitespace removed) names what an answer is: a name of at most three
    letters, one command (`\\alpha`, `\\angle A`) or a function of one variable (`f(x)`,
    `f^{-1}(x)`), with an optional short subscript; a tuple of names (`(p,q)`) or a ratio of
    names (`V_1:V_2`)."""
    return len(s) <= MAX_FORM_CHARS and _LABEL_RE.fullmatch(s) is not None


def split_label(s: str) -> tuple[str | None, str]:
    """`AB=4` -> `("AB", "4")`, `(p,q)=(3,2)` -> `("(p,q)", "(3,2)")`; `(label, s)` with
    label None if `s` is not labelled (no `is_label` left side of the only `=` in `s`)."""
    if s.count("=") != 1:
        return None, s
    lhs, rhs = s.split("=")
    if rhs and is_label(lhs):
        return lhs, rhs
    return None, s


def ratio_terms(s: str) -> list[str] | None:
    """`11:21` -> `["11", "21"]`: the terms of a ratio, or None if `s` has no `:`, an empty
    term, an `=`, or more than `MAX_RATIO_TERMS` terms."""
    if ":" not in s or "=" in s or s.count(":") >= MAX_RATIO_TERMS or len(s) > MAX_FORM_CHARS:
        return None
    terms = s.split(":")
    return terms if all(terms) else None


def choice_parts(s: str) -> tuple[str, str] | None:
    """`(C)12` -> `("C", "12")`, `(C)` -> `("C", "")`, `C` -> `("C", "")`: a multiple-choice
    letter (A-E) and the value written after it; None for anything else."""
    if len(s) == 1 and s in "ABCDE":
        return s, ""
    m = _CHOICE_RE.fullmatch(s)
    return None if m is None else (m.group(1), m.group(2))


def equation_sides(s: str) -> tuple[str, str] | None:
    """`(lhs, rhs)` of an equation with one `=` and no other relation, else None."""
    if len(s) > MAX_FORM_CHARS or s.count("=") != 1 or has_relation(s):
        return None
    lhs, rhs = s.split("=")
    if not lhs or not rhs:
        return None
    return lhs, rhs


def decimal_comma(a: str, b: str) -> str | None:
    """`a` with its comma read as a decimal point, if that is the only sensible reading.

    `1,22` is read as 1.22 only when `b` is a decimal with a point: a single comma followed
    by one or two digits cannot be a thousands separator, and a point-decimal on the other
    side says that a number, not a list of two, is meant. `1,000` is never rewritten.
    """
    if _DECIMAL_COMMA_RE.fullmatch(a) and _POINT_DECIMAL_RE.fullmatch(b):
        return a.replace(",", ".")
    return None


def rounds_to(text: str, value: Fraction) -> bool:
    """Whether the decimal `text` is the exact rational `value` rounded to its digits.

    Applies only to decimals with at least `MIN_ROUNDED_DECIMALS` digits after the point and
    `MIN_ROUNDED_SIGNIFICANT` significant digits (`2.6667`, `0.3333`, not `0.333` or
    `0.0001`), and only when `value` has no exact decimal of that length (else the exact
    comparison already decided): then `|text - value| <= 0.5 * 10^-k` for k decimals.
    """
    m = _PLAIN_DECIMAL_RE.fullmatch(text)
    if m is None or m.group(2) is None:
        return False
    digits = m.group(2)
    if not MIN_ROUNDED_DECIMALS <= len(digits) <= MAX_ROUNDED_DECIMALS:
        return False
    if len((m.group(1) + digits).lstrip("0")) < MIN_ROUNDED_SIGNIFICANT:
        return False
    scale = 10 ** len(digits)
    if (value * scale).denominator == 1:
        return False
    return abs(Fraction(text) - value) * 2 * scale <= 1


def is_plain_decimal(text: str) -> bool:
    """Whether `text` is an integer or a decimal literal (no fraction, no expression)."""
    return _PLAIN_DECIMAL_RE.fullmatch(text) is not None


def equations_equal(sympy: Any, a: tuple[Any, Any], b: tuple[Any, Any]) -> bool:
    """Whether two equations (sympy sides) are the same up to rearrangement and scale.

    `lhs - rhs` of each is formed; the equations are equal when both are identically zero,
    or when their quotient is a non-zero constant (after `cancel`, then `simplify`). Runs in
    the scorer's worker processes only (sympy, no time bound of its own).
    """
    d1, d2 = sympy.expand(a[0] - a[1]), sympy.expand(b[0] - b[1])
    if d1 == 0 or d2 == 0:
        return d1 == 0 and d2 == 0
    if d1.has(sympy.nan, sympy.zoo, sympy.oo, -sympy.oo) or not d1.free_symbols:
        return False
    if d2.has(sympy.nan, sympy.zoo, sympy.oo, -sympy.oo) or not d2.free_symbols:
        return False
    ratio = sympy.cancel(d1 / d2)
    if ratio.free_symbols:
        ratio = sympy.simplify(ratio)
    if ratio.free_symbols or not ratio.is_number:
        return False
    return bool(ratio != 0 and ratio.is_finite)
