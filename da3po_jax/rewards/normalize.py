"""String normalisation of math answers before comparison.

`normalize_answer` maps surface variants of one answer to one string, so most equivalent
answers already match as strings and never need sympy:

* math delimiters (`$`, `\\(`, `\\[`), `\\displaystyle`, a whole-answer `\\boxed{}`, outer
  braces and a trailing `.` are removed;
* `\\dfrac`/`\\tfrac`/`\\cfrac` become `\\frac`; `\\frac12` becomes `\\frac{1}{2}`, `\\sqrt2`
  becomes `\\sqrt{2}`, a whole-answer `a/b` of integers becomes `\\frac{a}{b}`;
* `\\left`/`\\right`/`\\big`, spacing commands (`\\,`, `\\!`, `\\quad`, `~`) and all
  whitespace go (one space is kept between a command and a following letter: `\\pi r`);
* `\\text{}`-like groups are unwrapped, except a trailing group of plain words after some
  math, which is a unit (`5\\text{ cm}` -> `5`); a unit of several groups after a number
  (`3.3 \\mathrm{~km} / \\mathrm{s}`, `6 \\text{erg} \\cdot \\text{s}`,
  `10^{20} \\mathrm{~cm}^{-3}`, `\\text{ m/s}`) goes too; trailing unit words (`5 cm`,
  `12 dollars`), degrees (`^\\circ`, `°`) and percent signs (`\\%`, `28 percent`)
  are removed, so `50\\%` matches `50` (but *not* `0.5`: a percentage and a fraction are
  different answers to most questions);
* a leading `\\approx` goes (`\\approx 11` -> `11`), and `\\approx` after a label is
  read as `=` (`x \\approx 11` -> `11`, `AB \\approx 11` -> `AB=11`); `\\approx` between
  two values stays, so `\\frac{22}{7} \\approx 3.14` matches neither value;
* a matrix row break with spacing (`\\\\[2pt]`) is a plain row break, a whole answer
  `\\mathbb{R}` is the interval `(-\\infty,\\infty)`, and an answer with one `\\pm` is the
  list of its two values (`\\pm 2` -> `2,-2`, `x = 1 \\pm \\sqrt{2}` -> `1+\\sqrt{2},1-\\sqrt{2}`);
* thousands separators are removed only when the whole answer is one number whose groups
  after the first have exactly three digits (`1,000`, `1{,}000`, `1\\,000`, `11,\\! 111`,
  `10 455`, also before a final `.`), never inside tuples or lists: `(1,000)` stays a pair,
  `1,23` and `1, 2, 3` stay lists;
* `x = 5` (a single short variable on the left) becomes `5` (unless `strip_label=False`);
* a leading `the answer is` goes; `;`, `\\cup` and the words `or` / `and` between answers
  become commas (`(11,7) or (7,11)` -> `(11,7),(7,11)`, a list `verify` treats as a set);
* ASCII relations become LaTeX (`>=` -> `\\geq`, `<=` -> `\\leq`, `!=` -> `\\neq`), and
  `\\lt` / `\\gt` become `<` / `>`; two bounds on one variable joined by `and` become one
  chain (`x \\geq -2 and x \\leq 7` -> `-2 \\leq x \\leq 7`);
* a few Unicode symbols become LaTeX (`π`, `√`, `−`, `×`, `≤`, `≈`); pure words are
  lowercased.

Every step is a linear scan or a regex without nested or adjacent unbounded quantifiers over
the same characters, so adversarial inputs cannot trigger catastrophic backtracking. Brace
handling is linear too: `strip_outer_braces` matches all braces in one pass with a stack
(not one scan per removed layer), and `_replace_text_groups` scans each group once and keeps
what it needs about the text before and after a group as running state (not re-joining or
re-stripping the string per group). A 1 MB answer of nested braces or of `\\text{a}` groups
normalises in about a second; the scorer only normalises answers of a few thousand characters.
"""

from __future__ import annotations

import re

from da3po_jax.rewards.extract import find_closing_brace
from da3po_jax.rewards.forms import intersect_bounds, is_label

__all__ = ["normalize_answer", "squash_whitespace", "strip_outer_braces"]

