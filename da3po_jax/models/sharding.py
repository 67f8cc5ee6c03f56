"""Where the model's activations live on a device mesh.

Under an ambient mesh (`parallel.mesh.kernel_mesh` sets one on accelerators), the model pins
the rows of its activations (the embeddings, every projection's and the MLP's outputs, the
logits) to the batch axes `data` x `fsdp`, when they divide the rows, and leaves their
other dimensions (heads, hidden, vocabulary: `tensor`) to the partitioner. Left to itself,
XLA's partitioner may keep an FSDP-sharded weight in place and all-gather the activations
instead: compiling the packed update of the 1.5B recipe for v5e-8, every layer's
attention output [16, 4096, 12, 128] and each [16, 512, vocab] logits block were gathered
over the 8 chips in the backward pass (docs/memory.md). Pinned, each weight is gathered,
one layer at a time, as FSDP intends.

Without an ambient mesh (one process on the CPU, the tests' CPU devices) nothing changes.
"""

from __future__ import annotations

import math

import jax
from jax.sharding import NamedSharding, PartitionSpec

# the mesh axes that split a batch (`parallel.mesh.BATCH_AXES`; models sit below parallel)
BATCH_AXES = ("data", "fsdp")


def batch_axes(sizes: dict[str, int], rows: int) -> tuple[str, ...]:
    """The batch axes (of mesh axis `sizes`) that split `rows` rows: those of size > 1,
    or none when their product does not divide `rows`."""
    axes = tuple(a for a in BATCH_AXES if sizes.get(a, 1) > 1)
    return axes if rows % math.prod(sizes[a] for a in axes) == 0 else ()


def constrain(x: jax.Array) -> jax.Array:
    """`x` with its rows (dimension 0) pinned to the batch axes of the ambient mesh (its
    other dimensions, and rows the batch axes do not divide, left to the partitioner); `x`
    itself when there is no mesh."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return x
    free = PartitionSpec.UNCONSTRAINED
    rows = batch_axes(dict(zip(mesh.axis_names, mesh.axis_sizes)), x.shape[0]) or free
    spec = PartitionSpec(rows, *[free] * (x.ndim - 1))
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
