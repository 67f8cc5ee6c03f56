"""The step estimate of `plan --compile` (da3po_jax/compile/report.py): the roofline at
stated efficiencies, and why it is not built from the compiled programs' cost analysis."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from da3po_jax.compile.report import ASSUMED_HBM_EFFICIENCY, ASSUMED_MFU, step_estimate


def test_the_estimate_is_the_roofline_at_the_stated_efficiencies():
    roof = {"update_s": 40.0, "rollout_s": 30.0, "step_s": 70.0}
    e = step_estimate(roof, mfu=0.4, hbm=0.6)
    assert e["update_s"] == pytest.approx(100.0)  # 40 / 0.4
    assert e["rollout_s"] == pytest.approx(50.0)  # 30 / 0.6
    assert e["step_s"] == pytest.approx(150.0)
    assert e["label"] == "estimate at 40% MFU and 60% of HBM bandwidth (assumed)"
    assert step_estimate(roof)["mfu"] == ASSUMED_MFU
    assert step_estimate(roof)["hbm_efficiency"] == ASSUMED_HBM_EFFICIENCY
    with pytest.raises(ValueError, match="efficiencies must be in"):
        step_estimate(roof, mfu=0.0)


def _flops(fn, *args) -> float:
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    return (cost[0] if isinstance(cost, list) else cost)["flops"]


def test_cost_analysis_counts_a_scanned_body_once():
    """The reason the estimate does not use `programs.*.flops`: a program whose layers run
    under lax.scan reports one layer's FLOPs. If XLA starts counting trip counts, this
    fails, and the compiled FLOPs could then be used."""
    x, ws = jnp.ones((64, 64)), jnp.ones((10, 64, 64))

    def scanned(x, ws):
        return jax.lax.scan(lambda c, w: (c @ w, None), x, ws)[0]

    def unrolled(x, ws):
        for i in range(10):
            x = x @ ws[i]
        return x

    one = 2 * 64**3
    assert _flops(unrolled, x, ws) == pytest.approx(10 * one, rel=0.01)
    assert _flops(scanned, x, ws) == pytest.approx(one, rel=0.01)