_UNICODE = {
    "\u03c0": "\\pi ",
    "\u221e": "\\infty ",
    "\u2212": "-",
    "\u00d7": "\\times ",
    "\u00b7": "\\cdot ",
    "\u22c5": "\\cdot ",
    "\u00f7": "\\div ",
    "\u221a": "\\sqrt ",
    "\u2264": "\\leq ",
    "\u2265": "\\geq ",
    "\u2260": "\\neq ",
    "\u00b0": "",
    "\u2013": "-",
    "\u00a0": " ",
    "\u2248": "\\approx ",
}
_LITERAL = (
    ("\\dfrac", "\\frac"),
    ("\\tfrac", "\\frac"),
    ("\\cfrac", "\\frac"),
    ("\\geqslant", "\\geq "),
    ("\\leqslant", "\\leq "),
    (">=", "\\geq "),
    ("<=", "\\leq "),
    ("!=", "\\neq "),
    ("\\dbinom", "\\binom"),
    ("\\tbinom", "\\binom"),
    ("\\displaystyle", ""),
    ("\\$", ""),
    ("$", ""),
    ("\\(", ""),
    ("\\)", ""),
    ("\\[", ""),
    ("\\]", ""),
    ("^{\\circ}", ""),
    ("^\\circ", ""),
    ("\\circ", ""),
    ("\\%", ""),
    ("%", ""),
    ("{,}", ","),
    ("**", "^"),
    ("\\cup", ","),
)
# `\\[2pt]`: a row break with extra spacing, before `\[` is read as a math delimiter.
_ROW_SPACING_RE = re.compile(
    r"\\\\\[[ \t]{0,3}-?[\d.]{0,8}[ \t]{0,3}(?:pt|em|ex|mm|cm|mu)[ \t]{0,3}\]"
)
_APPROX_RE = re.compile(r"\\approx(?![a-zA-Z])")
# One unit group at the end, joined to the one before by `/` or `\cdot` (`\mathrm{~km} /
# \mathrm{s}`, `\text{erg} \cdot \text{s}`, `\mathrm{~cm}^{-3}`, `\text{ m/s}`,
# `\mathrm{erg \cdot s}`).
_UNIT_PIECE_RE = re.compile(
    r"(?:/|\\cdot)?[ \t]*\\(?:text|mathrm|textrm|mbox)[ \t]*\{[ \t]*"
    r"[A-Za-z]{1,8}(?:[ \t]?(?:/|\\cdot)[ \t]?[A-Za-z]{1,8}){0,3}[ \t]*\}(?:\^\{?-?[1-4]\}?)?"
    r"[ \t]*\Z"
)
MAX_UNIT_PIECES = 6
_UNIT_WINDOW = 64
_REAL_LINE = frozenset({"\\mathbb{R}", "\\mathbb R"})
_PLUS_MINUS_RE = re.compile(r"\\pm(?![a-zA-Z])")
_SIZING_RE = re.compile(r"\\(?:left|right|[bB]igg?[lr]?|middle)(?![a-zA-Z])")
_SPACING_RE = re.compile(r"(?<!\\)\\[,;:! ]|\\q?quad(?![a-zA-Z])|\\(?:en|thin)space(?![a-zA-Z])|~")
_RELATION_RE = re.compile(r"\\(le|ge|ne)(?![a-zA-Z])")
_STRICT_RE = re.compile(r"\\([lg])t(?![a-zA-Z])")
# `11,\! 111`: a comma, then a negative thin space, is a thousands separator.
_COMMA_THINSPACE_RE = re.compile(r",[ \t]*\\![ \t]*")
_TEXT_RE = re.compile(
    r"\\(?:text|textbf|textrm|textit|textnormal|textup|mathrm|mathbf|mathit|mbox|hbox)\s*\{"
)
_UNIT_TEXT_RE = re.compile(r"[A-Za-z][A-Za-z .]*")
_UNIT_POWER_RE = re.compile(r"\^\{?[23]\}?")
_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(?:(?:,|\s{1,3})\d{3})+(?:\.\d+)?")
_WHITESPACE_RE = re.compile(r"(\\[a-zA-Z]+)\s+(?=[a-zA-Z])|\s+")
_EQUATION_SPLIT_RE = re.compile(r"=|\\in(?![a-zA-Z])")
_EQUATION_LHS_RE = re.compile(r"[A-Za-z](?:_\{?[A-Za-z0-9]{1,3}\}?)?|\\[a-zA-Z]{2,8}")
_FRAC_FIXES = (
    (re.compile(r"\\frac(\d|[a-zA-Z])(\d|[a-zA-Z])"), r"\\frac{\1}{\2}"),
    (re.compile(r"\\frac(\d|[a-zA-Z])\{"), r"\\frac{\1}{"),
    (re.compile(r"\\frac\{([^{}]{0,200})\}(\d|[a-zA-Z])"), r"\\frac{\1}{\2}"),
    (re.compile(r"\\sqrt(\d|[a-zA-Z])"), r"\\sqrt{\1}"),
)
_SLASH_FRACTION_RE = re.compile(r"([+-]?)(\d+)/(\d+)")
_LEADING_DOT_RE = re.compile(r"(?<![\d}])\.(\d)")
_WORD_RE = re.compile(r"[A-Za-z]{2,}")
# "The answer is ...", "so the final answer is: ..." before an answer (anchored: linear).
_ANSWER_PHRASE_RE = re.compile(
    r"(?:(?:so|thus|hence|therefore),?\s+)?(?:the\s+)?(?:final\s+)?answer\s+is\s*:?",
    re.IGNORECASE,
)
_SEPARATOR_WORDS = frozenset({"or", "and"})

