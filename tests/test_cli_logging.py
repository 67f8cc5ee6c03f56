"""The entry points' logging (`da3po_jax/cli.py`): `--verbosity` sets what the console
shows, the run's log file keeps INFO lines, and log lines print above a progress bar
instead of inside it."""

from __future__ import annotations

import io
import logging

import pytest
from absl import flags
from absl import logging as absl_logging
from absl.testing import flagsaver
from tqdm import tqdm

from da3po_jax.cli import BarSafeHandler, level_for, setup_logging


@pytest.fixture(autouse=True)
def restore_logging():
    ours = logging.getLogger("da3po_jax")
    state = (list(ours.handlers), ours.propagate, ours.level, absl_logging.get_verbosity())
    flags.FLAGS.mark_as_parsed()
    yield
    ours.handlers[:], ours.propagate, ours.level = state[0], state[1], state[2]
    absl_logging.set_verbosity(state[3])


@pytest.mark.parametrize(
    "verbosity, console, absl_level",
    [
        (0, logging.INFO, -1),
        (-1, logging.WARNING, -1),
        (-2, logging.ERROR, -2),
        (1, logging.DEBUG, 1),
    ],
)
def test_verbosity_sets_the_console_level(verbosity, console, absl_level):
    with flagsaver.flagsaver(verbosity=verbosity):
        ours = setup_logging()  # the flag's value
    setup_logging(verbosity)  # a second call adds no second handler
    handlers = [h for h in ours.handlers if isinstance(h, BarSafeHandler)]
    assert len(handlers) == 1 and handlers[0].level == console
    assert ours.level == min(logging.INFO, console)  # INFO still reaches a log file
    assert absl_logging.get_verbosity() == absl_level


def test_level_for_absl_verbosities():
    assert [level_for(v) for v in (-3, -2, -1, 0, 1, 2)] == [
        logging.CRITICAL,
        logging.ERROR,
        logging.WARNING,
        logging.INFO,
        logging.DEBUG,
        logging.DEBUG,
    ]


def test_a_log_line_prints_above_an_active_bar():
    stream = io.StringIO()
    handler = BarSafeHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("da3po_jax.test_cli_logging")
    log.addHandler(handler)
    log.propagate = False
    try:
        with tqdm(total=4, file=stream, desc="steps", ascii=True) as bar:
            bar.update(1)
            log.warning("checkpoint saved")
            bar.update(1)
    finally:
        log.removeHandler(handler)
    pieces = stream.getvalue().replace("\r", "\n").split("\n")
    assert "WARNING checkpoint saved" in pieces  # a line of its own, not inside a bar line
    assert any(p.startswith("steps:  50%") for p in pieces)  # the bar went on below it
