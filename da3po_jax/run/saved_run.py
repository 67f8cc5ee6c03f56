"""A training run's folder as the commands see it, without resuming the run: its
settings (config.json), the policy's parameters of one checkpoint (no optimizer state),
the checks an output folder must pass, and the policy written as a Hugging Face folder
(`export_policy`, also the end of a run's `final_model`). Shared by
`python -m da3po_jax.export` and `python -m da3po_jax.eval`; this module defines no
command-line flags, so both can import it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import jax
from flax import nnx

from da3po_jax.config import Settings, resolve_settings, with_added_fields
from da3po_jax.models import abstract_model, save_model
from da3po_jax.models.tokenizer import Tokenizer
from da3po_jax.parallel import is_main_process, make_mesh, to_host, tree_shardings
from da3po_jax.run.inputs import policy_config, tokenizer_dir
from da3po_jax.run.loop import NonFiniteTraining
from da3po_jax.runtime.checkpoint import Checkpointer, tree_digest
from da3po_jax.runtime.workdir_lock import LOCK_NAME

log = logging.getLogger(__name__)


class SavedRunError(ValueError):
    """A run's folder cannot be read, or an output written, as a command asked (export,
    eval); nothing was written."""


def flag_path(flag: str, value: str | None) -> str:
    """`value` as an absolute path; an empty one (`--workdir=`) is refused rather than
    taken as the current folder."""
    if not value or not str(value).strip():
        raise SavedRunError(f"--{flag} is empty: name a folder")
    return os.path.abspath(value)


def read_run_config(workdir: str) -> Settings:
    """The settings a run wrote to `<workdir>/config.json` (what `train` resolved), so the
    export builds the same architecture and finds the same tokenizer as the run did."""
    if not os.path.isdir(workdir):
        raise SavedRunError(f"--workdir {workdir!r} does not exist or is not a folder")
    path = os.path.join(workdir, "config.json")
    if not os.path.isfile(path):
        raise SavedRunError(f"{path!r} not found: --workdir must be a training run's folder")
    try:
        with open(path) as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        raise SavedRunError(f"{path!r} is not valid JSON ({e})") from e
    try:
        return resolve_settings(with_added_fields(raw))
    except (ValueError, TypeError) as e:
        raise SavedRunError(f"{path!r}: {e}") from e


def check_out(out: str, workdir: str, overwrite: bool, own: str = "") -> None:
    """Refuses an `--out` the command must not write: a non-empty folder without
    `overwrite`, a file, the folder being read (or one holding it), or a path inside any
    training run's folder, which only the run itself writes (except `own`, the command's
    own output folder there, e.g. eval's `WORKDIR/eval`)."""
    out = os.path.realpath(out)
    if os.path.exists(out) and not os.path.isdir(out):
        raise SavedRunError(f"--out {out!r} exists and is not a folder (nothing was changed)")
    workdir = os.path.realpath(workdir)
    if _inside(workdir, out):
        raise SavedRunError(f"--out {out!r} holds the run being read (nothing was changed)")
    run = enclosing_run(out)
    if run is not None and not (own and _inside(out, os.path.realpath(own))):
        raise SavedRunError(
            f"--out {out!r} is inside the training run {run!r}, whose files only the run "
            "writes: choose a folder outside it (nothing was changed)"
        )
    if os.path.isdir(out) and os.listdir(out) and not overwrite:
        raise SavedRunError(
            f"--out {out!r} exists and is not empty; pass --overwrite to replace it "
            "(nothing was changed)"
        )


def _inside(path: str, folder: str) -> bool:
    """`path` is `folder` or lies under it (both absolute, normalised)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def enclosing_run(path: str) -> str | None:
    """The training run's folder that is `path` or holds it (a folder with config.json
    and checkpoints/, metrics.jsonl or run.lock), else None."""
    path = os.path.realpath(path)
    while True:
        if os.path.isfile(os.path.join(path, "config.json")) and any(
            os.path.exists(os.path.join(path, n))
            for n in ("checkpoints", "metrics.jsonl", LOCK_NAME)
        ):
            return path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def pick_step(steps: list[int], step: int | None, directory: str) -> int:
    """`step` if the run kept it, else the newest when `step` is None."""
    if not steps:
        raise SavedRunError(f"no checkpoints in {directory!r}: the run saved none yet")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise SavedRunError(
            f"--step={step} is not in {directory!r}; the steps kept are "
            f"{', '.join(map(str, steps))}"
        )
    return step


def restore_policy(settings: Settings, workdir: str, step: int | None, mesh=None, dtype: str = ""):
    """(step, policy) of checkpoint `step` (None: the newest) of the run in `workdir`.

    The abstract policy (shapes only, built by `inputs.policy_config` as the run built its
    policy) is restored as the `["train"].params` subtree alone, sharded over `mesh` (by
    default every local device, FSDP) by the run's parameter rules, so the optimizer state
    is never allocated. With `dtype` (e.g. "bfloat16"), the parameters are cast and the
    policy computes in it once they are verified (digests are those of the saved values).
    """
    directory = os.path.join(workdir, "checkpoints")
    if not os.path.isdir(directory):  # checked first: Checkpointer would create it
        raise SavedRunError(f"no checkpoints in {workdir!r} (no checkpoints/ folder)")
    model_config = policy_config(settings.model, Tokenizer.load(tokenizer_dir(settings, workdir)))
    mesh = mesh if mesh is not None else make_mesh((1, -1, 1))
    checkpointer = Checkpointer(workdir, settings.train.keep_checkpoints)
    try:
        step = pick_step(checkpointer.all_steps(), step, directory)
        log.info("restoring the policy of step %d from %s", step, directory)
        graphdef, abstract = abstract_model(model_config)
        shardings = tree_shardings(abstract, mesh)
        abstract = jax.tree.map(
            lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
            abstract,
            shardings,
        )
        keys = (jax.tree_util.DictKey("train"), jax.tree_util.GetAttrKey("params"))
        params, _ = checkpointer.restore_subtree(step, keys, abstract)
    finally:
        checkpointer.close()
    if dtype:
        graphdef, target = abstract_model(
            dataclasses.replace(model_config, param_dtype=dtype, dtype=dtype)
        )
        params = jax.tree.map(lambda x, t: x.astype(t.dtype), params, target)
    return step, nnx.merge(graphdef, params)


def export_policy(model, out_dir: str, tokenizer_dir: str, *, overwrite: bool = True) -> None:
    """Writes `model` as a HF folder from process 0; with several processes every host
    takes part in gathering the sharded parameters first. The end of a run replaces its
    own export; `python -m da3po_jax.export` passes `overwrite` from its flag.

    Raises:
      NonFiniteTraining: a parameter is not finite (nothing is written).
    """
    _, nonfinite = tree_digest(nnx.state(model, nnx.Param))
    bad = [f"{k} ({n} values)" for k, n in nonfinite.items() if n]
    if bad:
        raise NonFiniteTraining(
            f"not exporting to {out_dir!r}: non-finite parameters in {', '.join(bad[:5])}"
        )
    if jax.process_count() > 1:
        graphdef, params = nnx.split(model)
        model = nnx.merge(graphdef, jax.tree.map(to_host, params))
    if is_main_process():
        save_model(model, out_dir, tokenizer_dir=tokenizer_dir, overwrite=overwrite)
