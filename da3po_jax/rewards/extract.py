"""Final-answer extraction from a model response: the last `Answer: ...` line or `\\boxed{}`.

Two conventions are recognised, and the one that appears *last* in the response wins, since
the final statement is the model's final answer:

* an `Answer: ...` line (DAPO's prompt format; case-insensitive, `**Answer:**` markdown
  allowed; if the line holds a `\\boxed{}` its content is used);
* `\\boxed{...}` or `\\fbox{...}` with balanced nested braces (the MATH convention).

If the last box is malformed (unbalanced braces) it is *not* replaced by an earlier box: an
earlier box may be an answer the model later retracted, so the response has no answer.

Every function here is a single left-to-right scan or a regex without nested quantifiers, so
the cost is linear in the response length (a 1 MB adversarial response takes milliseconds to
a few tenths of a second). With `extract_answer(text, max_chars=...)` (what the scorer uses)
the brace scan of a box also stops after `max_chars` characters, and a longer answer is none.
"""

from __future__ import annotations

import re

__all__ = [
    "MAX_BOXES",
    "extract_answer",
    "extract_answer_line",
    "extract_boxed",
    "extract_boxes",
    "find_closing_brace",
]

MAX_BOXES = 32  # a response with more boxes is not read as one answer set

_BOX_COMMANDS = ("\\boxed", "\\fbox")
# `answer` as a word followed by a colon. No nested quantifiers: linear time.
_ANSWER_RE = re.compile(r"\banswer[ \t]*:", re.IGNORECASE)
_MARKDOWN_CHARS = "*_ \t"
_BLANKS_RE = re.compile(r"[ \t]*")
_BARE_ARGUMENT_RE = re.compile(r"[^ \t\n$]*")
_ANSWER_LEAD_RE = re.compile(r"[\s*_]*")  # whitespace (as `str.isspace`) and markdown
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")


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


def _answer_line_match(text: str) -> re.Match[str] | None:
    last = None
    for m in _ANSWER_RE.finditer(text):
        last = m
    return last


def _clean_line(line: str) -> str:
    line = line.strip().strip(_MARKDOWN_CHARS).strip()
    return line


def extract_answer_line(text: str) -> str | None:
    """Returns the content of the last `Answer: ...` line (case-insensitive).

    Markdown emphasis around the answer (`**Answer:** 5`) is removed. If the content is on
    the next line (`Answer:\\n5`) that line is used. If the line holds a box, the box content
    is returned.

    Args:
      text: a model response.

    Returns:
      The stripped answer, or None if there is no non-empty `Answer:` line.
    """
    m = _answer_line_match(text)
    if m is None:
        return None
    return _answer_from_match(text, m)


def _answer_from_match(text: str, m: re.Match[str], max_chars: int | None = None) -> str | None:
    start = _ANSWER_LEAD_RE.match(text, m.end()).end()
    stop = text.find("\n", start)
    line = text[start : len(text) if stop < 0 else stop]
    box = _last_box_start(line)
    if box is not None:
        return _box_content(line, box[1], max_chars)
    line = _clean_line(line)
    return line or None


def extract_answer(text: str, max_chars: int | None = None) -> str | None:
    """Returns the model's final answer: whichever of `Answer:` line and box comes last.

    Args:
      text: a model response.
      max_chars: if given, an answer longer than this counts as no answer (None), and a
        box's braces are scanned at most this far (a box whose content is longer before
        stripping is treated as malformed), so no answer over the cap reaches any parsing.

    Returns:
      The extracted answer string (not normalised), or None if the response states no
      well-formed answer (or, with `max_chars`, only one past the cap).
    """
    if not isinstance(text, str) or not text:
        return None
    box = _last_box_start(text)
    line = _answer_line_match(text)
    if line is not None and (box is None or line.start() > box[0]):
        answer = _answer_from_match(text, line, max_chars)
    elif box is not None:  # also covers a box on the `Answer:` line itself
        answer = _box_content(text, box[1], max_chars)
    else:
        return None
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
