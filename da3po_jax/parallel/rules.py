"""One ordered table of sharding rules: parameter path -> `PartitionSpec`.

Paths are the `/`-joined NNX paths of the policy (`layers/3/attn/q`), matched with
`re.search` in order; the first match wins. The same table applies to optimizer state,
whose AdamW moments sit under paths ending in the parameter's path (`.../mu/layers/3/
attn/q`), so moments are sharded exactly like their parameters.

Layouts (see `models/transformer.py`): `q/k/v` are [hidden, heads, head_dim], `o` is
[heads, head_dim, hidden], the MLP is [hidden, inter] / [inter, hidden], `embed` is
[vocab, hidden] and `lm_head` [hidden, vocab]. FSDP splits the hidden (model) dimension;
tensor parallelism splits attention heads, MLP hidden units and the vocabulary. An axis
that does not divide its dimension (e.g. 2 KV heads over a tensor axis of 8) is dropped
from that parameter's spec, which then stays replicated along it. A scanned model's
stacked layer parameters (`layers/attn/q`, [num_layers, ...]) take the same rule with the
leading layer axis unsplit.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

Rule = tuple[str, tuple[str | None, ...]]

RULES: tuple[Rule, ...] = (
    (r"(^|/)embed$", ("tensor", "fsdp")),
    (r"(^|/)lm_head$", ("fsdp", "tensor")),
    (r"attn/(q|k|v)$", ("fsdp", "tensor", None)),
    (r"attn/o$", ("tensor", None, "fsdp")),
    (r"attn/(q|k|v)_bias$", ("tensor", None)),
    (r"mlp/(gate|up)$", ("fsdp", "tensor")),
    (r"mlp/down$", ("tensor", "fsdp")),
    (r".*", ()),  # norms, o_bias, scalars (optimizer step count): replicated
)


# A stacked (scanned) layer parameter: `layers/attn/q`, no layer index after `layers`.
_STACKED = re.compile(r"(^|/)layers/(?!\d)")


def path_str(path: Any) -> str:
    """`layers/0/attn/q` from an NNX path tuple, a JAX key path, or a string; a trailing
    `value` (the NNX variable's field) is dropped."""
    if isinstance(path, str):
        parts = path.split("/")
    else:
        parts = []
        for k in path:
            for attr in ("key", "idx", "name"):
                if hasattr(k, attr):
                    k = getattr(k, attr)
                    break
            parts.append(str(k))
    if parts and parts[-1] == "value":
        parts = parts[:-1]
    return "/".join(parts)


def spec_for(
    path: Any, shape: Sequence[int], mesh: Mesh, rules: Sequence[Rule] = RULES
) -> PartitionSpec:
    """The `PartitionSpec` of the parameter at `path` with `shape` under `mesh`."""
    name = path_str(path)
    axes = next((axes for pattern, axes in rules if re.search(pattern, name)), ())
    if _STACKED.search(name) and len(axes) + 1 == len(shape):
        axes = (None, *axes)  # a scanned model's leading layer axis is never split
    if len(axes) != len(shape):  # a rule written for another rank: do not guess
        return PartitionSpec()
    spec = [
        a if a is not None and mesh.shape[a] > 1 and dim % mesh.shape[a] == 0 else None
        for a, dim in zip(axes, shape)
    ]
    while spec and spec[-1] is None:
        spec.pop()
    return PartitionSpec(*spec)


def param_sharding(mesh: Mesh, rules: Sequence[Rule] = RULES):
    """A function (path, shape) -> `NamedSharding`, the form `load_model(sharding=...)`
    and `init_model(sharding=...)` take."""
    return lambda path, shape: NamedSharding(mesh, spec_for(path, shape, mesh, rules))


def tree_shardings(tree: Any, mesh: Mesh, rules: Sequence[Rule] = RULES) -> Any:
    """`NamedSharding`s for every array leaf of `tree` (params, optimizer state, a whole
    `TrainState`; abstract `ShapeDtypeStruct`s work too) by the rules."""
    return jax.tree_util.tree_map_with_path(
        lambda p, x: NamedSharding(mesh, spec_for(p, x.shape, mesh, rules)), tree
    )


def shard_tree(tree: Any, mesh: Mesh, rules: Sequence[Rule] = RULES) -> Any:
    """`tree` placed on `mesh` by the rules (moves existing arrays; for creation and
    loading prefer the `sharding=` argument of `init_model` / `load_model`, which never
    builds a full tensor on one device)."""
    return jax.device_put(tree, tree_shardings(tree, mesh, rules))
