"""Device mesh, sharding rules and multi-host helpers.

- `mesh`: the (`data`, `fsdp`, `tensor`) mesh from `config.mesh.shape` and batch placement.
- `rules`: the ordered table mapping parameter paths to `PartitionSpec`s.
- `distributed`: `jax.distributed` start-up and host-local <-> global arrays.
"""

from da3po_jax.parallel.distributed import (
    gather_host_rows,
    global_batch,
    host_rows,
    initialize,
    is_main_process,
    local_rows,
    sum_counts_over_hosts,
    sum_over_hosts,
    to_host,
    tree_to_host,
)
from da3po_jax.parallel.mesh import (
    AXES,
    BATCH_AXES,
    batch_sharding,
    make_mesh,
    replicated,
    resolve_mesh_shape,
    shard_batch,
)
from da3po_jax.parallel.rules import (
    RULES,
    param_sharding,
    shard_tree,
    spec_for,
    tree_shardings,
)

__all__ = [
    "AXES",
    "BATCH_AXES",
    "RULES",
    "batch_sharding",
    "gather_host_rows",
    "global_batch",
    "host_rows",
    "initialize",
    "is_main_process",
    "local_rows",
    "make_mesh",
    "param_sharding",
    "replicated",
    "resolve_mesh_shape",
    "shard_batch",
    "shard_tree",
    "spec_for",
    "sum_counts_over_hosts",
    "sum_over_hosts",
    "to_host",
    "tree_shardings",
    "tree_to_host",
]
