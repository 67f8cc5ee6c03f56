"""`load_problems`: problems from a file, a folder or glob of files, or `tfds:<name>`,
dispatched by extension to the JSONL / Parquet readers (`readers.py`) or the optional
TFDS reader (`tfds_source.py`)."""

from __future__ import annotations

import dataclasses
import glob
import os

from da3po_jax.data.readers import (
    FieldSpec,
    ReadReport,
    ReadResult,
    jsonl_rows,
    parquet_rows,
    read_jsonl,
    read_parquet,
)
from da3po_jax.data.tfds_source import read_tfds


def load_problems(
    source: str | os.PathLike,
    fields: FieldSpec | None = None,
    *,
    split: str = "train",
    max_reported: int = 5,
) -> ReadResult:
    """Reads problems from a path, a glob of paths, or `tfds:<name>`, by extension.

    `.jsonl`/`.json` files are JSONL, `.parquet` files Parquet. Several files (a glob, or a
    folder of them) are read in sorted order and concatenated; ids keep their file name.

    Args:
      source: file, folder, glob pattern, or `"tfds:<name>"`.
      fields: field names and answer mode.
      split: TFDS split (ignored for files).
      max_reported: how many malformed rows to log individually, per file.

    Raises:
      FileNotFoundError: nothing matches `source`.
      ValueError: an unsupported file extension.
      EmptyDatasetError: no usable row (in any one file).
    """
    source = os.fspath(source)
    if source.startswith("tfds:"):
        return read_tfds(source[5:], split, fields, max_reported=max_reported)
    paths = _expand(source)
    results = [_read_file(p, fields, max_reported) for p in paths]
    if len(results) == 1:
        return results[0]
    problems, seen = [], set()
    for r in results:
        for p in r.problems:
            if p.id in seen:  # an `id` field repeated in two files
                p = dataclasses.replace(p, id=f"{p.id}#{p.source}")
            seen.add(p.id)
            problems.append(p)
    merged = ReadReport(source=source, num_kept=len(problems))
    for r in results:
        merged.num_rows += r.report.num_rows
        merged.num_duplicates += r.report.num_duplicates
        merged.skipped.update(r.report.skipped)
        merged.first_errors.extend(r.report.first_errors[: max_reported - len(merged.first_errors)])
    return ReadResult(problems, merged)


_READERS = {".jsonl": read_jsonl, ".json": read_jsonl, ".parquet": read_parquet}


def first_row(source: str | os.PathLike) -> dict:
    """The first row (as stored) of the first file of `source` (a path, folder or glob),
    or {} when that row is not a JSON object or the file has none.

    Raises:
      FileNotFoundError: nothing matches `source`.
      ValueError: an unsupported extension, or a file that cannot be read.
    """
    path = _expand(os.fspath(source))[0]
    ext = os.path.splitext(path)[1]
    if ext not in _READERS:
        raise ValueError(f"{path}: unsupported extension {ext!r} (use one of {list(_READERS)})")
    rows = parquet_rows(path, 1) if ext == ".parquet" else jsonl_rows(path)
    row = next((r for _, _, r in rows), None)
    return row if isinstance(row, dict) else {}


def _expand(source: str) -> list[str]:
    if os.path.isdir(source):
        paths = sorted(
            os.path.join(source, n)
            for n in os.listdir(source)
            if os.path.splitext(n)[1] in _READERS
        )
    elif any(c in source for c in "*?["):
        paths = sorted(glob.glob(source))
    else:
        paths = [source] if os.path.exists(source) else []
    if not paths:
        raise FileNotFoundError(f"no dataset files match {source!r}")
    return paths


def _read_file(path: str, fields: FieldSpec | None, max_reported: int) -> ReadResult:
    ext = os.path.splitext(path)[1]
    if ext not in _READERS:
        raise ValueError(f"{path}: unsupported extension {ext!r} (use one of {list(_READERS)})")
    return _READERS[ext](path, fields, max_reported=max_reported)
