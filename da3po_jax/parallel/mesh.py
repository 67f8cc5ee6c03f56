"""The device mesh and batch placement.

Axes (in this order): `data` (pure data parallelism: parameters replicated), `fsdp`
(data parallelism with parameters and optimizer state sharded) and `tensor` (attention
heads and MLP hidden units split). Batches are split over (`data`, `fsdp`) together.
Axis types are `Auto`: shardings are given at the boundaries of jitted functions (inputs,
outputs, parameters) and XLA propagates them through the model.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


def resolve_mesh_shape(shape: Sequence[int], num_devices: int) -> tuple[int, int, int]:
    """`config.mesh.shape` with its (at most one) -1 filled so the product is `num_devices`.

    Raises:
      ValueError: naming `mesh.shape` when it has the wrong length, several -1, a
        non-positive entry, or does not multiply out to the device count.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) != len(AXES):
        raise ValueError(f"mesh.shape={shape} must have 3 entries {AXES}")
    if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
        raise ValueError(f"mesh.shape={shape}: entries must be positive, with at most one -1")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if num_devices % known:
            raise ValueError(
                f"mesh.shape={shape}: {num_devices} devices are not divisible by {known}"
            )
        shape = tuple(num_devices // known if s == -1 else s for s in shape)
    if math.prod(shape) != num_devices:
        raise ValueError(
            f"mesh.shape={shape} has {math.prod(shape)} devices but {num_devices} are "
            "available; use -1 for the axis that should take the rest"
        )
    return shape  # type: ignore[return-value]


def make_mesh(shape: Sequence[int] = (-1, 1, 1), devices: Sequence | None = None) -> Mesh:
    """A (`data`, `fsdp`, `tensor`) mesh over `devices` (default: all, every process).

    `jax.make_mesh` orders devices for the hardware topology (ICI rings on TPU) and keeps
    each process's devices contiguous along the leading axes, so host-local batches map
    onto their own devices.
    """
    devices = list(devices) if devices is not None else jax.devices()
    resolved = resolve_mesh_shape(shape, len(devices))
    auto = (jax.sharding.AxisType.Auto,) * len(AXES)
    if devices == jax.devices() or devices[0].platform == "tpu":  # TPU: ICI-aware order
        return jax.make_mesh(resolved, AXES, axis_types=auto, devices=devices)
    return Mesh(np.asarray(devices).reshape(resolved), AXES, axis_types=auto)


@contextlib.contextmanager
def kernel_mesh(mesh: Mesh | None) -> Iterator[None]:
    """On accelerators, traces see `mesh` as the ambient (abstract) mesh: the Pallas
    kernels (splash attention, ragged decode) run per shard under `shard_map`, which XLA
    cannot do for them, and the model pins its activations' rows to the batch axes
    (`models.sharding`); on the CPU, or on one device, nothing changes."""
    if mesh is None or mesh.size == 1 or mesh.devices.flat[0].platform == "cpu":
        yield
        return
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        yield


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_size_divisor(mesh: Mesh) -> int:
    """Devices a batch is split over (the product of the batch axes)."""
    return math.prod(mesh.shape[a] for a in BATCH_AXES)


def batch_sharding(mesh: Mesh, shape: Sequence[int]) -> NamedSharding:
    """Leading axis over (`data`, `fsdp`) when it divides evenly, else replicated."""
    if len(shape) and shape[0] % batch_size_divisor(mesh) == 0:
        return NamedSharding(mesh, PartitionSpec(BATCH_AXES))
    return replicated(mesh)


def shard_batch(tree, mesh: Mesh):
    """Places every array of `tree` (full, global values, the same on every process) with
    its leading axis split over the batch axes; see `global_batch` for hosts that each
    hold only their rows."""

    def put(x):
        sharding = batch_sharding(mesh, np.shape(x))
        if jax.process_count() == 1:
            return jax.device_put(x, sharding)
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

    return jax.tree.map(put, tree)
