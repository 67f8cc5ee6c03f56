"""Final-answer extraction from a model response: a box, an `Answer:` line, `the answer is`.

The answer is looked for in three tiers, and the first tier that finds one decides:

1. explicit markers: the last `Answer: ...` line (DAPO's prompt format; case-insensitive,
   `**Answer:**` and `**Answer**:` markdown allowed), an `Answer` heading without a colon
   that a math span or a box follows (`Answer \\[ 9 \\]`, `**Answer** $9$`, `### Final
   Answer` over display math: only markdown and `Final` may precede the word on its line),
   or the last `\\boxed{...}` / `\\fbox{...}` (the MATH convention, balanced nested
   braces), whichever appears *last* in the response, since the final statement is the
   model's final answer;
2. an `... answer is ...` phrase (`the final answer is $X$. I hope it is correct.`, `the
   answer is \\[ 9 \\]`): the last one in the response;
3. with `fallback="last_expression"`, the last math expression of a response that has no
   marker at all: the last `$...$`, `$$...$$`, `\\(...\\)` or `\\[...\\]` span, or the last
   number if that comes later (`so Janet has 18 dollars left.`); of an expression `a + b = 7`
   whose right side is a value, that value.

What follows an `Answer:` marker, an `Answer` heading or an `answer is` phrase is a
*statement*: a math span right after it (`$X$`, `\\[ 9 \\]`, also on the next lines) is the
answer; otherwise a box on the line, or the line up to the end of its first sentence (`5
apples. I hope...` -> `5 apples`; a number followed by at most two words is that number).
A leading `The final answer is` inside an `Answer:` line is skipped (the Minerva format).

If the last box is malformed (unbalanced braces) it is *not* replaced by an earlier box or a
later tier: an earlier box may be an answer the model later retracted, so the response has
no answer.

References go through `extract_reference`: a reference that is a worked solution (a box, an
`Answer:` line, `The answer is ...`, GSM8K's `#### 72`) gives its final answer the same way,
and a reference wrapped whole in `$...$` (or `\\(...\\)`, `\\[...\\]`) gives its content;
a bare reference is returned unchanged (never the last-expression fallback: `1, 2, 3` is one
answer). A reference given as a list of strings (OlympiadBench's `final_answer`) is several
answers: each element's answer, joined with `, ` into one bare list (`["$2$", "$-3$"]` ->
`2, -3`), which `verify` compares as an unordered set.

Every function here is a single left-to-right scan, a right-to-left `rfind`, or a regex
without nested quantifiers, so the cost is linear in the response length (a 1 MB adversarial
response takes milliseconds to a few tenths of a second; whether an `Answer` is a heading is
read from at most `MAX_HEADING_PREFIX` characters before it). With `extract_answer(text,
max_chars=...)` (what the scorer uses) the brace scan of a box and the search for the end of
a math span also stop after `max_chars` characters, and a longer answer is none.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

__all__ = [
    "FALLBACKS",
    "MAX_BOXES",
    "extract_answer",
    "extract_answer_line",
    "extract_boxed",
    "extract_boxes",
    "extract_reference",
    "find_closing_brace",
    "last_expression",
]

MAX_BOXES = 32  # a response with more boxes is not read as one answer set

_BOX_COMMANDS = ("\\boxed", "\\fbox")
# `answer` (not inside a word; `__Answer__` is markdown), then markdown, then a colon (an
# `Answer:` line) or none (a heading, accepted by `_is_marker`). No nested quantifiers.
_ANSWER_RE = re.compile(r"(?<![A-Za-z0-9])answer[*_ \t]*(:)?", re.IGNORECASE)
# What may precede a heading `Answer` on its line: markdown and `Final`.
_HEADING_PREFIX_RE = re.compile(r"[#*_ \t]*(?:final[ \t]+)?", re.IGNORECASE)
MAX_HEADING_PREFIX = 16
_STATEMENT_OPENERS = ("$", "\\[", "\\(", "\\boxed", "\\fbox")
_MARKDOWN_CHARS = "*_ \t"
_BLANKS_RE = re.compile(r"[ \t]*")
_BARE_ARGUMENT_RE = re.compile(r"[^ \t\n$]*")
_ANSWER_LEAD_RE = re.compile(r"[\s*_]*")  # whitespace (as `str.isspace`) and markdown
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
FALLBACKS = ("last_expression", "none")
MAX_NUMBER_CHARS = 64  # the fallback's last number is read from this many characters
MAX_ESCAPED = 32  # escaped `\\$` skipped when looking for the end of a `$` span
# `... answer is ...` (the phrase tier), and the same phrase leading an `Answer:` line.
_PHRASE_RE = re.compile(r"\banswer[ \t]+is\b[ \t]*:?", re.IGNORECASE)
_LEAD_PHRASE_RE = re.compile(
    r"(?:the[ \t]+)?(?:final[ \t]+)?answer[ \t]+is\b[ \t]*:?", re.IGNORECASE
)
_MATH_DELIMITERS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))
_SENTENCE_END_RE = re.compile(r"\.(?=\s|$)")
_NUMBER_RE = re.compile(r"[+-]?\d[\d,]*(?:\.\d+)?(?:/\d+)?")
_SEPARATORS = frozenset({"or", "and"})
# The last number: `-12`, `1,250`, `3.5`, or digit groups split by spaces (`1 000 000`).
_LAST_NUMBER_RE = re.compile(r"(?:(?<![\w)\]}])-)?(?:\d{1,3}(?: \d{3})+|\d[\d,]*)(?:\.\d+)?\Z")
_COMMAND_RE = re.compile(r"\\[a-zA-Z]+")
_GSM_MARK = "####"


def find_closing_brace(text: str, open_index: int, max_len: int | None = None) -> int | None:
    """Returns the index of the `}` matching the `{` at `open_index`, or None if unbalanced.

    Escaped braces `\\{` and `\\}` (LaTeX set braces) are literal characters and do not
    count towards the nesting depth.

    Args:
      text: the string to scan.
      open_index: index of an opening `{` in `text`.
      max_len: if given, scan at most this many characters after the `{`: a group whose
        content is longer counts as never closing (bounds the scan of untrusted text).

    Returns:
      The index of the matching closing brace, or None if the group never closes.
    """
    depth = 0
    i = open_index
    n = len(text) if max_len is None else min(len(text), open_index + 2 + max(0, max_len))
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2  # skip the escaped character (`\{`, `\}`, `\\`, ...)
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _last_box_start(text: str) -> tuple[int, int] | None:
    """(start of the command, index just after its name) of the last box command."""
    best = None
    for command in _BOX_COMMANDS:
        pos = text.rfind(command)
        while pos >= 0:
            after = pos + len(command)
            # `\boxed` must not be a prefix of a longer command name (e.g. `\boxedx`).
            if after >= len(text) or not text[after].isalpha():
                break
            pos = text.rfind(command, 0, pos)
        if pos >= 0 and (best is None or pos > best[0]):
            best = (pos, pos + len(command))
    return best


def _box_content(text: str, after: int, max_chars: int | None = None) -> str | None:
    """Content of a box whose command name ends at `after`, or None if malformed/empty.

    With `max_chars`, a braced content longer than that (before stripping) is not scanned
    past and counts as malformed.
    """
    i = _BLANKS_RE.match(text, after).end()
    if i < len(text) and text[i] == "{":
        close = find_closing_brace(text, i, max_chars)
        if close is None:
            return None
        content = text[i + 1 : close].strip()
    elif i > after:
        # `\boxed 5` (no braces): the argument runs up to whitespace or a `$`.
        content = _BARE_ARGUMENT_RE.match(text, i).group()
    else:
        return None
    return content or None


def extract_boxed(text: str) -> str | None:
    """Returns the content of the last `\\boxed{...}` / `\\fbox{...}` in `text`.

    Nested braces are handled (`\\boxed{\\frac{1}{\\sqrt{2}}}` gives `\\frac{1}{\\sqrt{2}}`).

    Args:
      text: a model response or a reference solution.

    Returns:
      The stripped box content, or None if there is no box, the last box is unbalanced, or
      it is empty.
    """
    found = _last_box_start(text)
    if found is None:
        return None
    return _box_content(text, found[1])


def _last_match(
    pattern: re.Pattern[str], text: str, accept: Callable[[str, re.Match[str]], bool] | None = None
) -> re.Match[str] | None:
    """The last match of a pattern that starts with the word `answer` (any case) and that
    `accept` (if given) accepts.

    The candidates are found from the end with `rfind` on the lower-cased text (C speed,
    about 25 times faster than a case-insensitive regex scan of the whole text), and each is
    tried with an anchored match: linear in the length of `text`. If lower-casing changes
    the length (some non-ASCII letters), the regex scans the text instead.
    """
    low = text.lower()
    if len(low) != len(text):
        last = None
        for m in pattern.finditer(text):
            if accept is None or accept(text, m):
                last = m
        return last
    i = low.rfind("answer")
    while i >= 0:
        m = pattern.match(text, i)
        if m is not None and (accept is None or accept(text, m)):
            return m
        i = low.rfind("answer", 0, i)
    return None


def _is_marker(text: str, m: re.Match[str]) -> bool:
    """Whether an `answer` match marks the answer: `Answer:` anywhere, or `Answer` without a
    colon heading its line (`**Answer**`, `### Final Answer`, at most `MAX_HEADING_PREFIX`
    characters of markdown and `Final` before it) with a math span or a box right after it
    (on the same or a later line). Bounded work: a short window and one anchored match."""
    if m.group(1):
        return True
    lo = max(0, m.start() - MAX_HEADING_PREFIX)
    start = text.rfind("\n", lo, m.start()) + 1
    if (start == 0 and lo > 0) or not _HEADING_PREFIX_RE.fullmatch(text, start, m.start()):
        return False
    i = _ANSWER_LEAD_RE.match(text, m.end()).end()
    return text.startswith(_STATEMENT_OPENERS, i)


def _answer_line_match(text: str) -> re.Match[str] | None:
    return _last_match(_ANSWER_RE, text, _is_marker)


def _clean_line(line: str) -> str:
    line = line.strip().strip(_MARKDOWN_CHARS).strip()
    return line


def _find_close(text: str, close: str, start: int, stop: int) -> int:
    """Index of the first `close` in `text[start:stop]` not escaped by a backslash, or -1."""
    for _ in range(MAX_ESCAPED):
        end = text.find(close, start, stop)
        if end <= 0 or text[end - 1] != "\\" or close != "$":
            return end
        start = end + 1
    return -1


def _math_span_at(text: str, i: int, max_chars: int | None) -> tuple[str, int] | None:
    """(content, end) of the math span (`$...$`, `$$...$$`, `\\(...\\)`, `\\[...\\]`)
    opening at `i`; None if no span opens there, or it does not close (within `max_chars`
    characters)."""
    for opener, close in _MATH_DELIMITERS:
        if text.startswith(opener, i):
            start = i + len(opener)
            stop = len(text) if max_chars is None else start + max_chars + len(close)
            end = _find_close(text, close, start, min(stop, len(text)))
            return None if end < 0 else (text[start:end], end + len(close))
    return None


def _more_math_follows(text: str, end: int) -> bool:
    """Whether the rest of the line after `end` opens another math span (`$2$ and $3$`)."""
    stop = text.find("\n", end)
    rest = text[end : len(text) if stop < 0 else stop]
    return "$" in rest or "\\(" in rest


def _unbox(content: str, max_chars: int | None) -> str | None:
    """A span's content, or the content of the box it holds (`$\\boxed{3}$` -> `3`)."""
    box = _last_box_start(content)
    if box is not None:
        return _box_content(content, box[1], max_chars)
    return content.strip() or None


