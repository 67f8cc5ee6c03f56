"""Graceful stop on SIGTERM / SIGINT (spot-TPU and SLURM preemption send SIGTERM).

The first signal only sets a flag: the trainer finishes the step in progress, saves a
checkpoint and raises `Preempted`, which `python -m da3po_jax.main` turns into exit status
0 (SIGTERM: the scheduler asked, the run stopped cleanly and resumes exactly) or 130
(SIGINT, the shell's convention for Ctrl-C). A stage that keeps nothing (the SFT warm
start is not checkpointed) raises `Preempted(..., saved=False)`: exit status 143 (128 +
SIGTERM, what a supervisor sees of a job killed by the signal) or 130, and its line says
that nothing was saved. A second signal stops at once.

`run_reporting_errors` is the command line's last word: the exit status for how a run
stopped, and one last stderr line that names the reason.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import traceback
from collections.abc import Iterator

log = logging.getLogger(__name__)

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
    """The run stopped on a signal, after saving what it had when `saved` (see `exit_code`:
    0 only for a SIGTERM after which the same command resumes from what was saved)."""

    def __init__(self, signum: int, detail: str, saved: bool = True):
        self.signum, self.saved = signum, saved
        if signum == signal.SIGINT:
            self.exit_code = 130
        else:
            self.exit_code = 0 if saved else 128 + int(signum)
        super().__init__(f"stopped on {signal.Signals(signum).name}: {detail}")


class StopRequest:
    """Records the first SIGTERM / SIGINT; `requested` is polled between steps."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def check(self, detail: str, saved: bool = True) -> None:
        """Raises `Preempted(detail, saved)` if a signal arrived."""
        if self.signum is not None:
            raise Preempted(self.signum, detail, saved)

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:  # the second signal: stop now
            self.uninstall()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            signal.raise_signal(signum)
            return
        self.signum = signum
        log.warning(
            "%s received: finishing the current step, then saving and stopping "
            "(send it again to stop at once)",
            signal.Signals(signum).name,
        )

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for sig in _SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    stop = StopRequest()
    stop.install()
    try:
        yield stop
    finally:
        stop.uninstall()


def run_reporting_errors(fn) -> int | None:
    """Runs `fn()`; None when it returns, else the exit status for how it stopped, with
    the reason as the last line on stderr."""
    try:
        fn()
    except Preempted as e:
        log.warning("%s; rerun the same command to %s", e, "resume" if e.saved else "start again")
        print(f"da3po_jax: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("da3po_jax: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - every error ends the same way
        traceback.print_exc()
        print(f"da3po_jax: error: {describe_error(e)}", file=sys.stderr)
        return 1
    return None


def describe_error(e: BaseException) -> str:
    """One line naming the error; an OSError behind it (e.g. `No space left on device`)
    is added when the error raised is another one."""
    text = " ".join(f"{type(e).__name__}: {e}".split())
    cause, seen = e.__cause__ or e.__context__, {id(e)}
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and not isinstance(e, OSError):
            text += f" (caused by {type(cause).__name__}: {' '.join(str(cause).split())})"
            break
        cause = cause.__cause__ or cause.__context__
    return text