UNIT_WORDS = frozenset(
    """
    unit units square sq cubic cm mm km m meter meters metre metres centimeter centimeters
    millimeter millimeters kilometer kilometers inch inches ft foot feet yard yards yd mile
    miles degree degrees deg dollar dollars cent cents second seconds sec minute minutes min
    hour hours hr hrs day days week weeks month months year years gram grams g kg kilogram
    kilograms pound pounds lb lbs ounce ounces oz liter liters litre litres ml mph people
    students ways cups cup points percent
""".split()
)


def _is_blank(s: str) -> bool:
    """Whether `s.strip() == ""` (without building the stripped copy)."""
    return not s or s.isspace()


def _replace_text_groups(s: str) -> str:
    """Unwraps `\\text{...}`-like groups; drops a trailing word-only group (a unit).

    Only the top-level groups are unwrapped (`\\text{\\text{a}}` -> `\\text{a}`); an
    unbalanced group leaves the rest of the string untouched. A group is a unit when its
    content is plain words, something other than whitespace precedes it, and only whitespace
    or a `^2`/`^{3}` power follows it; the group and everything after it are dropped.

    Linear time: the groups are disjoint, so the brace scans add up to one pass, and what
    precedes a group (non-blank?) and what follows it (blank or a power?) are answered from
    running state and from the string's last whitespace-free run, found once.
    """
    # `s[close + 1:].strip()` is "" or a unit power (2-4 characters, no whitespace) only
    # when `close + 1` is at or after `end` (the end of `s.rstrip()`), or falls in the
    # whitespace run `[blank, last)` before the last whitespace-free run `[last, end)`, or
    # inside that run.
    end = len(s)
    while end > 0 and s[end - 1].isspace():
        end -= 1
    last = end
    while last > 0 and not s[last - 1].isspace():
        last -= 1
    blank = last
    while blank > 0 and s[blank - 1].isspace():
        blank -= 1

    def unit_follows(start: int) -> bool:
        if start >= end:
            return True  # only whitespace follows
        if start < blank:
            return False  # something, whitespace, then more: not a bare power
        start = max(start, last)
        return end - start <= 4 and _UNIT_POWER_RE.fullmatch(s, start, end) is not None

    out = []
    pos = 0
    has_prefix = False  # whether "".join(out) has a non-whitespace character
    while True:
        m = _TEXT_RE.search(s, pos)
        if m is None:
            break
        close = find_closing_brace(s, m.end() - 1)
        if close is None:
            break  # unbalanced: leave the rest untouched
        content = s[m.end() : close]
        before = s[pos : m.start()]
        has_prefix = has_prefix or not _is_blank(before)
        is_unit = (
            has_prefix
            and _UNIT_TEXT_RE.fullmatch(content.strip()) is not None
            and unit_follows(close + 1)
        )
        out.append(before)
        if is_unit:
            return "".join(out)
        out.append(content)
        has_prefix = has_prefix or not _is_blank(content)
        pos = close + 1
    out.append(s[pos:])
    return "".join(out)


def _strip_trailing_units(s: str) -> str:
    """Removes up to three trailing unit words (`5 square cm` -> `5`) after a number."""
    for _ in range(3):
        t = s.rstrip()
        j = len(t)
        while j > 0 and not t[j - 1].isspace():
            j -= 1
        word, head = t[j:], t[:j].rstrip()
        m = _UNIT_POWER_RE.search(word)
        if m is not None and m.end() == len(word):
            word = word[: m.start()]
        if not head or word.lower() not in UNIT_WORDS or not any(c.isdigit() for c in head):
            return s
        s = head
    return s