def _sentence(line: str) -> str | None:
    """The first sentence of a line, without markdown; a number followed by 1-2 words (a
    unit: `5 apples`) is that number. `5 but I never box it` stays as it is."""
    m = _SENTENCE_END_RE.search(line)
    if m is not None:
        line = line[: m.start()]
    line = _clean_line(line)
    words = line.split()
    if 2 <= len(words) <= 3 and _NUMBER_RE.fullmatch(words[0]):
        if all(w.isalpha() and w.lower() not in _SEPARATORS for w in words[1:]):
            return words[0]
    return line or None


def _statement(text: str, start: int, max_chars: int | None = None) -> str | None:
    """The answer stated after a marker ending at `start` (see the module docstring)."""
    i = _ANSWER_LEAD_RE.match(text, start).end()
    phrase = _LEAD_PHRASE_RE.match(text, i)
    if phrase is not None:
        i = _ANSWER_LEAD_RE.match(text, phrase.end()).end()
    span = _math_span_at(text, i, max_chars)
    if span is not None and not _more_math_follows(text, span[1]):
        return _unbox(span[0], max_chars)
    stop = text.find("\n", i)
    line = text[i : len(text) if stop < 0 else stop]
    box = _last_box_start(line)
    if box is not None:
        return _box_content(line, box[1], max_chars)
    return _sentence(line)


