"""Readers for the usual math-RL dataset formats: JSONL, Parquet and (optionally) TFDS.

Every reader (and `tfds_source.read_tfds`) maps rows to `MathProblem` through one row
parser configured by `FieldSpec`:

- prompt: the first present field of `FieldSpec.prompt` (default `prompt`, `problem`,
  `question`). A string, or a chat-format list of `{role, content}` messages whose last
  user message is the prompt (DAPO-Math-17k stores `prompt` that way; its user content
  already holds the DAPO instruction, so use the `"raw"` template for it). A non-empty
  `FieldSpec.context` field (OlympiadBench's `context`) goes before it, a blank line between.
- answer: the first present field of `FieldSpec.answer` (default `answer`,
  `reward_model.ground_truth`, `solution`); dotted paths walk nested objects. A string, or
  a number: an integral float is written as an integer (AMC23's `27.0` -> `27`), any other
  finite float in its shortest repr (`0.25`); a bool, NaN or infinity is malformed. With
  `answer_mode="auto"` a value holding `\\boxed{}` yields its last box (MATH), one holding
  `####` yields the GSM8K tail, anything else is taken as is; a `solution` field without
  a box is malformed, since a worked solution is not an answer. With
  `FieldSpec.list_answers` a list is several final answers (OlympiadBench's
  `final_answer`): each element loses a math span wrapping all of it (`$2$` -> `2`) and the
  elements are joined with `, `, the bare list the verifier compares as an unordered set
  (what `rewards.extract.extract_reference` makes of such a list); otherwise, and for an
  empty list, a list is malformed.
- id: the first present field of `FieldSpec.id` (default `id`, `extra_info.index`), else
  `<file name>:<row index>`; duplicates get `#<row index>` appended so ids stay unique.
- tier: the first present field of `FieldSpec.tier`; an integer gets `FieldSpec.tier_prefix`
  (MATH-500's `level` 3 -> `Level 3`, the label the MATH training files carry as text).
- solution: the first present field of `FieldSpec.solution`; of a list of worked solutions
  (OlympiadBench) the first.

Malformed rows (bad JSON, missing/empty fields, wrong types) are skipped and counted; the
first few are logged with their row numbers (1-based lines for JSONL, 0-based rows for
Parquet/TFDS) and a summary follows. A file with no usable row is an `EmptyDatasetError`.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import os
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from da3po_jax.data.records import MathProblem, extract_gsm8k_answer, extract_last_boxed
from da3po_jax.rewards.extract import whole_span

logger = logging.getLogger(__name__)

ANSWER_MODES = ("auto", "raw", "boxed", "gsm8k")
_MISSING = object()


class EmptyDatasetError(ValueError):
    """A source produced no usable record (empty, or every row malformed)."""


class MalformedRow(ValueError):
    """A row that cannot become a `MathProblem`.

    Attributes:
      reason: short category used to count skipped rows (`"bad JSON"`, `"missing prompt"`,
        `"empty answer"`, `"wrong type"`, ...).
      detail: specifics for the log line (field path, parser message).
    """

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """Which fields of a row hold what; each is a tuple of candidate (dotted) paths.

    Attributes:
      prompt: candidate paths of the prompt (string or chat-message list).
      answer: candidate paths of the reference answer or worked solution.
      id: candidate paths of a stable row id (string or int).
      tier: candidate paths of a difficulty label (string or int), optional in rows.
      solution: candidate paths of a worked solution kept as SFT target, optional.
      context: candidate paths of text that must precede the prompt, optional in rows.
      answer_mode: `"auto"`, `"raw"`, `"boxed"` (last `\\boxed{}`) or `"gsm8k"` (`####`).
      list_answers: a list of strings at the answer path is several final answers, stored
        joined with `, ` (off by default: a list answer is then malformed).
      tier_prefix: put before an integer tier (`"Level "` makes 3 into `Level 3`).
      dedupe: drop rows whose (prompt, answer) repeats an earlier row (DAPO-Math-17k's
        Parquet repeats each problem many times); drops are counted, not warned about.
    """

    prompt: tuple[str, ...] = ("prompt", "problem", "question")
    answer: tuple[str, ...] = ("answer", "reward_model.ground_truth", "solution")
    id: tuple[str, ...] = ("id", "extra_info.index")
    tier: tuple[str, ...] = ("tier", "level", "difficulty")
    solution: tuple[str, ...] = ("solution",)
    context: tuple[str, ...] = ()
    answer_mode: str = "auto"
    list_answers: bool = False
    tier_prefix: str = ""
    dedupe: bool = False

    def __post_init__(self):
        for name in ("prompt", "answer", "id", "tier", "solution", "context"):
            value = getattr(self, name)
            if isinstance(value, str):  # allow FieldSpec(prompt="question")
                object.__setattr__(self, name, (value,))
        if self.answer_mode not in ANSWER_MODES:
            raise ValueError(f"answer_mode must be one of {ANSWER_MODES}, got {self.answer_mode!r}")


@dataclasses.dataclass
class ReadReport:
    """What a reader did: rows seen, kept, skipped by reason, and the first errors.

    Attributes:
      source: the file (or TFDS name) read.
      num_rows: rows seen (blank JSONL lines excluded).
      num_kept: records produced.
      num_duplicates: rows dropped by `FieldSpec.dedupe`.
      skipped: malformed-row count per reason.
      first_errors: `(row number, reason)` of the first few malformed rows.
    """

    source: str
    num_rows: int = 0
    num_kept: int = 0
    num_duplicates: int = 0
    skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    first_errors: list[tuple[int, str]] = dataclasses.field(default_factory=list)

    @property
    def num_skipped(self) -> int:
        """Number of malformed rows."""
        return sum(self.skipped.values())


class ReadResult(NamedTuple):
    """Records of a source and the report of how they were read."""

    problems: list[MathProblem]
    report: ReadReport


def get_path(row: Mapping[str, Any], path: str) -> Any:
    """Value at a dotted `path` of nested mappings, or `_MISSING`.

    A literal key containing dots (a flattened column) wins over walking the path.
    """
    if path in row:
        return row[path]
    value: Any = row
    for key in path.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return _MISSING
        value = value[key]
    return value


def _first_present(row: Mapping[str, Any], paths: Sequence[str]) -> tuple[str, Any]:
    for path in paths:
        value = get_path(row, path)
        if value is not _MISSING and value is not None:
            return path, value
    return "", _MISSING


def _type_name(value: Any) -> str:
    return type(value).__name__


def _prompt_text(value: Any, path: str) -> tuple[str, str | None]:
    """(prompt, system message or None) of a string or chat-message-list prompt value."""
    if isinstance(value, str):
        text, system = value, None
    elif isinstance(value, (list, tuple)):
        messages = [m for m in value if isinstance(m, Mapping)]
        if len(messages) != len(value):
            raise MalformedRow("wrong type", f"{path}: chat list holds a non-message item")
        users = [m.get("content") for m in messages if m.get("role") == "user"]
        if not users:
            raise MalformedRow("missing prompt", f"{path}: chat list has no user message")
        text = users[-1]
        if not isinstance(text, str):
            raise MalformedRow("wrong type", f"{path}: user content is {_type_name(text)}")
        systems = [m.get("content") for m in messages if m.get("role") == "system"]
        system = systems[0] if systems and isinstance(systems[0], str) else None
    else:
        raise MalformedRow("wrong type", f"{path} is {_type_name(value)}")
    if not text.strip():
        raise MalformedRow("empty prompt", path)
    return text.strip(), system


def _scalar_text(value: Any, path: str) -> str:
    """The stripped text of a string or number answer value (see the module docstring)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise MalformedRow("wrong type", f"{path} is {_type_name(value)}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MalformedRow("wrong type", f"{path} is {value}")
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value).strip()


