"""Checkpoint export: `python -m da3po_jax.export --workdir=W [--step=N] --out=DIR`.

Turns a checkpoint of a training run (the newest, or step `--step`) into a Hugging Face
folder (config.json, safetensors, the run's tokenizer files) that `transformers` loads with
the same logits, as the end of a run writes `final_model`: the run's own config.json gives
the architecture and tokenizer, only the policy's parameters are read from the checkpoint
(not the optimizer state), and `run.saved_run.export_policy` writes the folder.

Nothing is changed but `--out`: a damaged step is reported (not moved aside, as a resumed
run would), and an existing non-empty `--out` is replaced only with `--overwrite`.

Exit status: 0 once the folder is written (its path is printed); 1 on an error, whose
traceback is followed by one last line `da3po_jax: error: ...` naming the problem.
"""

from __future__ import annotations

import logging
import os
import sys

from absl import app, flags

from da3po_jax.cli import setup_logging

_WORKDIR = flags.DEFINE_string(
    "workdir", None, "A training run's folder: its config.json and checkpoints/."
)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step to export (default: the newest).")
_OUT = flags.DEFINE_string("out", None, "Folder to write the Hugging Face model into.")
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Replace --out when it exists and is not empty (else refused)."
)
flags.mark_flags_as_required(["workdir", "out"])

log = logging.getLogger("da3po_jax.export")


def export_checkpoint(
    workdir: str, out: str, step: int | None = None, overwrite: bool = False
) -> tuple[int, str]:
    """Writes the policy of checkpoint `step` (None: the newest) of the run in `workdir`
    as a Hugging Face folder `out` and returns (step, out).

    Every refusal (no run, no checkpoint, no such step, `out` in the way) comes before
    anything is written.

    Raises:
      SavedRunError: a refusal, named.
      CheckpointError: the step's files are damaged (its digest check failed).
    """
    from da3po_jax.run.inputs import tokenizer_dir
    from da3po_jax.run.saved_run import (
        check_out,
        export_policy,
        flag_path,
        read_run_config,
        restore_policy,
    )

    workdir, out = flag_path("workdir", workdir), flag_path("out", out)
    settings = read_run_config(workdir)
    check_out(out, workdir, overwrite)
    step, model = restore_policy(settings, workdir, step)
    export_policy(model, out, tokenizer_dir(settings, workdir), overwrite=overwrite)
    return step, out


def main(argv: list[str]) -> None:
    """The command: logs as `da3po_jax.main` does, prints the written folder, and ends
    with exit status 1 and a last stderr line naming the problem on any error."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    setup_logging()
    from da3po_jax.runtime.signals import run_reporting_errors  # after flags: fast --help

    def run() -> None:
        step, out = export_checkpoint(
            _WORKDIR.value, _OUT.value, _STEP.value, overwrite=_OVERWRITE.value
        )
        print(f"exported step {step} of {os.path.abspath(_WORKDIR.value)} to {out}")

    code = run_reporting_errors(run)
    if code is not None:
        sys.stdout.flush()
        sys.exit(code)


if __name__ == "__main__":
    app.run(main)
