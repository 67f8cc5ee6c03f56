"""Atomic, resumable checkpoints with orbax.

A checkpoint holds one device pytree (train state, the dynamic-sampling surplus carried to
the next step, the DAA prior state and per-prompt history table) and one JSON document of
host state (data iterator position, the config fingerprint it was written with). Orbax
writes into a temporary folder and renames it when complete, so a crash never leaves a
half-written step; every host takes part in the save. A checkpoint that cannot be read
into the current run's shapes is an error that says so, and nothing in the workdir is
touched.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be restored into this run."""


class Checkpointer:
    """Saves and restores (device tree, host JSON) pairs under `<workdir>/checkpoints`."""

    def __init__(self, workdir: str, keep: int = 2):
        self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
        options = ocp.CheckpointManagerOptions(max_to_keep=max(keep, 1), create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, tree: Any, host: dict[str, Any]) -> None:
        """Writes step `step` (asynchronously; `wait` or the next save finishes it)."""
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(tree), host=ocp.args.JsonSave(host)
            ),
        )

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def restore_host(self, step: int) -> dict[str, Any]:
        """Only the host JSON of step `step` (cheap; read first to check compatibility)."""
        try:
            out = self._manager.restore(step, args=ocp.args.Composite(host=ocp.args.JsonRestore()))
        except Exception as e:
            raise CheckpointError(
                f"cannot read checkpoint {os.path.join(self.directory, str(step))!r} "
                f"({type(e).__name__}: {str(e)[:300]}). Nothing was changed; use another "
                "--workdir, or move the checkpoints folder away to start fresh."
            ) from e
        return dict(out["host"])

    def restore(self, step: int, abstract_tree: Any) -> tuple[Any, dict[str, Any]]:
        """Restores step `step` into the structure, shapes and shardings of `abstract_tree`.

        Raises:
          CheckpointError: unreadable, or written by a run with other shapes/fields.
        """
        target = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
            abstract_tree,
        )
        path = os.path.join(self.directory, str(step))
        try:
            out = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(target), host=ocp.args.JsonRestore()
                ),
            )
        except Exception as e:  # orbax raises many types; all mean "not this run's"
            raise CheckpointError(
                f"cannot restore checkpoint {path!r} into this run ({type(e).__name__}: "
                f"{str(e)[:500]}). Nothing was changed; use another --workdir, or move the "
                "checkpoints folder away to start fresh."
            ) from e
        return out["state"], dict(out["host"])

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def check_compatible(saved: dict[str, Any], current: dict[str, Any], path: str) -> None:
    """Refuses to resume when fields that change shapes or semantics differ."""
    keys = (
        "algo",
        "model",
        "rollout.group_size",
        "rl.train_prompts",
        "rollout.max_new_tokens",
        "teacher",
    )
    diffs = [k for k in keys if saved.get(k) != current.get(k)]
    if diffs:
        details = "; ".join(
            f"{k}: checkpoint {saved.get(k)!r} vs now {current.get(k)!r}" for k in diffs
        )
        raise CheckpointError(
            f"checkpoint in {path!r} was written by a different configuration ({details}). "
            "Nothing was changed; use another --workdir."
        )