_BRACE_TOKEN_RE = re.compile(r"\\.|[{}]", re.DOTALL)


def _brace_matches(s: str) -> dict[int, int]:
    """{index of `{`: index of its matching `}`} for every balanced `{` in `s`.

    One left-to-right pass with a stack, tokenised like `find_closing_brace` (a backslash
    escapes the next character; a `}` with nothing open is ignored).
    """
    matches: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE_TOKEN_RE.finditer(s):
        c = m.group()
        if c == "{":
            stack.append(m.start())
        elif c == "}" and stack:
            matches[stack.pop()] = m.start()
    return matches


def strip_outer_braces(s: str) -> str:
    """Removes braces that enclose the whole string: `{{5}}` -> `5`.

    Same result as repeating `s = s[1:-1].strip()` while `s` starts with a `{` whose
    matching `}` (`find_closing_brace`) is its last character, but in linear time: the
    matching braces of the whole string are found in one pass, and the start and end of the
    current string are moved inwards as indices. (The start always stays at a token boundary
    of that pass, since only `{` and whitespace are skipped, and a `}` matched in the pass is
    never escaped, so the inner string's braces match as they do in the whole string.)
    """
    if not s.startswith("{") or not s.endswith("}"):
        return s
    matches = _brace_matches(s)
    lo, hi = 0, len(s) - 1  # the current string is s[lo : hi + 1]
    while lo <= hi and s[lo] == "{" and matches.get(lo) == hi:
        lo, hi = lo + 1, hi - 1
        while lo <= hi and s[lo].isspace():
            lo += 1
        while hi >= lo and s[hi].isspace():
            hi -= 1
    return s[lo : hi + 1]


def _strip_compound_unit(s: str) -> str:
    """Removes a unit of one or more groups after a number (`3.3 \\mathrm{ km} / \\mathrm{s}`,
    `6 \\text{erg} \\cdot \\text{s}`, `10^{20} \\mathrm{ cm}^{-3}`, `5 \\text{ m/s}` -> the
    number). Bounded: at most `MAX_UNIT_PIECES` regex searches over the last `_UNIT_WINDOW`
    characters."""
    head, pieces = s, 0
    for _ in range(MAX_UNIT_PIECES):
        start = max(0, len(head) - _UNIT_WINDOW)
        m = _UNIT_PIECE_RE.search(head, start)
        if m is None:
            break
        head, pieces = head[: m.start()], pieces + 1
    if not pieces or not any(c.isdigit() for c in head):
        return s
    return head


def _approx_as_value(s: str) -> str:
    """`\\approx 11` -> `11`, `x \\approx 11` -> `x = 11` (a label, read as with `=`);
    any other use of `\\approx` (`\\frac{22}{7} \\approx 3.14`) is left as it is."""
    parts = _APPROX_RE.split(s)
    if len(parts) != 2 or not parts[1].strip():
        return s
    lhs, rhs = parts[0].strip(), parts[1].strip()
    if not lhs:
        return rhs
    if "=" not in lhs and is_label(squash_whitespace(lhs)):
        return lhs + " = " + rhs
    return s


def _expand_plus_minus(s: str) -> str:
    """`\\pm2` -> `2,-2`, `1\\pm\\sqrt{2}` -> `1+\\sqrt{2},1-\\sqrt{2}`: an answer with one
    `\\pm` (and no comma) is the list of its two values."""
    if "," in s or len(_PLUS_MINUS_RE.findall(s)) != 1:
        return s
    plus = _PLUS_MINUS_RE.sub("+", s)
    return (plus[1:] if plus.startswith("+") else plus) + "," + _PLUS_MINUS_RE.sub("-", s)


def _strip_box(s: str) -> str:
    for command in ("\\boxed", "\\fbox"):
        if s.startswith(command):
            rest = s[len(command) :].lstrip()
            if rest.startswith("{") and find_closing_brace(rest, 0) == len(rest) - 1:
                return rest[1:-1].strip()
    return s


def _strip_equation_lhs(s: str) -> str:
    """`x = 5` -> `5`, `x \\in [1, 2]` -> `[1, 2]` when the left side is a single variable."""
    parts = _EQUATION_SPLIT_RE.split(s)
    if len(parts) != 2:
        return s
    lhs, rhs = parts[0].strip(), parts[1].strip()
    if _EQUATION_LHS_RE.fullmatch(lhs) and rhs:
        return rhs
    return s