def extract_answer_line(text: str) -> str | None:
    """Returns the answer stated on the last `Answer: ...` line (case-insensitive).

    Markdown emphasis around the answer (`**Answer:** 5`) is removed. If the content is on
    the next line (`Answer:\\n5`) that line is used. A math span right after the marker
    (`Answer: $7$`, `Answer:\\n\\[ 7 \\]`) gives its content; if the line holds a box, the
    box content is returned. An `Answer` heading without a colon counts when a math span or
    a box follows it (`**Answer** $7$`, `### Final Answer\\n\\[ 7 \\]`).

    Args:
      text: a model response.

    Returns:
      The stripped answer, or None if there is no non-empty `Answer:` line.
    """
    m = _answer_line_match(text)
    if m is None:
        return None
    return _statement(text, m.end())


def _explicit_answer(text: str, max_chars: int | None) -> tuple[bool, str | None]:
    """(whether a box or `Answer:` line exists, the answer of the last of them)."""
    box = _last_box_start(text)
    line = _answer_line_match(text)
    if line is not None and (box is None or line.start() > box[0]):
        return True, _statement(text, line.end(), max_chars)
    if box is not None:  # also covers a box on the `Answer:` line itself
        return True, _box_content(text, box[1], max_chars)
    return False, None


def extract_answer(text: str, max_chars: int | None = None, fallback: str = "none") -> str | None:
    """Returns the model's final answer (the tiers are in the module docstring).

    Args:
      text: a model response.
      max_chars: if given, an answer longer than this counts as no answer (None), and a
        box's braces are scanned at most this far (a box whose content is longer before
        stripping is treated as malformed), so no answer over the cap reaches any parsing.
      fallback: "last_expression" to read the last math expression (or number) of a
        response without any marker, "none" to find no answer there.

    Returns:
      The extracted answer string (not normalised), or None if the response states no
      well-formed answer (or, with `max_chars`, only one past the cap).
    """
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
    if not isinstance(text, str) or not text:
        return None
    found, answer = _explicit_answer(text, max_chars)
    if not found:
        phrase = _last_match(_PHRASE_RE, text)
        if phrase is not None:
            found, answer = True, _statement(text, phrase.end(), max_chars)
    if not found and fallback == "last_expression":
        answer = last_expression(text)
    if answer is not None and max_chars is not None and len(answer) > max_chars:
        return None
    return answer


