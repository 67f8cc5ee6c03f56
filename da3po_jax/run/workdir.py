"""The workdir of a training run, written only once the run is accepted (the checks that
can refuse it come first: `run/validate.py`).

`PendingLogs` holds the run's log records in memory until `accept`, which creates the
workdir, moves the tiny tokenizer in, writes config.json (atomically) and starts the log
file with the records so far: nothing is written into a workdir whose run is then refused.
"""

from __future__ import annotations

import contextlib
import json
import logging
import logging.handlers
import os
from collections.abc import Iterator

import jax
import numpy as np

from da3po_jax.config import Settings
from da3po_jax.parallel import is_main_process, sum_over_hosts
from da3po_jax.run.inputs import install_tokenizer
from da3po_jax.runtime.workdir_lock import WorkdirBusy, WorkdirLock


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

    def accept(self, settings: Settings, workdir: str, staging: str) -> None:
        if self._file is not None:
            return
        os.makedirs(workdir, exist_ok=True)
        install_tokenizer(settings, workdir, staging)
        if is_main_process():
            path = os.path.join(workdir, "config.json")
            with open(path + ".tmp", "w") as f:
                json.dump(settings.to_dict(), f, indent=2, default=str)
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


@contextlib.contextmanager
def locked_workdir(workdir: str) -> Iterator[None]:
    """Holds the workdir's lock (`runtime/workdir_lock.py`) for the block: process 0 takes
    it and every process learns the verdict, so a refused multi-host run stops on every
    host at once.

    Raises:
      WorkdirBusy: another run holds the workdir (nothing was written).
    """
    lock, failed = WorkdirLock(workdir), None
    if is_main_process():
        try:
            lock.acquire()
        except Exception as e:  # noqa: BLE001 - every host must hear of it, then it is raised
            failed = e
    refused = int(sum_over_hosts(np.array([failed is not None], np.int32))[0])
    if failed is not None:
        raise failed
    if refused:
        raise WorkdirBusy(f"process 0 could not lock --workdir {workdir!r} (see its log)")
    try:
        yield
    finally:
        lock.release()


def sft_dir(settings: Settings, workdir: str) -> str:
    """Where the SFT warm start is cached: `sft.out_dir`, else `<workdir>/sft_model`."""
    return settings.sft.out_dir or os.path.join(workdir, "sft_model")
