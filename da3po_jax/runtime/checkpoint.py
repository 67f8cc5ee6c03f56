"""Atomic, verified, resumable checkpoints with orbax.

A checkpoint holds one device pytree (`{"train": TrainState, "carry": RLCarry}`: the
policy, optimizer, step and RNG, plus the dynamic-sampling surplus, the DAA prior state
and the per-prompt history table) and one JSON document of host state (the data
iterator's position, the config fingerprint it was written with, whether an eval is still
due, and a digest of every device array). Orbax writes into a temporary folder and
renames it when complete, so a crash never leaves a half-written step; every host takes
part in the save.

Integrity: at save, each array's digest (a position-weighted uint32 sum of its bits,
computed on device, so sharding does not change it) goes into the host JSON, and a
state with a non-finite value in the `finite` subtrees is refused instead of saved. At
restore, the digests are recomputed and compared and the same finiteness is checked; a
step that fails (or that orbax cannot read) is skipped with a warning for the previous
one, and moved to `<workdir>/checkpoints.damaged/` once a good step is found. Rotation
(`keep` newest steps) is ours, not orbax's: older steps are deleted only after the newest
save has committed and its host JSON (with the digest) reads back, so a failed save never
costs the last good checkpoint.

A checkpoint that cannot be read into the current run's shapes, or was written by an
incompatible configuration, is an error that says so, and nothing in the workdir is
touched.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from da3po_jax.parallel import is_main_process, to_host

log = logging.getLogger(__name__)

_DIGEST_KEY = "digest"


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be restored into this run (or cannot be saved)."""


class DamagedCheckpoint(CheckpointError):
    """One step's files are unreadable or do not match the digest written with them."""


