"""Command-line entry point: `python -m da3po_jax.main --config=configs/tiny_math.py`.

Flags: `--config` (an ml_collections config file, locked: dotted overrides such as
`--config.algo=dapo` or `--config.rollout.group_size=16` must name existing fields) and
`--workdir` (checkpoints, metrics, plots; rerunning with the same workdir resumes).
Multi-process runs start every process with the same flags plus, on GPU clusters,
`--coordinator_address`, `--num_processes` and `--process_id` (TPU VMs detect these);
`--heartbeat_timeout_s` bounds how long the others run on after one of them dies.

`--verbosity` (absl's): 0 shows progress bars and INFO lines; -1 warnings only; 1 adds
DEBUG lines and the libraries' own INFO lines (`da3po_jax/cli.py`). `--helpfull` lists
every flag.

Exit status: 0 when the run finished, or stopped on SIGTERM after saving a checkpoint
(rerun the same command to resume); 130 on SIGINT (after saving likewise); 1 on an error,
whose traceback is followed by one last line `da3po_jax: error: ...` naming the problem.
The process ends right after that line, whatever threads a library left running.
"""

from __future__ import annotations

import logging
import os
import re
import sys

from absl import app, flags
from ml_collections import config_flags

from da3po_jax.cli import setup_logging

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Path to a config file: the repo's configs/ folder holds them (tiny_math.py, the CPU "
    "demo; qwen_math.py and the sized recipes such as qwen_dapo_7b_8xh100.py); every field "
    "and its default is listed in docs/settings.md. Override any field on the command line with "
    "--config.<field>=value, e.g. --config.algo=dapo --config.rollout.group_size=16 "
    "--config.mesh.shape='(1,-1,1)'; a field that does not exist is an error.",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string(
    "workdir",
    "/tmp/da3po_run",
    "Directory for checkpoints, metrics and plots; an existing run there is resumed.",
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address",
    "",
    "host:port of process 0 for multi-process runs on GPU clusters (TPU VMs detect it).",
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 0, "Processes in a multi-process run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", -1, "This process's index, 0-based.")
_HEARTBEAT = flags.DEFINE_integer(
    "heartbeat_timeout_s",
    100,
    "Multi-process runs: seconds without a process's heartbeat after which the others stop "
    "with an error naming it (a lost host never leaves the rest hanging).",
)
flags.mark_flags_as_required(["config"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    setup_logging()
    from da3po_jax.parallel import initialize  # after flag parsing: keeps --help fast
    from da3po_jax.run import train
    from da3po_jax.runtime.signals import run_reporting_errors

    def run() -> None:
        initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value, _HEARTBEAT.value)
        train(_CONFIG.value, _WORKDIR.value)

    code = run_reporting_errors(run)
    if code is not None:
        _exit(code)


def _exit(code: int) -> None:
    """Flushes logs and streams, then ends the process at once: a library thread still
    running (e.g. a checkpoint writer after a failed save) must not keep it alive."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, except that a config file that cannot be loaded and an override
    of a config field that does not exist (which ml_collections reports as a bare
    `AttributeError` / `KeyError`) end with one line naming the file or the field."""
    files = [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    if files and not os.path.isfile(files[-1].split(":", 1)[0]):
        print(f"da3po_jax: error: --config={files[-1]}: no such config file", file=sys.stderr)
        sys.exit(1)
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        print(f"FATAL Flags parsing error: {e} (see --helpshort)", file=sys.stderr)
        sys.exit(1)
    except (AttributeError, KeyError) as e:
        print(f"da3po_jax: error: {config_error(argv, e)}", file=sys.stderr)
        sys.exit(1)


def config_error(argv: list[str], e: BaseException) -> str:
    """What went wrong loading `--config` and its overrides: the one override naming a
    missing field (with ml_collections' closest match), else the config file itself."""
    text = str(e.args[0]) if e.args else str(e)
    words = re.findall(r"[\w-]+", text.split("Did you mean")[0])
    overrides = [a.split("=", 1)[0].removeprefix("--") for a in argv if a.startswith("--config.")]
    for key in words:
        for override in overrides:
            parts = override.split(".")
            if key in parts[1:]:
                parent = ".".join(parts[: parts.index(key, 1)])
                close = re.search(r'Did you mean "([^"]+)"', text)
                hint = f" (did you mean {close.group(1)!r}?)" if close else ""
                return f"--{override}: {parent} has no field {key!r}{hint}"
    files = [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    where = f"--config={files[-1]}" if files else "--config"
    if "get_config" in text:
        return f"{where} defines no get_config() (a config file returns its ConfigDict from it)"
    return f"{where} could not be loaded: {type(e).__name__}: {' '.join(text.split())}"


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