def extract_boxes(text: str, max_chars: int | None = None) -> list[str] | None:
    """Returns the contents of every outermost box in `text`, in order.

    Used when the reference is a set of several answers and the model boxed each element
    separately (`\\boxed{1}` and `\\boxed{2}`). A box inside another box is part of the
    outer one. Bounded work: one regex pass, then at most `MAX_BOXES` brace scans of at most
    `max_chars` characters each.

    Args:
      text: a model response.
      max_chars: as in `extract_answer`: a longer box is malformed.

    Returns:
      The stripped contents, or None if there are more than `MAX_BOXES` box commands or any
      outermost box is malformed or empty.
    """
    starts = []
    for m in _BOX_RE.finditer(text):
        if len(starts) == MAX_BOXES:
            return None
        starts.append(m)
    contents = []
    covered = -1  # end of the last outermost box: later commands before it are nested
    for m in starts:
        if m.start() <= covered:
            continue
        i = _BLANKS_RE.match(text, m.end()).end()
        if i >= len(text) or text[i] != "{":
            return None
        close = find_closing_brace(text, i, max_chars)
        content = None if close is None else text[i + 1 : close].strip()
        if not content:
            return None
        contents.append(content)
        covered = close
    return contents


def _rfind_unescaped_dollar(text: str, end: int) -> int:
    """Index of the last `$` in `text[:end]` not written as `\\$`, or -1."""
    for _ in range(MAX_ESCAPED):
        i = text.rfind("$", 0, end)
        if i <= 0 or text[i - 1] != "\\":
            return i
        end = i - 1
    return -1