# ---------------------------------------------------------------------------- digests
def _leaf_digest(x: jax.Array) -> jax.Array:
    """[2] uint32: the digest of x's bits, and its number of non-finite values."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    nonfinite = jnp.zeros((), jnp.int32)
    if jnp.issubdtype(x.dtype, jnp.inexact):
        nonfinite = (~jnp.isfinite(x)).sum(dtype=jnp.int32)
    if x.dtype == jnp.bool_:
        bits = x.astype(jnp.uint32)
    else:
        width = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
        bits = jax.lax.bitcast_convert_type(x, width).astype(jnp.uint32)
    flat = bits.reshape(-1)
    weight = jnp.arange(flat.size, dtype=jnp.uint32) * jnp.uint32(0x9E3779B1) | jnp.uint32(1)
    digest = (flat * weight).sum(dtype=jnp.uint32)  # odd weights: any one change shows
    return jnp.stack([digest, nonfinite.astype(jnp.uint32)])


# [leaves, 2]: one small array, so a digest costs one device-to-host transfer
_digest_tree = jax.jit(lambda tree: jnp.stack([_leaf_digest(x) for x in jax.tree.leaves(tree)]))


def tree_digest(tree: Any) -> tuple[dict[str, int], dict[str, int]]:
    """({leaf path: digest}, {leaf path: non-finite count}) of a pytree of arrays."""
    keys = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    if not keys:
        return {}, {}
    pairs = to_host(_digest_tree(tree)).tolist()
    return (
        {k: d for k, (d, _) in zip(keys, pairs, strict=True)},
        {k: n for k, (_, n) in zip(keys, pairs, strict=True)},
    )


def _nonfinite_leaves(nonfinite: dict[str, int], prefixes: Sequence[str]) -> list[str]:
    return [
        f"{k} ({n} values)"
        for k, n in nonfinite.items()
        if n and any(k.startswith(p) for p in prefixes)
    ]


# ------------------------------------------------------------------------ checkpointer
class Checkpointer:
    """Saves and restores (device tree, host JSON) pairs under `<workdir>/checkpoints`.

    `finite`: leaf-path prefixes (as `jax.tree_util.keystr` writes them, e.g. "['train']")
    whose floating-point values must all be finite to save or to restore a step.
    """

    def __init__(self, workdir: str, keep: int = 2, finite: Sequence[str] = ("",)):
        workdir = os.path.abspath(workdir)
        self.directory = os.path.join(workdir, "checkpoints")
        self.damaged_dir = os.path.join(workdir, "checkpoints.damaged")
        check_directory(self.directory, "checkpoints")
        self.keep = max(keep, 1)
        self.finite = tuple(finite)
        self._pending: int | None = None
        options = ocp.CheckpointManagerOptions(max_to_keep=None, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self._errors = _LastError()  # orbax logs a failed background save, never raises it
        logging.getLogger("absl").addHandler(self._errors)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def save(self, step: int, tree: Any, host: dict[str, Any]) -> None:
        """Writes step `step` asynchronously (`wait` or the next save finishes it).

        Raises:
          CheckpointError: `tree` has non-finite values in a `finite` subtree (nothing
            is written; the earlier checkpoints stay), or the previous save failed.
        """
        digest, nonfinite = tree_digest(tree)
        bad = _nonfinite_leaves(nonfinite, self.finite)
        if bad:
            raise CheckpointError(
                f"not saving step {step}: the state has non-finite values in "
                f"{', '.join(bad[:5])}; the checkpoints in {self.directory!r} are kept"
            )
        self.wait()
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(tree),
                host=ocp.args.JsonSave({**host, _DIGEST_KEY: digest}),
            ),
        )
        self._pending = step

    def wait(self) -> None:
        """Finishes the pending save, checks that it committed, then rotates."""
        self._manager.wait_until_finished()
        if self._pending is None:
            return
        step, self._pending = self._pending, None
        steps = self.all_steps()
        if step not in steps:
            cause = self._errors.message or "see the log above"
            raise CheckpointError(
                f"saving checkpoint step {step} in {self.directory!r} failed ({cause}); "
                "the earlier checkpoints are kept"
            )
        try:
            self._read_host(step)
        except DamagedCheckpoint as e:
            raise CheckpointError(f"checkpoint step {step} did not read back: {e}") from e
        for old in steps[: -self.keep]:  # rotation: only once the newest step is verified
            self._manager.delete(old)

    def _read_host(self, step: int) -> dict[str, Any]:
        try:
            out = self._manager.restore(step, args=ocp.args.Composite(host=ocp.args.JsonRestore()))
            host = dict(out["host"])
        except Exception as e:  # orbax raises many types; all mean "unreadable"
            raise DamagedCheckpoint(
                f"cannot read the host state of {self._path(step)!r} ({_brief(e)})"
            ) from e
        if not isinstance(host.get(_DIGEST_KEY), dict):
            log.warning("checkpoint %s has no digest (an older format): not verified", step)
        return host

    def newest_host(self) -> tuple[int, dict[str, Any]] | None:
        """(step, host JSON) of the newest step whose host JSON reads; None if none does."""
        for step in reversed(self.all_steps()):
            try:
                return step, self._read_host(step)
            except DamagedCheckpoint as e:
                log.warning("%s", e)
        return None

    def restore(
        self, step: int, abstract_tree: Any, host: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Restores and verifies step `step` into the structure, shapes and shardings of
        `abstract_tree` (`host`: its host JSON, when already read).

        Raises:
          DamagedCheckpoint: unreadable, digest mismatch, or non-finite where `finite`.
        """
        host = dict(self._read_host(step) if host is None else host)
        tree = self._restore_state(step, ocp.args.StandardRestore(_target(abstract_tree)))
        self._verify(step, tree, host)
        host.pop(_DIGEST_KEY, None)
        return tree, host

    def restore_subtree(
        self, step: int, path: Sequence[Any], abstract_subtree: Any
    ) -> tuple[Any, dict[str, Any]]:
        """Restores and verifies only the subtree at `path` of step `step`, e.g. the
        policy's parameters without the optimizer state and carry, which are neither
        read nor allocated (orbax's partial restore).

        `path` is the JAX key path of the subtree in the saved tree (`DictKey("train"),
        GetAttrKey("params")` for `{"train": TrainState}`): its form names the saved
        leaves whose digests and finiteness are checked, exactly as `restore` checks all.

        Raises:
          DamagedCheckpoint: unreadable, digest mismatch, or non-finite where `finite`.
        """
        host = dict(self._read_host(step))
        target = _target(abstract_subtree)
        names = [getattr(k, "key", getattr(k, "name", getattr(k, "idx", None))) for k in path]
        for name in reversed(names):
            target = {name: target}
        args = ocp.args.PyTreeRestore(
            target,
            restore_args=ocp.checkpoint_utils.construct_restore_args(target),
            partial_restore=True,
        )
        tree = self._restore_state(step, args)
        for name in names:
            tree = tree[name]
        self._verify(step, tree, host, prefix=jax.tree_util.keystr(tuple(path)))
        host.pop(_DIGEST_KEY, None)
        return tree, host

    def _restore_state(self, step: int, args: ocp.args.CheckpointArgs) -> Any:
        try:
            out = self._manager.restore(step, args=ocp.args.Composite(state=args))
        except Exception as e:  # orbax raises many types; all mean "not this run's"
            raise DamagedCheckpoint(
                f"cannot restore {self._path(step)!r} into this run ({_brief(e)})"
            ) from e
        return out["state"]

    def _verify(self, step: int, tree: Any, host: dict[str, Any], prefix: str = "") -> None:
        """Checks `tree`, the saved tree's part at key path `prefix`, against the digests
        written with it (those of its leaves only) and the finiteness rule."""
        digest, nonfinite = tree_digest(tree)
        digest = {prefix + k: d for k, d in digest.items()}
        nonfinite = {prefix + k: n for k, n in nonfinite.items()}
        saved = host.get(_DIGEST_KEY)
        if isinstance(saved, dict):
            saved = {k: d for k, d in saved.items() if _under(k, prefix)}
            wrong = sorted(k for k in digest.keys() | saved.keys() if digest.get(k) != saved.get(k))
            if wrong:
                raise DamagedCheckpoint(
                    f"{self._path(step)!r} is corrupt: {len(wrong)} arrays differ from the "
                    f"digest written with them ({', '.join(wrong[:3])})"
                )
        bad = _nonfinite_leaves(nonfinite, self.finite)
        if bad:
            raise DamagedCheckpoint(
                f"{self._path(step)!r} holds non-finite values in {', '.join(bad[:3])}"
            )

    def restore_latest(
        self, abstract_tree: Any, check_host: Callable[[dict[str, Any]], None] | None = None
    ) -> tuple[int, Any, dict[str, Any]] | None:
        """The newest step that restores and verifies, as (step, tree, host); None when
        there is no checkpoint. Damaged newer steps are moved to `checkpoints.damaged/`
        (with a warning) once an older good one is found.

        `check_host(host)` may refuse a step (e.g. an incompatible configuration): its
        error propagates and nothing is moved. `abstract_tree` may be a function of the
        step's host JSON (a tree whose parts depend on what was saved).

        Raises:
          CheckpointError: checkpoints exist but none restores (nothing is moved).
        """
        steps = self.all_steps()
        damaged: list[tuple[int, DamagedCheckpoint]] = []
        for step in reversed(steps):
            try:
                host = self._read_host(step)
                if check_host is not None:
                    check_host(host)
                like = abstract_tree(host) if callable(abstract_tree) else abstract_tree
                tree, host = self.restore(step, like, host)
            except DamagedCheckpoint as e:
                log.warning("checkpoint step %d is damaged, trying the one before: %s", step, e)
                damaged.append((step, e))
                continue
            for bad, _ in damaged:
                self._quarantine(bad)
            return step, tree, host
        if damaged:
            details = "; ".join(f"step {s}: {e}" for s, e in damaged)
            raise CheckpointError(
                f"no checkpoint in {self.directory!r} restores ({details}). Nothing was "
                "changed; move the checkpoints folder away to start fresh."
            )
        return None

    def _quarantine(self, step: int) -> None:
        if is_main_process():
            os.makedirs(self.damaged_dir, exist_ok=True)
            dest, n = os.path.join(self.damaged_dir, str(step)), 1
            while os.path.exists(dest):
                dest, n = os.path.join(self.damaged_dir, f"{step}.{n}"), n + 1
            shutil.move(self._path(step), dest)
            log.warning("moved damaged checkpoint step %d to %s", step, dest)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"quarantine checkpoint {step}")
        self._manager.reload()

    def _path(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._manager.close()
            logging.getLogger("absl").removeHandler(self._errors)


class _LastError(logging.Handler):
    """Keeps the last exception logged at ERROR by orbax's background save threads."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.message = ""

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.message = _brief(record.exc_info[1], limit=500)


def _target(abstract_tree: Any) -> Any:
    """`abstract_tree` as `ShapeDtypeStruct`s keeping each leaf's sharding (if any)."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
        abstract_tree,
    )


