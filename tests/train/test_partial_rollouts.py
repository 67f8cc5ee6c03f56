"""Partial rollouts in the RL loop (`rollout.max_staleness`, docs/algorithms.md "Partial
rollouts"): the config rules, the decoupled objective switched on, and DA3PO runs whose
groups span policy versions within the bound, with nothing admitted lost. (That
`max_staleness = 0` leaves the continuous engine's runs as they were is the
`da3po_continuous` case of test_metric_reference.py.)"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_train_smoke import hash_scorer, micro_config, read_rows  # noqa: E402, F401

from da3po_jax.config import resolve_settings as settings_from  # noqa: E402
from da3po_jax.run import train  # noqa: E402
from da3po_jax.run.build import update_config  # noqa: E402

G = 4  # micro_config's group size
# wall-clock metrics, and compile counts (a resumed run reuses this process's programs)
NOT_COMPARED = ("time/", "throughput/", "perf/", "compile/")
PARTIAL = {
    "rollout.engine": "continuous",
    "rollout.slots": 8,
    "rollout.steps_per_call": 2,
    "rollout.max_new_tokens": 24,
    "rollout.max_staleness": 1,
}


def test_partial_rollouts_turn_on_the_decoupled_objective():
    s = settings_from(micro_config("da3po", **PARTIAL))
    assert s.rollout.exact  # temperature 1: TIS would be off without partial rollouts
    assert s.loss_config().tis_cap == 2.0
    assert update_config(s).recompute_logp_old  # the proximal policy: the step's weights
    off = settings_from(micro_config("da3po", **{**PARTIAL, "rollout.max_staleness": 0}))
    assert off.loss_config().tis_cap == 0.0 and not update_config(off).recompute_logp_old


@pytest.mark.parametrize(
    "overrides, needle",
    [
        ({"rollout.engine": "static"}, "rollout.max_staleness=1 needs a slot engine"),
        ({"rollout.tis_cap": 0.0}, "set it >= 1"),
        ({"rollout.max_staleness": -1}, "rollout.max_staleness"),
        ({"rollout.partial_kv": "stale"}, "rollout.partial_kv"),
    ],
)
def test_bad_partial_settings_are_refused(overrides, needle):
    with pytest.raises(ValueError, match=needle.replace(".", r"\.").replace("(", r"\(")):
        settings_from(micro_config("da3po", **{**PARTIAL, **overrides}))


@pytest.mark.slow
@pytest.mark.usefixtures("hash_scorer")
@pytest.mark.parametrize("partial_kv, staleness", [("keep", 1), ("recompute", 2)])
def test_groups_span_versions_within_the_bound(tmp_path, partial_kv, staleness):
    overrides = {
        **PARTIAL,
        "rollout.partial_kv": partial_kv,
        "rollout.max_staleness": staleness,
        "train.steps": 4,
        "train.eval_every": 0,
        "train.checkpoint_every": 0,
    }
    train(micro_config("da3po", **overrides), str(tmp_path))
    rows = [r for r in read_rows(str(tmp_path)) if r["kind"] == "train"]
    assert len(rows) == 4
    for r in rows:
        assert np.isfinite(r["loss/total"]) and "loss/tis_weight_mean" in r
        lags = [r[f"stale/token_lag_{k}"] for k in range(staleness + 1)]
        assert sum(lags) + r["stale/token_lag_over"] == pytest.approx(1.0)
        # judged within `staleness` steps of admission; the surplus may add one more
        assert r["stale/max_lag"] <= staleness + 1
    # groups carried across a step: tokens of an older version in a later batch
    assert max(r["stale/token_lag_1"] for r in rows) > 0
    assert max(r["stale/mixed_groups"] for r in rows) > 0
    # nothing admitted is lost: returned + still in flight = admitted
    returned = sum(r["samples/generated"] for r in rows) / G
    assert returned + rows[-1]["stale/in_flight"] == sum(r["ds/prompts"] for r in rows)


_KILLED_AT_3 = """
import json, os, signal, sys
sys.path.insert(0, {here!r})
import da3po_jax.run.context as context_lib
from test_train_smoke import HashScorer, micro_config
from da3po_jax.run import train
from da3po_jax.run.loop import RLTrainer
context_lib.RewardScorer = HashScorer
step = RLTrainer.step
def dying(self):
    if int(self.state.step) == 2:  # step 3 begins: step 2's checkpoint is written, then
        self.checkpointer.wait()
        os.kill(os.getpid(), signal.SIGKILL)  # no handler, nothing flushed
    return step(self)
RLTrainer.step = dying
train(micro_config("da3po", **json.loads({overrides!r})), {workdir!r})
"""


def _final_params(workdir: str) -> list[np.ndarray]:
    from safetensors.numpy import load_file

    folder = os.path.join(workdir, "final_model")
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(folder, name)))
    return [out[k] for k in sorted(out)]


@pytest.mark.slow
@pytest.mark.usefixtures("hash_scorer")
@pytest.mark.parametrize("partial_kv", ["keep", "recompute"])
def test_kill_9_with_work_in_flight_then_resume_is_exact(tmp_path, partial_kv):
    """Partial rollouts, 3 steps, checkpoint at 2: killed with SIGKILL as step 3 begins,
    the checkpoint holds the work in flight (slots, keys/values with `keep`, row
    buffers, versions, sample keys, queue, groups being scored) and the resumed run ends
    bitwise as the uninterrupted one (weights and every logged metric)."""
    import json
    import subprocess

    overrides = {
        **PARTIAL,
        "rollout.partial_kv": partial_kv,
        "train.steps": 3,
        "train.eval_every": 0,
        "train.checkpoint_every": 2,
        "train.export_final": True,
    }
    whole, killed = str(tmp_path / "whole"), str(tmp_path / "killed")
    train(micro_config("da3po", **overrides), whole)
    code = _KILLED_AT_3.format(
        here=os.path.dirname(os.path.abspath(__file__)),
        overrides=json.dumps(overrides),
        workdir=killed,
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == -9, proc.stderr[-4000:]
    assert sorted(os.listdir(os.path.join(killed, "checkpoints"))) == ["2"]
    with open(os.path.join(killed, "checkpoints", "2", "host", "metadata")) as f:
        carried = json.load(f)["engine"]
    assert carried["in_flight"] > 0 and carried["rows"], "nothing was in flight at step 2"
    train(micro_config("da3po", **overrides), killed)  # resumes at step 2
    a, b = _final_params(whole), _final_params(killed)
    assert len(a) == len(b) > 0 and all(np.array_equal(x, y) for x, y in zip(a, b))
    rows = {}
    for name, w in (("whole", whole), ("killed", killed)):
        rows[name] = [
            {k: v for k, v in r.items() if not k.startswith(NOT_COMPARED)} for r in read_rows(w)
        ]
    assert [r["step"] for r in rows["killed"]] == [1, 2, 3]
    assert rows["killed"] == rows["whole"]
