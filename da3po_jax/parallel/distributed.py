"""Multi-host runs: `jax.distributed` start-up and moving batches between host-local
NumPy rows and global (mesh-sharded) arrays.

Every process runs the same program on the same global batch description (the prompt
iterator is deterministic and identical on all hosts). A batch of n rows is split over
the mesh's batch axes; `host_rows` is the block of rows whose shards live on this
process's devices. A host tokenises, decodes and scores only its rows; `global_batch`
assembles the hosts' rows into one global array and `to_host` brings a (small) global
array back to every host, e.g. rewards for logging.
"""

from __future__ import annotations

import json
import logging
import os

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from da3po_jax.parallel.mesh import batch_sharding

log = logging.getLogger(__name__)


def initialize(
    coordinator_address: str = "",
    num_processes: int = 0,
    process_id: int = -1,
    heartbeat_timeout_s: int = 100,
):
    """Starts JAX's multi-controller runtime when the run spans several processes.

    With explicit arguments (GPU clusters, local CPU tests) they are passed to
    `jax.distributed.initialize`; on a multi-host TPU slice (`TPU_WORKER_HOSTNAMES`
    lists more than one worker, or `MEGASCALE_*` is set) JAX detects everything itself.
    A single-host run needs nothing and calls nothing. Must run before any other JAX call.

    A process that dies (a kill -9, a lost host) stops sending heartbeats: after
    `heartbeat_timeout_s` seconds the coordination service ends every other process with
    an error naming the lost task ("Task I heartbeat timeout"), so no host waits forever
    in a collective; rerunning the command resumes from the last checkpoint.
    """
    if heartbeat_timeout_s < 1:
        raise ValueError(f"heartbeat_timeout_s={heartbeat_timeout_s}: must be >= 1 second")
    explicit = bool(coordinator_address) or num_processes > 1
    hosts = [h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    if not explicit and len(hosts) <= 1 and "MEGASCALE_COORDINATOR_ADDRESS" not in os.environ:
        return
    if explicit:
        if not coordinator_address or num_processes < 1 or process_id < 0:
            raise ValueError(
                "multi-process runs need all of --coordinator_address (host:port), "
                f"--num_processes and --process_id; got {coordinator_address!r}, "
                f"{num_processes}, {process_id}"
            )
        # collectives between CPU devices of different processes (only the CPU backend
        # reads this; GPU and TPU use NCCL / ICI)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address,
            num_processes,
            process_id,
            heartbeat_timeout_seconds=heartbeat_timeout_s,
        )
    else:
        jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat_timeout_s)
    log.info(
        "process %d of %d: %d local / %d global devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )


def is_main_process() -> bool:
    """Process 0 writes logs, plots and exports."""
    return jax.process_index() == 0


def host_rows(mesh: Mesh | None, n: int) -> slice:
    """The rows of an n-row batch that this process feeds (all of them with one process,
    or when the batch is replicated because n does not divide over the batch axes)."""
    if mesh is None or jax.process_count() == 1:
        return slice(0, n)
    sharding = batch_sharding(mesh, (n,))
    starts = sorted(
        {
            (idx[0].start or 0, idx[0].stop or n)
            for idx in sharding.addressable_devices_indices_map((n,)).values()
        }
    )
    lo, hi = starts[0][0], starts[-1][1]
    covered = sum(b - a for a, b in starts)
    if covered != hi - lo:
        raise ValueError(
            f"this process's devices hold non-contiguous rows of the batch ({starts}); "
            "build the mesh with parallel.make_mesh so each host's devices are contiguous"
        )
    return slice(lo, hi)


def global_batch(local, mesh: Mesh | None, n: int):
    """Global arrays [n, ...] sharded over the batch axes from this host's rows
    (`local` leaves hold rows `host_rows(mesh, n)`); without a mesh, plain device arrays."""

    def one(x):
        if mesh is None:
            return jax.numpy.asarray(x)
        x = np.asarray(x)
        shape = (n, *x.shape[1:])
        sharding = batch_sharding(mesh, shape)
        if jax.process_count() == 1:
            return jax.device_put(x, sharding)
        return jax.make_array_from_process_local_data(sharding, x, shape)

    return jax.tree.map(one, local)


def local_rows(x: jax.Array, mesh: Mesh | None) -> np.ndarray:
    """This host's rows (`host_rows`) of a global array, as NumPy, without gathering
    other hosts' rows."""
    if mesh is None or jax.process_count() == 1 or x.is_fully_addressable:
        return np.asarray(x)[host_rows(mesh, x.shape[0])]
    n = x.shape[0]
    target = batch_sharding(mesh, x.shape)
    if x.sharding != target:
        x = jax.device_put(x, target)
    pieces = {}
    for shard in x.addressable_shards:
        start = shard.index[0].start or 0 if shard.index else 0
        pieces.setdefault(start, shard.data)
    rows = host_rows(mesh, n)
    out = np.concatenate([np.asarray(pieces[k]) for k in sorted(pieces)], axis=0)
    if out.shape[0] != rows.stop - rows.start:
        raise AssertionError(f"local rows {out.shape[0]} != {rows}")
    return out


def to_host(x) -> np.ndarray:
    """The full value of a global array on every host (for small arrays: rewards,
    lengths, metrics)."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def tree_to_host(tree):
    """`to_host` of every array of `tree`: one batched `jax.device_get` in one process,
    an all-gather per array that spans several."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    return jax.tree.map(to_host, tree)


def gather_host_rows(local: np.ndarray, mesh: Mesh | None, n: int) -> np.ndarray:
    """Every host's rows of an n-row host-side array, concatenated in global order."""
    if mesh is None or jax.process_count() == 1:
        return np.asarray(local)
    return to_host(global_batch(np.asarray(local), mesh, n))


def sum_over_hosts(x: np.ndarray) -> np.ndarray:
    """Elementwise sum of a host-local NumPy array over all processes."""
    if jax.process_count() == 1:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(np.asarray(x))).sum(axis=0)


def sum_counts_over_hosts(counts: dict[str, int], max_bytes: int = 1 << 16) -> dict[str, int]:
    """Per-key sums of a host-local dict of counts over all processes (the hosts may
    hold different keys; a key any host holds is in the result)."""
    if jax.process_count() == 1:
        return dict(counts)
    raw = json.dumps({k: int(v) for k, v in counts.items()}, sort_keys=True).encode()
    if len(raw) + 4 > max_bytes:
        raise ValueError(f"counts of {len(raw)} bytes: more than {max_bytes} to gather")
    buf = np.zeros(max_bytes, np.uint8)
    buf[:4] = np.frombuffer(np.uint32(len(raw)).tobytes(), np.uint8)
    buf[4 : 4 + len(raw)] = np.frombuffer(raw, np.uint8)
    total: dict[str, int] = {}
    for row in np.asarray(multihost_utils.process_allgather(buf)):
        size = int(np.frombuffer(row[:4].tobytes(), np.uint32)[0])
        for k, v in json.loads(row[4 : 4 + size].tobytes()).items():
            total[k] = total.get(k, 0) + v
    return dict(sorted(total.items()))