def _split_alternatives(s: str) -> str:
    """Turns `;` and the words `or` / `and` between answers into commas (a bare list).

    `(11,7) or (7,11)`, `-12; -11; -10` and `1, 2, and 3` all become comma lists, which
    `verify` compares as unordered sets; trailing unit words are removed from each part
    (`5 cm and 6 cm`). Two bounds on one variable joined by `and` are their intersection,
    a chain (`x \\geq -2 and x \\leq 7` -> `-2 \\leq x \\leq 7`), not a list. Works on
    whitespace-separated words (one linear `str.split`), so a long run of spaces or of `or`
    words costs a single pass.
    """
    if ";" in s:
        s = s.replace(";", ",")
    words = s.split()
    if not any(w.lower() in _SEPARATOR_WORDS for w in words):
        return _strip_trailing_units(s)
    parts: list[str] = []
    current: list[str] = []
    for w in words + ["or"]:
        if w.lower() not in _SEPARATOR_WORDS:
            current.append(w)
            continue
        part = _strip_trailing_units(" ".join(current)).strip().strip(",")
        if part:
            parts.append(part)
        current = []
    if len(parts) < 2:  # a lone `or`, or `1 and`: not a list of answers
        return _strip_trailing_units(s)
    if len(parts) == 2 and all(w.lower() != "or" for w in words):
        return intersect_bounds(parts[0], parts[1]) or ",".join(parts)
    return ",".join(parts)


def _strip_answer_phrase(s: str) -> str:
    """`The answer is Monday` -> `Monday` (a leading phrase that only announces the answer)."""
    m = _ANSWER_PHRASE_RE.match(s)
    return s[m.end() :].strip() if m is not None else s


def _latex_cleanup(s: str) -> str:
    """Delimiters, sizing and spacing commands, relation spellings, text groups, units."""
    for k, v in _UNICODE.items():
        if k in s:
            s = s.replace(k, v)
    if "\\\\[" in s:
        s = _ROW_SPACING_RE.sub(lambda m: "\\\\", s)
    for k, v in _LITERAL:
        if k in s:
            s = s.replace(k, v)
    s = _SIZING_RE.sub("", s)
    if "\\!" in s:
        s = _COMMA_THINSPACE_RE.sub(",", s)
    s = _SPACING_RE.sub(" ", s)
    s = _RELATION_RE.sub(lambda m: "\\" + m.group(1) + "q", s)
    if "\\lt" in s or "\\gt" in s:
        s = _STRICT_RE.sub(lambda m: " < " if m.group(1) == "l" else " > ", s)
    s = _strip_box(_strip_answer_phrase(s.strip()))
    if "\\approx" in s:
        s = _approx_as_value(s)
    s = _replace_text_groups(_strip_compound_unit(s))
    s = _strip_answer_phrase(s.strip())
    s = _split_alternatives(s)
    return s.strip()


def squash_whitespace(s: str) -> str:
    """`s` without whitespace, except one space between a command and a letter (`\\pi r`)."""
    return _WHITESPACE_RE.sub(lambda m: m.group(1) + " " if m.group(1) else "", s)


def normalize_answer(answer: str, strip_label: bool = True) -> str:
    """Returns the canonical string form of an answer (see the module docstring).

    Args:
      answer: an extracted model answer or a reference answer.
      strip_label: drop a single-variable left side (`x = 5` -> `5`). `verify` also
        normalises with False to compare whole equations (`y = 2x` against `2x - y = 0`).

    Returns:
      The normalised string (possibly empty).
    """
    s = _latex_cleanup(answer)
    if strip_label:
        s = _strip_equation_lhs(s)
    number = s.rstrip().rstrip(".")
    if _THOUSANDS_RE.fullmatch(number):
        s = number.replace(",", "")
    s = squash_whitespace(s)
    s = s.rstrip(".")
    for pattern, repl in _FRAC_FIXES:
        s = pattern.sub(repl, s)
    s = strip_outer_braces(_strip_box(s))
    m = _SLASH_FRACTION_RE.fullmatch(s)
    if m is not None:
        s = f"{m.group(1)}\\frac{{{m.group(2)}}}{{{m.group(3)}}}"
    s = _LEADING_DOT_RE.sub(r"0.\1", s)
    if "\\pm" in s:
        s = _expand_plus_minus(s)
    if _WORD_RE.fullmatch(s):
        s = s.lower()
    if s in _REAL_LINE:
        s = "(-\\infty,\\infty)"
    return s
