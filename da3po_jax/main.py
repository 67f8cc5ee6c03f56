"""Command-line entry point: `python -m da3po_jax.main --config=configs/tiny_math.py`.

Flags: `--config` (an ml_collections config file, locked: dotted overrides such as
`--config.algo=dapo` or `--config.rollout.group_size=16` must name existing fields) and
`--workdir` (checkpoints, metrics, plots; rerunning with the same workdir resumes).
Multi-process runs start every process with the same flags plus, on GPU clusters,
`--coordinator_address`, `--num_processes` and `--process_id` (TPU VMs detect these).
"""

from __future__ import annotations

import logging

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to a config file.", lock_config=True
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
flags.mark_flags_as_required(["config"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    absl_logging.set_verbosity(absl_logging.WARNING)  # library chatter (orbax, jax)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    ours = logging.getLogger("da3po_jax")
    ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    ours.propagate = False
    from da3po_jax.parallel import initialize  # after flag parsing: keeps --help fast
    from da3po_jax.train import train

    initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)

    train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
    app.run(main)