def _last_dollar_span(text: str) -> tuple[int, str] | None:
    """(end, content) of the last `$...$` or `$$...$$` span; None if the `$` signs do not
    pair up (an odd count: a price, not math)."""
    if (text.count("$") - text.count("\\$")) % 2:
        return None
    end = _rfind_unescaped_dollar(text, len(text))
    if end < 0:
        return None
    if end > 0 and text[end - 1] == "$":
        start = text.rfind("$$", 0, end - 1)
        return None if start < 0 else (end + 1, text[start + 2 : end - 1])
    start = _rfind_unescaped_dollar(text, end)
    return None if start < 0 else (end + 1, text[start + 1 : end])


def _last_bracket_span(text: str, opener: str, close: str) -> tuple[int, str] | None:
    end = text.rfind(close)
    start = text.rfind(opener, 0, end) if end > 0 else -1
    return None if start < 0 else (end + len(close), text[start + len(opener) : end])


def _last_number(text: str) -> tuple[int, str] | None:
    """(end, text) of the last number: ten `rfind`s, then a regex over a short window. A
    number that may run on before the window (over `MAX_NUMBER_CHARS` characters) is none,
    never a piece of one."""
    end = max(text.rfind(d) for d in "0123456789")
    if end < 0:
        return None
    start = max(0, end - MAX_NUMBER_CHARS)
    m = _LAST_NUMBER_RE.search(text, start, end + 1)
    if m is None or (m.start() == start and start > 0 and text[start - 1] in "0123456789, "):
        return None
    return end + 1, m.group()


def _value_side(expression: str) -> str:
    """`a + b = 7` -> `7`: the right side after the last `=` when it is a value (no
    variables, no relation); any other expression is returned whole."""
    i = expression.rfind("=")
    if i <= 0 or expression[i - 1] in "<>!":
        return expression.strip()
    rhs = expression[i + 1 :].strip()
    if not rhs or any(c.isalpha() for c in _COMMAND_RE.sub("", rhs)):
        return expression.strip()
    return rhs


def last_expression(text: str) -> str | None:
    """The last math expression of a response: the last math span, or the last number if
    that ends later; of `a + b = 7`, the value `7`. None if there is neither.

    Bounded work: a few `rfind`/`count` scans of `text` and a regex over 65 characters.
    """
    candidates = [
        _last_dollar_span(text),
        _last_bracket_span(text, "\\[", "\\]"),
        _last_bracket_span(text, "\\(", "\\)"),
        _last_number(text),
    ]
    found = [c for c in candidates if c is not None and c[1].strip()]
    if not found:
        return None
    return _unbox(_value_side(max(found)[1]), None)


def whole_span(text: str) -> str | None:
    """The content of `text` if one math span (`$...$`, `\\(...\\)`, ...) encloses all of it."""
    for opener, close in _MATH_DELIMITERS:
        if len(text) > len(opener) + len(close) and text.startswith(opener):
            if not text.endswith(close):
                return None
            inner = text[len(opener) : -len(close)]
            if opener in ("$", "$$") and inner.count("$") != inner.count("\\$"):
                return None
            if opener not in ("$", "$$") and opener in inner:
                return None
            return inner.strip()
    return None


def extract_reference(reference: str | Sequence[str]) -> str:
    """The final answer of a reference, read the way a response's is (without the fallback).

    A reference that is a worked solution gives its last box, `Answer:` line or `The answer
    is ...` statement, or what follows GSM8K's `####` marker when that comes last; a
    reference wrapped whole in one math span gives its content. Any other reference (a bare
    answer: `1, 2, 3`, `x = 5`) is returned unchanged.

    A list (or tuple) of strings is a reference of several final answers (OlympiadBench's
    `final_answer`): each element is read as above and the answers are joined with `, `
    into one bare list, which `verify` compares as an unordered set (`["$2$", "$-3$"]` ->
    `2, -3`; a one-element list is its element's answer).
    """
    if not isinstance(reference, str):
        return ", ".join(extract_reference(r) for r in reference)
    text = reference.strip()
    text = whole_span(text) or text
    mark = text.rfind(_GSM_MARK)
    box = _last_box_start(text)
    if mark >= 0 and (box is None or mark > box[0]):
        stop = text.find("\n", mark)
        line = text[mark + len(_GSM_MARK) : len(text) if stop < 0 else stop].strip()
        if line:
            return line
    answer = extract_answer(text)
    return text if answer is None else answer