def _list_text(value: Sequence[Any], path: str) -> str:
    """Several final answers as one bare list: `["$2$", "$-3$"]` -> `2, -3`."""
    if not value:
        raise MalformedRow("empty answer", f"{path} is an empty list")
    texts = [_scalar_text(v, f"{path}[{i}]") for i, v in enumerate(value)]
    spans = [whole_span(t) for t in texts]  # `$2$` -> `2`, as the verifier reads it
    parts = [t if span is None else span for t, span in zip(texts, spans)]
    if not all(parts):
        raise MalformedRow("empty answer", f"{path} holds an empty element")
    return ", ".join(parts)


def _answer_text(
    value: Any, path: str, mode: str, list_answers: bool = False
) -> tuple[str, str | None]:
    """(canonical answer, the worked text it was extracted from or None) of a value."""
    if list_answers and isinstance(value, (list, tuple)):
        return _list_text(value, path), None
    text = _scalar_text(value, path)
    if not text:
        raise MalformedRow("empty answer", path)
    is_solution = path.rsplit(".", 1)[-1] == "solution"
    if mode == "boxed" or (mode == "auto" and ("\\boxed" in text or "\\fbox" in text)):
        answer = extract_last_boxed(text)
        if answer is None:
            raise MalformedRow("no answer in solution", f"{path}: no complete \\boxed{{}}")
        return answer, text
    if mode == "gsm8k" or (mode == "auto" and "####" in text):
        answer = extract_gsm8k_answer(text)
        if answer is None:
            raise MalformedRow("no answer in solution", f"{path}: no '#### answer' line")
        return answer, text
    if mode == "auto" and is_solution:
        raise MalformedRow("no answer in solution", f"{path}: no \\boxed{{}}")
    return text, None


