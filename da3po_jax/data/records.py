"""The record every data source yields, and the small answer extractors readers need.

`MathProblem` is deliberately source-agnostic: the synthetic generator, the JSONL/Parquet
readers and TFDS all map to it, so the trainer, the dynamic-sampling buffer (which keys
groups by `id`) and evaluation (which groups accuracy by `tier`) never see a source format.

The extractors here only turn a *reference* field into a canonical answer string (the last
`\\boxed{...}` of a MATH solution, the `#### 72` tail of a GSM8K solution). Judging model
output is the verifier's job (`da3po_jax/rewards/`), which data/ deliberately does not
import, so this module keeps its own tiny balanced-brace scanner.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

_BOX_COMMANDS = ("\\boxed", "\\fbox")


@dataclasses.dataclass(frozen=True)
class MathProblem:
    """One prompt with a verifiable reference answer.

    Attributes:
      id: stable, unique string (synthetic: the expression; files: an `id` field or
        `<file name>:<row index>`). Used as the group key in RL and for resuming.
      prompt: the question text only; instruction templates are applied later
        (`da3po_jax.data.prompts.format_prompt`).
      answer: canonical reference answer string (e.g. `"42"`, `"\\frac{1}{2}"`).
      tier: difficulty label (`"easy"`, `"medium"`, `"hard"` for the synthetic task, the
        dataset's level for files that carry one, else `""`).
      solution: worked solution used as a supervised target, when known.
      source: where the record came from (`"synthetic"`, a file name, `"tfds:gsm8k"`).
      meta: extra structured fields (the synthetic task stores `kind` and `operands`).
    """

    id: str
    prompt: str
    answer: str
    tier: str = ""
    solution: str | None = None
    source: str = ""
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON view of the record (tuples become lists)."""
        return dataclasses.asdict(self)


def write_jsonl(problems: Iterable[MathProblem], path: str | os.PathLike) -> int:
    """Writes problems as JSONL (one `MathProblem.to_dict()` per line); returns the count.

    The output reads back with `read_jsonl` and the default field names, which makes it
    the simplest way to freeze a synthetic split or hand it to another tool.
    """
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for p in problems:
            f.write(json.dumps(p.to_dict(), ensure_ascii=False) + "\n")
            count += 1
    return count


def _skip_spaces(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _braced_end(text: str, start: int) -> int | None:
    """Index just past the `}` closing the `{` at `start`, or None if unbalanced.

    A backslash escapes the next character, so `\\{` and `\\}` are literal braces that do not
    count towards the balance (`\\boxed{\\{1, 2\\}}` holds `\\{1, 2\\}`).
    """
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _boxed_at(text: str, i: int) -> tuple[str | None, int]:
    """Parses the argument of a box command whose name ends at `i`.

    Returns:
      (content or None when malformed, index to continue scanning from).
    """
    j = _skip_spaces(text, i)
    if j < len(text) and text[j] == "{":
        end = _braced_end(text, j)
        if end is None:
            return None, len(text)
        return text[j + 1 : end - 1], end
    if j == i:  # `\boxedx`: a different command name, not a box
        return None, i
    k = j  # `\boxed 5`: the argument runs to the next space or `$`
    while k < len(text) and not text[k].isspace() and text[k] != "$":
        k += 1
    return (text[j:k] if k > j else None), k


def _next_box(text: str, i: int, cache: dict[str, int]) -> tuple[int, str]:
    """Position and name of the first box command at or after `i` (-1 if none).

    Each command's next position is cached and only searched again once passed, so a scan
    over many commands stays linear.
    """
    best, best_cmd = -1, ""
    for cmd in _BOX_COMMANDS:
        pos = cache.get(cmd, i)
        if 0 <= pos < i or cmd not in cache:
            pos = cache[cmd] = text.find(cmd, i)
        if pos >= 0 and (best < 0 or pos < best):
            best, best_cmd = pos, cmd
    return best, best_cmd


def extract_last_boxed(text: str) -> str | None:
    """Content of the last top-level `\\boxed{...}` (or `\\fbox{...}`) in `text`.

    Scans left to right once (linear time even on adversarial input); a box nested inside
    another box is part of the outer one's content. Also accepts the `\\boxed 5` form found
    in a few MATH solutions.

    Returns:
      The stripped content, or None when there is no box, the last box is empty, or a box
      is never closed (a reference answer is better skipped than guessed).
    """
    last: str | None = None
    cache: dict[str, int] = {}
    i = 0
    while True:
        pos, cmd = _next_box(text, i, cache)
        if pos < 0:
            break
        content, i = _boxed_at(text, pos + len(cmd))
        if content is None and i >= len(text):  # unterminated brace
            return None
        if content is not None:
            last = content
    if last is None or not last.strip():
        return None
    return last.strip()


def extract_gsm8k_answer(text: str) -> str | None:
    """The final answer of a GSM8K solution, `... #### 1,234` -> `"1234"`.

    Thousands separators are dropped because GSM8K uses them inconsistently; any further
    normalisation is the verifier's.
    """
    if "####" not in text:
        return None
    tail = text.rsplit("####", 1)[1].strip().replace(",", "")
    return tail or None