def _under(key: str, prefix: str) -> bool:
    """Whether the leaf key `key` (a `keystr`) lies under the key path `prefix`."""
    return not prefix or (key.startswith(prefix) and key[len(prefix) : len(prefix) + 1] in "[.")


def _brief(e: BaseException, limit: int = 300) -> str:
    """An exception as one line (orbax / TensorStore messages span many), its middle cut
    when long: the cause (e.g. `No space left on device`) is at the end."""
    text = " ".join(str(e).split())
    if len(text) > limit:
        text = f"{text[: limit // 2]} ... {text[-limit // 2 :]}"
    return f"{type(e).__name__}: {text}"


def check_directory(path: str, what: str) -> None:
    """Refuses a path the run must use as a folder when something else is there."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise CheckpointError(
            f"{what} path {path!r} exists and is not a folder; move it away (nothing was changed)"
        )


def check_compatible(saved: dict[str, Any], current: dict[str, Any], path: str) -> None:
    """Refuses to resume when a field of the fingerprint `current` (the run's
    `Settings.fingerprint()`: the fields that change shapes or semantics) differs from the
    checkpoint's `saved` one."""
    # absent from checkpoints older than the field: not compared
    newer = ("surplus_groups", "model.scan_layers")
    diffs = [k for k in current if saved.get(k) != current[k] and (k in saved or k not in newer)]
    if diffs:
        details = "; ".join(
            f"{k}: checkpoint {saved.get(k)!r} vs now {current.get(k)!r}" for k in diffs
        )
        raise CheckpointError(
            f"checkpoint in {path!r} was written by a different configuration ({details}). "
            "Nothing was changed; use another --workdir."
        )
