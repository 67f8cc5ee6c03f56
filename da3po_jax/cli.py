"""What the command-line entry points share: logging set up from absl's `--verbosity`,
written so that it does not break progress bars.

`--verbosity` (absl's flag, also `-v`): 0 (default) shows the library's INFO lines
(model loading, compilation, evaluations, checkpoints); -1 warnings only, -2 errors only;
1 adds DEBUG lines and the INFO lines of the libraries underneath (jax, orbax), which are
otherwise kept to warnings.
"""

from __future__ import annotations

import logging

from absl import flags
from absl import logging as absl_logging

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class BarSafeHandler(logging.StreamHandler):
    """A stream handler that prints through `tqdm.write`: a log line appears above an
    active progress bar instead of inside it, and the bar is redrawn below."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - logging must not raise (as StreamHandler)
            self.handleError(record)


def verbosity() -> int:
    """absl's `--verbosity` (0 when flags are not parsed)."""
    try:
        return int(flags.FLAGS.verbosity)
    except (flags.UnparsedFlagAccessError, AttributeError):
        return 0


def level_for(v: int) -> int:
    """The `logging` level of absl verbosity `v` (0 INFO, >= 1 DEBUG, -1 WARNING, ...)."""
    return {-2: logging.ERROR, -1: logging.WARNING, 0: logging.INFO}.get(
        max(v, -3), logging.DEBUG if v > 0 else logging.CRITICAL
    )


def setup_logging(v: int | None = None) -> logging.Logger:
    """The `da3po_jax` logger printing to stderr at `--verbosity` through
    `BarSafeHandler` (added once, however often this is called); the logger itself passes
    INFO on, so a run's log file keeps INFO lines whatever the console shows. Libraries
    (absl's own handler) at WARNING unless `--verbosity` >= 1.

    `v` defaults to the flag's value; absl's `set_verbosity` writes the flag, so a
    command reads it once and passes it on if it sets logging up again."""
    v = verbosity() if v is None else v
    absl_logging.set_verbosity(v if v >= 1 else min(v, absl_logging.WARNING))
    ours = logging.getLogger("da3po_jax")
    handler = next((h for h in ours.handlers if isinstance(h, BarSafeHandler)), None)
    if handler is None:
        handler = BarSafeHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        ours.addHandler(handler)
    handler.setLevel(level_for(v))
    ours.setLevel(min(logging.INFO, level_for(v)))
    ours.propagate = False
    return ours
