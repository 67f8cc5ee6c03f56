"""`metrics.jsonl`, read and cut back: a resumed run drops the rows of the steps it
writes again, and a torn last line (a kill mid-write) is dropped, not an error."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

log = logging.getLogger(__name__)


class MetricsFileError(ValueError):
    """metrics.jsonl has a malformed row that is not the torn last line of a kill."""


def read_metrics(path: str) -> list[dict[str, Any]]:
    """The rows of `path`. A torn final line (a process killed while writing it) is
    dropped with a warning; a malformed row elsewhere is an error naming file and line."""
    if not os.path.isfile(path):
        return []
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    rows = []
    for j, (lineno, line) in enumerate(numbered):
        try:
            row = json.loads(line.decode("utf-8"))  # UnicodeDecodeError is a ValueError
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                raise ValueError("not a metrics row (an object with an integer 'step')")
        except ValueError as e:
            if j == len(numbered) - 1:  # the row being written when the run was killed
                log.warning("%s: dropping a torn last line %d (%r)", path, lineno, line[:80])
                break
            raise MetricsFileError(
                f"{path}: line {lineno} is not a metrics row ({e}); fix or remove that line"
            ) from e
        rows.append(row)
    return rows


def truncate_metrics(path: str, last_step: int) -> None:
    """Keeps the rows of steps up to `last_step` (a resumed run rewrites the later ones;
    -1 keeps none) and drops a torn last line."""
    if not os.path.exists(path):
        return
    rows = [r for r in read_metrics(path) if r["step"] <= last_step]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(tmp, path)
