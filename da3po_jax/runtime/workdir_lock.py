"""One run per workdir: an exclusive lock, `<workdir>/run.lock`, held for the whole run.

Two runs writing the same workdir interleave their metrics rows and overwrite each
other's checkpoints, so the second is refused, naming the holder (host, pid, start time).
The lock is an advisory `flock` on the file, which the kernel releases when the holding
process ends however it ends (kill -9 included); the file also records the holder. A run
that finds the file still naming a holder it could lock anyway knows that holder ended
without releasing it (killed), takes the lock over and says so in the log. A finished run
empties the file (it is never deleted, so two runs can never lock two different files).

`flock` spans hosts on local disks and NFSv4; on a filesystem without it (some FUSE
mounts) the lock holds only between processes of one host.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import logging
import os
import socket

log = logging.getLogger(__name__)

LOCK_NAME = "run.lock"


class WorkdirBusy(RuntimeError):
    """Another live process holds the workdir's lock; nothing was written."""


class WorkdirLock:
    """The exclusive lock of one workdir (`acquire` / `release`, or a `with` block)."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.path = os.path.join(workdir, LOCK_NAME)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Takes the lock (creating the workdir and the file when absent).

        Raises:
          WorkdirBusy: a live process holds it; the message names its host and pid.
        """
        os.makedirs(self.workdir, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read_holder(fd)
            os.close(fd)
            if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            raise WorkdirBusy(
                f"--workdir {self.workdir!r} is in use by another run ({_describe(holder)}; "
                f"lock file {self.path!r}): wait for it to end or use another --workdir"
            ) from None
        previous = _read_holder(fd)
        if previous:
            log.warning(
                "took over the lock of %s: its holder (%s) ended without releasing it (killed?)",
                self.workdir,
                _describe(previous),
            )
        me = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        """Empties the file (a clean end) and unlocks it."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
            os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> WorkdirLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> dict:
    """The holder recorded in the lock file ({} when empty or unreadable)."""
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", errors="replace").strip()
        holder = json.loads(text) if text else {}
    except (OSError, ValueError):
        return {"host": "?", "pid": "?"}
    return holder if isinstance(holder, dict) else {"host": "?", "pid": "?"}


def _describe(holder: dict) -> str:
    if not holder:
        return "holder unknown"
    text = f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}"
    return text + (f", since {holder['since']}" if "since" in holder else "")
