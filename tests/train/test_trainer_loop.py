"""Trainer bookkeeping: dynamic sampling with rounds larger than the batch, the history
estimator's counts, the learning-rate metric, and the metrics logger (multi-host
truncation, W&B run id and keys)."""

from __future__ import annotations

import json
import os
import sys
import types

import numpy as np
import pytest
from test_train_smoke import micro_config, read_rows

import da3po_jax.run.context as context_lib
from da3po_jax.parallel import to_host
from da3po_jax.rewards.scorer import BatchScores, ScoreResult
from da3po_jax.rl import PromptHistory
from da3po_jax.rollout import Collector
from da3po_jax.rollout.history import add_to_history
from da3po_jax.run import train
from da3po_jax.runtime.logger import MetricsLogger

G = 4


class FirstCorrectScorer:
    """Response 0 of every group is correct, the others wrong: every group is mixed."""

    def __init__(self, **kwargs):
        pass

    def score_batch(self, responses, references):
        results = [
            ScoreResult(i % G == 0, float(i % G == 0), "", "ok") for i in range(len(responses))
        ]
        return BatchScores(results, {"ok": len(results), "total": len(results)})

    def close(self):
        pass


SEEN: list[dict[str, np.ndarray]] = []


def spy_after_update(self, carry, collected):
    """Records what each update received: the batch's history counts and prompt ids, and
    the history table at that moment (before this step's outcomes are added)."""
    SEEN.append(
        {
            "success": to_host(collected.batch.history.success),
            "failure": to_host(collected.batch.history.failure),
            "index": to_host(collected.batch.prompt_index),
            "valid": to_host(collected.valid),
            "table": to_host(carry.history.success) + to_host(carry.history.failure),
        }
    )
    return ORIGINAL_AFTER_UPDATE(self, carry, collected)


ORIGINAL_AFTER_UPDATE = Collector.after_update


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["power", "bayes", "history"])
def test_rounds_larger_than_the_batch(tmp_path, monkeypatch, estimator):
    """prompts_per_round = 8 > train_prompts = 4 with every group kept: step 1 keeps 8
    groups (4 trained, 4 carried), step 2 trains on the carried ones without generating,
    step 3 generates again. The history estimator sees, for a carried group, only what was
    known before it was generated (nothing), although the table has its counts by then.
    The lr metric is the rate of the step's last optimizer update (2 per step here); with
    tempered sampling the update applies truncated importance weights."""
    monkeypatch.setattr(context_lib, "RewardScorer", FirstCorrectScorer)
    monkeypatch.setattr(Collector, "after_update", spy_after_update)
    SEEN.clear()
    cfg = micro_config(
        "da3po",
        **{
            "rollout.prompts_per_round": 8,
            "train.steps": 3,
            "train.eval_every": 0,
            "train.checkpoint_every": 0,
            "daa.estimator": estimator,
            "optim.lr": 1e-3,
            "optim.warmup_steps": 4,
            # tempered sampling of the untempered policy turns truncated importance
            # sampling on (checked below)
            "rollout.temperature": 0.7 if estimator == "bayes" else 1.0,
            "loss.train_temperature": 1.0,
        },
    )
    workdir = str(tmp_path / estimator)
    train(cfg, workdir)
    rows = [r for r in read_rows(workdir) if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["ds/prompts"] for r in rows] == [8, 0, 8]
    assert [r["ds/batch_fill"] for r in rows] == [1.0, 1.0, 1.0]
    assert [r["ds/surplus_groups"] for r in rows] == [4, 0, 4]
    assert "reward/mean" not in rows[1] and rows[1]["samples/generated"] == 0
    assert all(np.isfinite(r["loss/total"]) and r["loss/num_tokens"] > 0 for r in rows)
    # warm-up over 4 steps of 2 updates: step s trains at lr * (s - 1) / 4
    lrs = [r["optim/lr"] for r in rows]
    np.testing.assert_allclose(lrs, [0.0, 2.5e-4, 5e-4], rtol=1e-6)  # a float32 schedule
    for r in rows:  # weights min(pi_old / mu, 2) only where sampling was tempered
        assert ("loss/tis_weight_mean" in r) == (estimator == "bayes")
        if estimator == "bayes":
            assert 0.0 < r["loss/tis_weight_mean"] <= 2.0
    if estimator != "history":
        return
    step1, step2, _ = SEEN
    for seen in (step1, step2):  # first epoch: nothing was known before generation
        np.testing.assert_array_equal(seen["success"], 0.0)
        np.testing.assert_array_equal(seen["failure"], 0.0)
    # ... although by step 2 the table holds the carried groups' own counts (G each)
    np.testing.assert_array_equal(step2["table"][step2["index"]], float(G))
    assert set(step1["index"]).isdisjoint(step2["index"])


