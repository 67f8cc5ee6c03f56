"""Single-process behaviour of the multi-host helpers (the 2-process run is in
test_multiprocess.py)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from da3po_jax.parallel import (
    gather_host_rows,
    global_batch,
    host_rows,
    initialize,
    local_rows,
    make_mesh,
    sum_over_hosts,
    to_host,
)


def test_initialize_is_a_no_op_on_one_host(monkeypatch):
    for var in ("TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    initialize()
    assert jax.process_count() == 1


@pytest.mark.parametrize("args", [("localhost:1234", 2, -1), ("", 2, 0), ("localhost:1234", 0, 0)])
def test_initialize_needs_all_three_flags(args):
    with pytest.raises(ValueError, match="--coordinator_address.*--num_processes.*--process_id"):
        initialize(*args)


@pytest.mark.parametrize("mesh", [None, "mesh"])
def test_one_process_owns_every_row(mesh):
    mesh = make_mesh((-1, 1, 1)) if mesh else None
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    assert host_rows(mesh, 6) == slice(0, 6)
    g = global_batch({"x": x}, mesh, 6)["x"]
    assert isinstance(g, jax.Array)
    np.testing.assert_array_equal(local_rows(g, mesh), x)
    np.testing.assert_array_equal(to_host(g), x)
    np.testing.assert_array_equal(gather_host_rows(x, mesh, 6), x)
    np.testing.assert_array_equal(sum_over_hosts(np.array([1, 2])), [1, 2])
