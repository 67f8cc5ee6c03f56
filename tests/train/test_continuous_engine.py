"""The continuous engine inside the RL loop: DA3PO trains through it (dynamic sampling as a
stream, every admitted prompt's group comes back, nothing compiles again after step 1),
it generates the static engine's groups for the same prompts and keys, and the groups a
step keeps do not depend on how long scoring takes. (On 8 devices and on 2 processes:
tests/parallel/test_multiprocess.py; the slot decoder on 8 devices against 1:
tests/sampling/test_continuous.py.)"""

from __future__ import annotations

import logging
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_train_smoke import hash_scorer, micro_config, read_rows  # noqa: E402, F401

from da3po_jax.run import train  # noqa: E402

pytestmark = pytest.mark.usefixtures("hash_scorer")  # the deterministic verifier stand-in
G = 4  # micro_config's group size
NOT_COMPARED = ("time/", "throughput/", "compile/", "perf/")
CONTINUOUS = {"rollout.engine": "continuous", "rollout.slots": 8, "rollout.steps_per_call": 4}


def _rows(workdir, kind):
    return [r for r in read_rows(workdir) if r["kind"] == kind]


@pytest.mark.slow
def test_da3po_trains_through_the_continuous_engine(tmp_path, caplog):
    cfg = micro_config(
        "da3po", **CONTINUOUS, **{"train.steps": 3, "train.eval_every": 3, "ds.max_prompts": 12}
    )
    with caplog.at_level(logging.WARNING, logger="da3po_jax"):
        summary = train(cfg, str(tmp_path))
    assert summary["steps"] == 3
    rows = _rows(str(tmp_path), "train")
    for r in rows:
        assert np.isfinite(r["loss/total"])
        assert r["ds/prompts"] <= 12
        # every admitted prompt's group came back and was counted (none dropped)
        assert r["samples/generated"] == r["ds/prompts"] * G
        assert r["ds/batch_fill"] == 1.0 or r["ds/prompts"] == 12
    assert sum(r["ds/prompts"] for r in rows) > 0 and rows[0]["loss/num_tokens"] > 0
    for name in ("compile/admit_groups", "compile/decode_steps", "compile/ds_round"):
        assert [r[name] for r in rows] == [rows[0][name]] * 3, name
        assert rows[0][name] >= 1
    assert "compiled again" not in caplog.text
    evals = _rows(str(tmp_path), "eval")
    assert [r["step"] for r in evals] == [0, 3] and "eval/avg@2" in evals[0]


@pytest.mark.slow
def test_continuous_and_static_engines_generate_the_same_groups(tmp_path):
    """GRPO (every group kept, so both engines get the same prompts and keys): the eval at
    step 0 and the rollout statistics of step 1 are identical; only the order in which
    groups finish differs, which the update sees (so its metrics are not compared)."""
    same = ("reward/", "response/", "samples/", "ds/")
    logged = {}
    for engine in ("static", "continuous"):
        extra = CONTINUOUS if engine == "continuous" else {}
        cfg = micro_config("grpo", **extra, **{"train.steps": 1, "train.eval_every": 1})
        workdir = str(tmp_path / engine)
        train(cfg, workdir)
        logged[engine] = (_rows(workdir, "eval")[0], _rows(workdir, "train")[0])
    (ev_s, tr_s), (ev_c, tr_c) = logged["static"], logged["continuous"]
    assert ev_s["step"] == ev_c["step"] == 0
    assert {k: v for k, v in ev_s.items() if k.startswith("eval/")} == {
        k: v for k, v in ev_c.items() if k.startswith("eval/")
    }
    compared = {k: v for k, v in tr_s.items() if k.startswith(same)}
    assert compared and compared == {k: v for k, v in tr_c.items() if k.startswith(same)}
    assert 0 < tr_s["response/len_mean"] <= 8


@pytest.mark.slow
def test_what_a_step_keeps_does_not_depend_on_scoring_time(tmp_path, monkeypatch):
    """Finished groups come back on a fixed schedule: a verifier that takes longer than a
    decode call on some batches changes no metric (before, a group came back whenever its
    scoring happened to be done, so the batch a step kept depended on timing)."""
    import time

    from test_train_smoke import HashScorer

    import da3po_jax.run.context as context_lib

    class SlowScorer(HashScorer):
        def score_batch(self, responses, references):
            if self.calls % 2 == 0:
                time.sleep(0.5)  # several decode calls of the micro model
            return super().score_batch(responses, references)

    overrides = {**CONTINUOUS, "train.steps": 2, "train.eval_every": 2, "ds.max_prompts": 12}
    fast, slow = str(tmp_path / "fast"), str(tmp_path / "slow")
    train(micro_config("da3po", **overrides), fast)
    monkeypatch.setattr(context_lib, "RewardScorer", SlowScorer)
    train(micro_config("da3po", **overrides), slow)
    a, b = _rows(fast, "train"), _rows(slow, "train")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2]
    for ra, rb in zip(a, b):
        same = {k: v for k, v in ra.items() if not k.startswith(NOT_COMPARED)}
        assert same == {k: v for k, v in rb.items() if not k.startswith(NOT_COMPARED)}
    assert b[-1]["time/scoring"] > 0.5
