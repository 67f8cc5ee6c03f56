"""Checkpoint export: `python -m da3po_jax.export --workdir=W [--step=N] --out=DIR`.

Turns a checkpoint of a training run (the newest, or step `--step`) into a Hugging Face
folder (config.json, safetensors, the run's tokenizer files) that `transformers` loads with
the same logits, as the end of a run writes `final_model`: the run's own config.json gives
the architecture and tokenizer, only the policy's parameters are read from the checkpoint
(not the optimizer state), and `train.run.export_policy` writes the folder.

Nothing is changed but `--out`: a damaged step is reported (not moved aside, as a resumed
run would), and an existing non-empty `--out` is replaced only with `--overwrite`.

Exit status: 0 once the folder is written (its path is printed); 1 on an error, whose
traceback is followed by one last line `da3po_jax: error: ...` naming the problem.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from absl import app, flags
from absl import logging as absl_logging

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


class ExportError(ValueError):
    """The export cannot run as asked; nothing was written."""


def read_run_config(workdir: str):
    """The config a run wrote to `<workdir>/config.json` (what `train` resolved), so the
    export builds the same architecture and finds the same tokenizer as the run did."""
    from ml_collections import config_dict

    if not os.path.isdir(workdir):
        raise ExportError(f"--workdir {workdir!r} does not exist or is not a folder")
    path = os.path.join(workdir, "config.json")
    if not os.path.isfile(path):
        raise ExportError(f"{path!r} not found: --workdir must be a training run's folder")
    try:
        with open(path) as f:
            return config_dict.FrozenConfigDict(json.load(f))
    except json.JSONDecodeError as e:
        raise ExportError(f"{path!r} is not valid JSON ({e})") from e


def check_out(out: str, workdir: str, overwrite: bool) -> None:
    """Refuses an `--out` the export must not replace: a non-empty folder without
    `overwrite`, a file, or the run's own folder (or one holding it)."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ExportError(f"--out {out!r} exists and is not a folder (nothing was changed)")
    if workdir == out or workdir.startswith(out.rstrip(os.sep) + os.sep):
        raise ExportError(f"--out {out!r} holds the run being exported (nothing was changed)")
    if os.path.isdir(out) and os.listdir(out) and not overwrite:
        raise ExportError(
            f"--out {out!r} exists and is not empty; pass --overwrite to replace it "
            "(nothing was changed)"
        )


def pick_step(steps: list[int], step: int | None, directory: str) -> int:
    """`step` if the run kept it, else the newest when `step` is None."""
    if not steps:
        raise ExportError(f"no checkpoints in {directory!r}: the run saved none yet")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise ExportError(
            f"--step={step} is not in {directory!r}; the steps kept are "
            f"{', '.join(map(str, steps))}"
        )
    return step


def restore_policy(cfg, workdir: str, step: int | None):
    """(step, policy) of checkpoint `step` (None: the newest) of the run in `workdir`.

    The abstract policy (shapes only, built by `setup.policy_config` as the run built its
    policy) is restored as the `["train"].params` subtree alone, sharded over every local
    device by the run's parameter rules, so the optimizer state is never allocated.
    """
    import jax
    from flax import nnx

    from da3po_jax.models import Transformer
    from da3po_jax.models.tokenizer import Tokenizer
    from da3po_jax.parallel import make_mesh, tree_shardings
    from da3po_jax.train.checkpoint import Checkpointer
    from da3po_jax.train.setup import policy_config, tokenizer_dir

    directory = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(directory):  # checked first: Checkpointer would create it
        raise ExportError(f"no checkpoints in {workdir!r} (no checkpoints/ folder)")
    model_cfg = policy_config(cfg, Tokenizer.load(tokenizer_dir(cfg, workdir)))
    checkpointer = Checkpointer(workdir, cfg.train.keep_checkpoints)
    try:
        step = pick_step(checkpointer.all_steps(), step, directory)
        log.info("restoring the policy of step %d from %s", step, directory)
        graphdef, abstract = nnx.split(
            nnx.eval_shape(lambda: Transformer(model_cfg, rngs=nnx.Rngs(0)))
        )
        shardings = tree_shardings(abstract, make_mesh((1, -1, 1)))  # FSDP over all
        abstract = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings
        )
        keys = (jax.tree_util.DictKey("train"), jax.tree_util.GetAttrKey("params"))
        params, _ = checkpointer.restore_subtree(step, keys, abstract)
    finally:
        checkpointer.close()
    return step, nnx.merge(graphdef, params)


def export_checkpoint(
    workdir: str, out: str, step: int | None = None, overwrite: bool = False
) -> tuple[int, str]:
    """Writes the policy of checkpoint `step` (None: the newest) of the run in `workdir`
    as a Hugging Face folder `out` and returns (step, out).

    Every refusal (no run, no checkpoint, no such step, `out` in the way) comes before
    anything is written.

    Raises:
      ExportError: a refusal, named.
      CheckpointError: the step's files are damaged (its digest check failed).
    """
    workdir, out = os.path.abspath(workdir), os.path.abspath(out)
    cfg = read_run_config(workdir)
    check_out(out, workdir, overwrite)
    from da3po_jax.train.run import export_policy
    from da3po_jax.train.setup import tokenizer_dir

    step, model = restore_policy(cfg, workdir, step)
    export_policy(model, out, tokenizer_dir(cfg, workdir), overwrite=overwrite)
    return step, out


def main(argv: list[str]) -> None:
    """The command: logs as `da3po_jax.main` does, prints the written folder, and ends
    with exit status 1 and a last stderr line naming the problem on any error."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    absl_logging.set_verbosity(absl_logging.WARNING)  # library chatter (orbax, jax)
    ours = logging.getLogger("da3po_jax")
    if not ours.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        ours.addHandler(handler)
        ours.propagate = False
    ours.setLevel(logging.INFO)
    from da3po_jax.train.signals import run_reporting_errors  # after flags: fast --help

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
