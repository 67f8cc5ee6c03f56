"""Sharding rules and mesh-shape resolution (pure functions; no devices needed)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, AxisType
from jax.sharding import PartitionSpec as P

from da3po_jax.models.sharding import batch_axes, constrain
from da3po_jax.parallel import AXES, resolve_mesh_shape, spec_for
from da3po_jax.parallel.rules import path_str


def mesh(data=1, fsdp=1, tensor=1):
    return AbstractMesh((data, fsdp, tensor), AXES, axis_types=(AxisType.Auto,) * 3)


def test_resolve_mesh_shape_fills_minus_one():
    assert resolve_mesh_shape((-1, 1, 1), 8) == (8, 1, 1)
    assert resolve_mesh_shape((2, -1, 2), 8) == (2, 2, 2)
    assert resolve_mesh_shape((1, 4, 2), 8) == (1, 4, 2)


@pytest.mark.parametrize(
    "shape, match",
    [
        ((2, 2), "3 entries"),
        ((-1, -1, 1), "at most one -1"),
        ((0, 1, 1), "positive"),
        ((3, -1, 1), "not divisible by 3"),
        ((2, 2, 1), "has 4 devices but 8"),
    ],
)
def test_resolve_mesh_shape_errors_name_the_field(shape, match):
    with pytest.raises(ValueError, match=match) as e:
        resolve_mesh_shape(shape, 8)
    assert "mesh.shape" in str(e.value)


def test_path_str_accepts_nnx_tuples_key_paths_and_strings():
    assert path_str(("layers", 0, "attn", "q")) == "layers/0/attn/q"
    assert path_str("layers/0/attn/q/value") == "layers/0/attn/q"


@pytest.mark.parametrize(
    "path, shape, want",
    [
        ("embed", (512, 64), P("tensor", "fsdp")),
        ("lm_head", (64, 512), P("fsdp", "tensor")),
        ("layers/0/attn/q", (64, 4, 16), P("fsdp", "tensor")),
        ("layers/0/attn/k", (64, 2, 16), P("fsdp", "tensor")),
        ("layers/0/attn/o", (4, 16, 64), P("tensor", None, "fsdp")),
        ("layers/0/attn/q_bias", (4, 16), P("tensor")),
        ("layers/0/mlp/gate", (64, 128), P("fsdp", "tensor")),
        ("layers/0/mlp/down", (128, 64), P("tensor", "fsdp")),
        ("layers/0/input_norm/weight", (64,), P()),
        ("final_norm/weight", (64,), P()),
        # optimizer moments under .../mu/ follow their parameter
        ("1/0/mu/layers/1/mlp/up", (64, 128), P("fsdp", "tensor")),
        ("1/0/count", (), P()),
    ],
)
def test_rules_table(path, shape, want):
    assert spec_for(path, shape, mesh(2, 2, 2)) == want


def test_axes_that_do_not_divide_are_dropped():
    m = mesh(1, 3, 4)
    # 2 KV heads over tensor=4: replicated over tensor; 64 hidden over fsdp=3: replicated
    assert spec_for("layers/0/attn/k", (64, 2, 16), m) == P()
    assert spec_for("layers/0/attn/q", (66, 4, 16), m) == P("fsdp", "tensor")
    assert spec_for("embed", (510, 64), m) == P()  # neither 510 % 4 nor 64 % 3


def test_size_one_axes_are_left_out():
    assert spec_for("layers/0/mlp/gate", (64, 128), mesh(8, 1, 1)) == P()
    assert spec_for("layers/0/mlp/gate", (64, 128), mesh(1, 8, 1)) == P("fsdp")


def _constraint(x, mesh=None):
    """The sharding `constrain` puts on `x` under `mesh` (None: no constraint traced)."""
    if mesh is None:
        eqns = jax.make_jaxpr(constrain)(x).eqns
    else:
        with jax.sharding.use_abstract_mesh(mesh):
            eqns = jax.make_jaxpr(constrain)(x).eqns
    assert len(eqns) <= 1
    return eqns[0].params["sharding"].spec if eqns else None


def test_activation_rows_are_pinned_to_the_batch_axes():
    mesh = AbstractMesh((2, 2, 2), AXES, axis_types=(AxisType.Auto,) * 3)
    free = P.UNCONSTRAINED
    assert _constraint(jnp.zeros((8, 3, 5)), mesh) == P(("data", "fsdp"), free, free)
    assert _constraint(jnp.zeros((6, 3)), mesh) == P(free, free)  # 4 does not divide 6
    assert _constraint(jnp.zeros((8, 3))) is None  # no mesh: nothing traced
    one = AbstractMesh((1, 1, 1), AXES, axis_types=(AxisType.Auto,) * 3)
    assert _constraint(jnp.zeros((8, 3)), one) is None
    assert batch_axes({"data": 1, "fsdp": 4, "tensor": 2}, 8) == ("fsdp",)
    assert batch_axes({"data": 2, "fsdp": 4, "tensor": 1}, 4) == ()
