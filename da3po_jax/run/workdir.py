"""The workdir of a training run: refused before anything is written when the run cannot
use it, and written only once the run is accepted.

`PendingLogs` holds the run's log records in memory until `accept`, which creates the
workdir, moves the tiny tokenizer in, writes config.json (atomically) and starts the log
file with the records so far: nothing is written into a workdir whose run is then refused.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os

import jax

from da3po_jax.config import Settings
from da3po_jax.parallel import is_main_process
from da3po_jax.run.inputs import install_tokenizer
from da3po_jax.runtime.checkpoint import Checkpointer, check_compatible, check_directory
from da3po_jax.runtime.metrics_file import read_metrics


class PendingLogs(logging.handlers.MemoryHandler):
    """The run's log records, held in memory until the run is accepted (see the module
    docstring); `close` detaches the handlers at the end of the run."""

    def __init__(self):
        super().__init__(capacity=1 << 20, flushLevel=logging.CRITICAL + 1)
        self._file: logging.Handler | None = None
        ours = logging.getLogger("da3po_jax")
        if ours.level == logging.NOTSET or ours.level > logging.INFO:
            ours.setLevel(logging.INFO)  # the log file keeps INFO lines
        ours.addHandler(self)

    def shouldFlush(self, record) -> bool:
        return self.target is not None and super().shouldFlush(record)

    def accept(self, s: Settings, workdir: str, staging: str) -> None:
        if self._file is not None:
            return
        os.makedirs(workdir, exist_ok=True)
        install_tokenizer(s, workdir, staging)
        if is_main_process():
            path = os.path.join(workdir, "config.json")
            with open(path + ".tmp", "w") as f:
                json.dump(s.to_dict(), f, indent=2, default=str)
            os.replace(path + ".tmp", path)
        pid = jax.process_index()
        self._file = logging.FileHandler(
            os.path.join(workdir, f"log.{pid}.txt" if pid else "log.txt")
        )
        self._file.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        )
        ours = logging.getLogger("da3po_jax")
        self.setTarget(self._file)
        self.flush()
        ours.removeHandler(self)
        ours.addHandler(self._file)

    def close(self) -> None:
        ours = logging.getLogger("da3po_jax")
        ours.removeHandler(self)
        self.buffer.clear()
        if self._file is not None:
            ours.removeHandler(self._file)
            self._file.close()
        super().close()


def check_workdir(s: Settings, workdir: str) -> None:
    """Refuses a workdir the run cannot use, before anything is written: a file where a
    folder must be, or checkpoints written by an incompatible configuration."""
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise NotADirectoryError(f"--workdir {workdir!r} exists and is not a folder")
    check_directory(os.path.join(workdir, "checkpoints"), "checkpoints")
    for name in ("metrics.jsonl", "config.json", "summary.json"):
        if os.path.isdir(os.path.join(workdir, name)):
            raise IsADirectoryError(f"{os.path.join(workdir, name)!r} is a folder, not a file")
    if s.stage == "sft" or not os.path.isdir(os.path.join(workdir, "checkpoints")):
        return
    checkpointer = Checkpointer(workdir, s.train.keep_checkpoints)
    try:
        newest = checkpointer.newest_host()
    finally:
        checkpointer.close()
    if newest is not None:
        check_compatible(newest[1].get("config", {}), s.fingerprint(), checkpointer.directory)
    read_metrics(os.path.join(workdir, "metrics.jsonl"))  # a malformed row is named now


def check_teacher_files(s: Settings) -> None:
    """A teacher folder that exists must hold a model (one to be built may be absent)."""
    t = s.teacher
    if not s.distillation or not t.path or not os.path.exists(t.path):
        return
    if not os.path.isfile(os.path.join(t.path, "config.json")) and not t.sft_steps:
        raise FileNotFoundError(
            f"teacher folder {t.path!r} has no config.json (config.teacher.path)"
        )


def sft_dir(s: Settings, workdir: str) -> str:
    """Where the SFT warm start is cached: `sft.out_dir`, else `<workdir>/sft_model`."""
    return s.sft.out_dir or os.path.join(workdir, "sft_model")