def test_history_applies_repeated_prompts_in_order():
    """Prompt 3 drawn twice in one step: both updates count, one after the other."""
    table = PromptHistory(np.zeros(6), np.zeros(6))
    table.success[3], table.failure[3] = 2.0, 6.0
    idx = np.array([3, 5, 3, -1])
    correct = np.array([[1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], np.float32)
    d = 0.5
    new = add_to_history(table, idx, correct, G, d)
    np.testing.assert_allclose(new.success[3], d * (d * 2.0 + 1) + 2)
    np.testing.assert_allclose(new.failure[3], d * (d * 6.0 + 3) + 2)
    np.testing.assert_allclose([new.success[5], new.failure[5]], [3.0, 1.0])
    untouched = [0, 1, 2, 4]
    np.testing.assert_array_equal(new.success[untouched], 0.0)
    np.testing.assert_array_equal(table.success[3], 2.0)  # the input is not modified


def _rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_only_the_writing_process_truncates_metrics(tmp_path):
    """Another host's logger (disabled) must not rewrite the shared metrics file."""
    main = MetricsLogger(str(tmp_path))
    for step in (1, 2, 3):
        main.write(step, {"x": step})
    MetricsLogger(str(tmp_path), enabled=False).truncate(1)
    assert [r["step"] for r in _rows(main.path)] == [1, 2, 3]
    main.truncate(2)
    assert [r["step"] for r in _rows(main.path)] == [1, 2]
    main.close()


class _FakeRun:
    def __init__(self, kwargs):
        self.kwargs, self.logged = kwargs, []

    def log(self, data, step):
        self.logged.append((step, data))

    def finish(self):
        pass


def test_wandb_run_id_is_kept_and_keys_are_not_doubled(tmp_path, monkeypatch):
    runs, ids = [], iter(["abc123", "zzz999"])
    fake = types.SimpleNamespace(
        init=lambda **kw: runs.append(_FakeRun(kw)) or runs[-1],
        util=types.SimpleNamespace(generate_id=lambda: next(ids)),
    )
    monkeypatch.setitem(sys.modules, "wandb", fake)
    for _ in range(2):  # a run and its restart
        logger = MetricsLogger(str(tmp_path), wandb_project="p")
        logger.write(5, {"eval/avg@4": 0.5, "reward/mean": 0.25}, kind="eval")
        logger.close()
    assert [r.kwargs["id"] for r in runs] == ["abc123", "abc123"]
    assert runs[0].kwargs["resume"] == "allow"
    assert open(os.path.join(tmp_path, "wandb_id.txt")).read().strip() == "abc123"
    assert runs[1].logged == [(5, {"eval/avg@4": 0.5, "reward/mean": 0.25})]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_tensorboard_writer_raises_instead_of_blocking(tmp_path):
    """tensorboardX writes events on a thread that dies on a failed write (a full disk);
    a later put into its bounded queue used to block the run forever. Now the next
    write raises the thread's error and close() returns."""
    import threading

    logger = MetricsLogger(str(tmp_path))
    logger.write(1, {"x": 1.0})

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    logger._tb.file_writer.event_writer._ev_writer.write_event = full_disk
    outcome: dict[str, BaseException] = {}

    def keep_writing():
        try:
            for step in range(2, 5000):
                logger.write(step, {"x": float(step), "y": 2.0})
        except OSError as e:
            outcome["error"] = e
        logger.close()

    worker = threading.Thread(target=keep_writing, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the logger blocked on the dead TensorBoard writer"
    assert "No space left on device" in str(outcome["error"])
    assert "TensorBoard writer" in str(outcome["error"])