def _str_value(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _optional_str(row: Mapping[str, Any], paths: Sequence[str]) -> str | None:
    return _str_value(_first_present(row, paths)[1])


def _tier(row: Mapping[str, Any], fields: FieldSpec) -> str:
    _, value = _first_present(row, fields.tier)
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{fields.tier_prefix}{value}"
    return _str_value(value) or ""


def _solution(row: Mapping[str, Any], fields: FieldSpec) -> str | None:
    """The worked solution; of a list of them (OlympiadBench's `solution`), the first."""
    _, value = _first_present(row, fields.solution)
    if isinstance(value, (list, tuple)):
        value = next((v for v in value if _str_value(v)), None)
    return _str_value(value)


def _prompt_of(row: Mapping[str, Any], fields: FieldSpec) -> tuple[str, str | None, set[str]]:
    """(prompt with its context, system message or None, top-level fields read) of a row."""
    p_path, p_value = _first_present(row, fields.prompt)
    if not p_path:
        raise MalformedRow("missing prompt", f"none of {', '.join(fields.prompt)}")
    prompt, system = _prompt_text(p_value, p_path)
    c_path, context = _first_present(row, fields.context)
    if isinstance(context, str) and context.strip():
        prompt = f"{context.strip()}\n\n{prompt}"
    return prompt, system, {path.split(".")[0] for path in (p_path, c_path) if path}


def parse_row(row: Any, fields: FieldSpec, *, default_id: str, source: str) -> MathProblem:
    """Maps one row to a `MathProblem` or raises `MalformedRow` with the reason.

    The solution (SFT target) is the `FieldSpec.solution` field, else the worked text the
    answer was extracted from (GSM8K's `answer`), else None.

    Args:
      row: the decoded row (must be a mapping).
      fields: field names and answer mode.
      default_id: id to use when the row has no id field.
      source: recorded in `MathProblem.source`.
    """
    if not isinstance(row, Mapping):
        raise MalformedRow("not an object", f"row is {_type_name(row)}")
    prompt, system, used = _prompt_of(row, fields)
    a_path, a_value = _first_present(row, fields.answer)
    if not a_path:
        raise MalformedRow("missing answer", f"none of {', '.join(fields.answer)}")
    answer, worked = _answer_text(a_value, a_path, fields.answer_mode, fields.list_answers)
    meta: dict[str, Any] = {"system": system} if system else {}
    used.add(a_path.split(".")[0])
    extra = {
        k: v
        for k, v in row.items()
        if k not in used
        and isinstance(k, str)
        and isinstance(v, (str, int, float, bool))
        and len(str(v)) <= 100
    }
    if extra:  # short scalar fields (subject, level, source, ...): eval.group_by can use them
        meta["fields"] = extra
    return MathProblem(
        id=_optional_str(row, fields.id) or default_id,
        prompt=prompt,
        answer=answer,
        tier=_tier(row, fields),
        solution=_solution(row, fields) or worked,
        source=source,
        meta=meta,
    )


def collect_rows(
    rows: Iterable[tuple[int, int, Any]],
    fields: FieldSpec,
    source: str,
    max_reported: int,
    *,
    name: str | None = None,
) -> ReadResult:
    """Parses `(row number, row index, row or MalformedRow)` triples into a `ReadResult`.

    Args:
      rows: the source's rows; row numbers are what warnings show, row indices make the
        default ids `<name>:<row index>`.
      fields: field names and answer mode.
      source: the file or dataset named in logs, reports and errors.
      max_reported: how many malformed rows to log individually.
      name: id prefix and `MathProblem.source` (default: the file name of `source`).

    Raises:
      EmptyDatasetError: no usable row.
    """
    report = ReadReport(source=source)
    problems: list[MathProblem] = []
    seen_ids: set[str] = set()
    seen_pairs: set[tuple[str, str]] = set()
    name = name or os.path.basename(source) or source
    for number, index, row in rows:
        report.num_rows += 1
        try:
            if isinstance(row, MalformedRow):
                raise row
            problem = parse_row(row, fields, default_id=f"{name}:{index}", source=name)
        except MalformedRow as e:
            _note_malformed(report, number, e, max_reported)
            continue
        if fields.dedupe:
            pair = (problem.prompt, problem.answer)
            if pair in seen_pairs:
                report.num_duplicates += 1
                continue
            seen_pairs.add(pair)
        if problem.id in seen_ids:
            problem = dataclasses.replace(problem, id=f"{problem.id}#{index}")
        seen_ids.add(problem.id)
        problems.append(problem)
    report.num_kept = len(problems)
    _finish(report)
    return ReadResult(problems, report)


def _note_malformed(
    report: ReadReport, number: int, error: MalformedRow, max_reported: int
) -> None:
    report.skipped[error.reason] += 1
    if len(report.first_errors) < max_reported:
        report.first_errors.append((number, str(error)))
        logger.warning("%s: skipping malformed row %d: %s", report.source, number, error)


def _finish(report: ReadReport) -> None:
    if report.num_duplicates:
        logger.info("%s: dropped %d duplicate rows", report.source, report.num_duplicates)
    if report.num_skipped:
        logger.warning(
            "%s: skipped %d of %d rows as malformed (%s)",
            report.source,
            report.num_skipped,
            report.num_rows,
            ", ".join(f"{k}: {v}" for k, v in report.skipped.most_common()),
        )
    if not report.num_kept:
        raise EmptyDatasetError(
            f"{report.source}: no usable rows ({report.num_rows} rows read, "
            f"{report.num_skipped} malformed, {report.num_duplicates} duplicates)"
        )


def _starts_with_bracket(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(4096).lstrip()
    return head.startswith(b"[")


def _json_array_rows(path: str) -> Iterator[tuple[int, int, Any]]:
    """(0-based element index twice, row) of a file holding one JSON array of rows."""
    with open(path, "rb") as f:
        try:
            rows = json.loads(f.read().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: not a valid JSON array of rows: {e}") from e
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected a JSON array of rows")
    yield from ((i, i, row) for i, row in enumerate(rows))


def jsonl_rows(path: str) -> Iterator[tuple[int, int, Any]]:
    """(1-based line number, 0-based line index, row or MalformedRow) of non-blank lines."""
    if _starts_with_bracket(path):
        yield from _json_array_rows(path)
        return
    with open(path, "rb") as f:
        for index, raw in enumerate(f):
            if not raw.strip():
                continue
            try:
                row: Any = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                row = MalformedRow("bad encoding", "not UTF-8")
            except json.JSONDecodeError as e:
                row = MalformedRow("bad JSON", f"{e.msg} at column {e.colno}")
            yield index + 1, index, row


def read_jsonl(
    path: str | os.PathLike, fields: FieldSpec | None = None, *, max_reported: int = 5
) -> ReadResult:
    """Reads a JSONL file of problems (one JSON object per line; blank lines ignored).

    A file whose content starts with `[` is read as one JSON array of rows instead (row
    numbers are then 0-based element indices); a broken array is a `ValueError`, since
    there is no row to skip.

    Args:
      path: the file.
      fields: field names and answer mode (defaults cover DAPO/GSM8K/MATH/AIME layouts).
      max_reported: how many malformed rows to log individually.

    Raises:
      FileNotFoundError: no such file.
      EmptyDatasetError: no usable row.
    """
    path = os.fspath(path)
    check_regular_file(path)
    return collect_rows(jsonl_rows(path), fields or FieldSpec(), path, max_reported)


def check_regular_file(path: str) -> None:
    """A dataset file must exist and be a regular file (a FIFO or a device would block the
    read or stream forever; a folder is `load_problems`' to expand).

    Raises:
      FileNotFoundError: no such path.
      ValueError: the path is not a regular file (its kind named).
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"dataset file {path!r} does not exist")
    if not os.path.isfile(path):
        mode = os.stat(path).st_mode
        kind = next(
            (name for test, name in _KINDS if test(mode)),
            "not a regular file",
        )
        raise ValueError(f"dataset file {path!r} is {kind}, not a regular file")


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _import_pyarrow_parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError("reading Parquet needs the 'pyarrow' package: pip install pyarrow") from e
    return pq


def parquet_rows(path: str, batch_size: int) -> Iterator[tuple[int, int, Any]]:
    """(0-based row index twice, row) of a Parquet file.

    Raises:
      ValueError: naming `path` when it is not a readable, complete Parquet file (bad
        magic bytes, a truncated footer or data page), instead of pyarrow's bare error.
    """
    pq = _import_pyarrow_parquet()
    import pyarrow as pa

    index = 0
    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=batch_size)
        for batch in batches:
            rows = batch.to_pylist()
            for row in rows:
                yield index, index, row
                index += 1
    except (pa.ArrowException, OSError) as e:
        where = f" (after {index} rows)" if index else ""
        detail = " ".join(str(e).split()).rstrip(".:")  # pyarrow messages span lines
        raise ValueError(
            f"{path}: not a valid or complete Parquet file{where} ({type(e).__name__}: "
            f"{detail}); the file looks truncated or corrupt"
        ) from e


def read_parquet(
    path: str | os.PathLike,
    fields: FieldSpec | None = None,
    *,
    max_reported: int = 5,
    batch_size: int = 4096,
) -> ReadResult:
    """Reads a Parquet file of problems (e.g. DAPO-Math-17k), streaming record batches.

    Nested columns (a `prompt` list of `{role, content}` structs, a `reward_model` struct)
    arrive as Python lists/dicts, so dotted answer paths work as for JSONL.

    Args:
      path: the file.
      fields: field names and answer mode.
      max_reported: how many malformed rows to log individually.
      batch_size: rows decoded at a time (bounds memory on large files).

    Raises:
      ImportError: `pyarrow` is not installed.
      FileNotFoundError: no such file.
      EmptyDatasetError: no usable row.
    """
    path = os.fspath(path)
    _import_pyarrow_parquet()  # fail on the missing package before touching the file
    check_regular_file(path)
    return collect_rows(parquet_rows(path, batch_size), fields or FieldSpec(), path, max_reported)
