"""Batch scoring in worker processes: order, statuses, stats, the hard timeout and crashes."""

import os
import time

import pytest

from da3po_jax.rewards import STATUSES, RewardScorer, score_batch

TIMEOUT_S = 1.0


def scripted_verify(pred: str, ref: str) -> bool:
    """A custom verifier (runs in the workers) that can hang, crash or raise on demand."""
    if pred == "SLOW":
        time.sleep(60)
    if pred == "CRASH":
        os._exit(3)
    if pred == "RAISE":
        raise ValueError("boom")
    return pred == ref


@pytest.fixture(scope="module")
def math_scorer():
    with RewardScorer(num_workers=2, timeout_s=20.0) as scorer:
        yield scorer


@pytest.fixture(scope="module")
def scripted_scorer():
    with RewardScorer(num_workers=2, timeout_s=TIMEOUT_S, verify_fn=scripted_verify) as scorer:
        yield scorer


def test_fast_path_needs_no_worker_and_uses_configured_rewards():
    with RewardScorer(correct_reward=2.0, incorrect_reward=-0.5) as scorer:
        batch = scorer.score_batch(
            ["Answer: 1,000", "\\boxed{\\frac{1}{2}}", "I give up", "Answer: 7"],
            ["1000", "0.5", "3", "8"],
        )
        assert scorer._pool.workers == []  # decided in the parent, no process started
    assert batch.rewards == [2.0, 2.0, -0.5, -0.5]
    assert batch.correct == [True, True, False, False]
    assert [r.extracted for r in batch.results] == ["1,000", "\\frac{1}{2}", None, "7"]
    assert [r.status for r in batch.results] == ["ok", "ok", "no_answer", "ok"]
    assert batch.stats == {
        "ok": 3,
        "no_answer": 1,
        "timeout": 0,
        "error": 0,
        "correct": 2,
        "total": 4,
        "symbolic": 0,
        "worker_restarts": 0,
    }


def test_symbolic_answers_are_scored_in_workers_in_input_order(math_scorer):
    responses = [
        "\\boxed{\\sqrt{2}/2}",  # symbolic, correct
        "Answer: 5",  # fast, correct
        "\\boxed{2\\pi}",  # symbolic, wrong
        "no answer at all",
        "\\boxed{x^2+2x+1}",  # symbolic, correct
        "\\boxed{\\sqrt{2}/2}",  # duplicate pair: checked once
    ]
    references = ["\\frac{\\sqrt{2}}{2}", "5", "\\pi", "3", "(x+1)^2", "\\frac{\\sqrt{2}}{2}"]
    batch = math_scorer.score_batch(responses, references)
    assert batch.correct == [True, True, False, False, True, True]
    assert [r.status for r in batch.results] == ["ok", "ok", "ok", "no_answer", "ok", "ok"]
    assert batch.stats["symbolic"] == 3
    assert batch.stats["ok"] == 5 and batch.stats["no_answer"] == 1
    assert batch.stats["correct"] == 4 and batch.stats["total"] == 6


def test_adversarial_responses_score_zero_without_blocking(math_scorer):
    answers = [
        "9**9**9**9",
        "1e99999999",
        "(" * 10_000 + "1" + ")" * 10_000,
        "10^{10^{10}}",
        "\\sqrt{10^{40000}}",
        "(x+1)^{1000000}",
        "\\frac{" * 5_000,
        "1" * 1_000_000,
    ]
    responses = [f"\\boxed{{{a}}}" for a in answers] + ["x" * 1_000_000, "\\boxed{" * 100_000]
    start = time.perf_counter()
    batch = math_scorer.score_batch(responses, ["1"] * len(responses))
    assert time.perf_counter() - start < 10.0
    assert batch.correct == [False] * len(responses)
    # Rejected by the size caps, not by the timeout; unbalanced boxes state no answer, and
    # answers over MAX_ANSWER_CHARS (the 20k parentheses, the 1M digits) count as none.
    expected = ["ok", "ok", "no_answer", "ok", "ok", "ok", "no_answer", "no_answer"]
    expected += ["no_answer", "no_answer"]
    assert [r.status for r in batch.results] == expected
    assert batch.stats["timeout"] == 0 and batch.stats["worker_restarts"] == 0
    assert math_scorer.score("\\boxed{\\sqrt{8}}", "2\\sqrt{2}").correct  # pool still works


def test_timeout_crash_and_error_are_scored_zero_and_counted(scripted_scorer):
    responses = [f"Answer: {a}" for a in ["a", "SLOW", "b", "CRASH", "RAISE", "c"]]
    references = ["a", "x", "x", "x", "x", "c"]
    start = time.perf_counter()
    batch = scripted_scorer.score_batch(responses, references)
    elapsed = time.perf_counter() - start
    assert [r.status for r in batch.results] == ["ok", "timeout", "ok", "error", "error", "ok"]
    assert batch.correct == [True, False, False, False, False, True]
    assert batch.rewards == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert batch.stats["timeout"] == 1 and batch.stats["error"] == 2 and batch.stats["ok"] == 3
    assert batch.stats["worker_restarts"] == 2  # the hung worker and the crashed one
    assert TIMEOUT_S <= elapsed < 30.0  # the sleeping worker was killed, not waited for

    # The pool still works afterwards, with replacement workers.
    again = scripted_scorer.score_batch(["Answer: z"] * 3 + ["Answer: y"], ["z"] * 3 + ["q"])
    assert again.correct == [True, True, True, False]
    assert again.stats["symbolic"] == 2 and again.stats["worker_restarts"] == 0


def test_many_results_keep_input_order(scripted_scorer):
    preds = [f"v{i % 7}" for i in range(40)]
    refs = [f"v{(i * 3) % 7}" for i in range(40)]
    batch = scripted_scorer.score_batch([f"Answer: {p}" for p in preds], refs)
    assert batch.correct == [p == r for p, r in zip(preds, refs)]
    assert [r.extracted for r in batch.results] == preds
    assert set(batch.stats) >= set(STATUSES)


def test_score_batch_function_and_input_validation():
    batch = score_batch(["\\boxed{3}", "Answer: 4"], ["3", "5"], timeout_s=2.0, num_workers=1)
    assert batch.correct == [True, False]
    with pytest.raises(ValueError, match="2 responses but 1 references"):
        score_batch(["a", "b"], ["a"])
    with pytest.raises(TypeError):
        score_batch(["a"], [None])
    with pytest.raises(ValueError):
        RewardScorer(num_workers=0)
    with pytest.raises(ValueError):
        RewardScorer(timeout_s=0)
    with pytest.raises(ValueError):
        RewardScorer(start_method="fork")
