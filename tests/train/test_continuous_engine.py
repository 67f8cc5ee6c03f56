"""The continuous engine inside the RL loop: DA3PO trains through it (dynamic sampling as a
stream, every admitted prompt's group comes back, nothing compiles again after step 1),
it generates the static engine's groups for the same prompts and keys, and the groups a
step keeps do not depend on how long scoring takes. (On 8 devices and on 2 processes:
tests/parallel/test_multiprocess.py; the slot decoder on 8 devices against 1:
tests/sampling/test_continuous.py.) After `sync_weights` to new weights, the tokens
sampled and their behaviour log-probs are those of the new weights."""

from __future__ import annotations

import logging
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "sampling"))
import jax  # noqa: E402
from sampling_helpers import tiny_model  # noqa: E402
from test_train_smoke import HashScorer, hash_scorer, micro_config, read_rows  # noqa: E402, F401

from da3po_jax.data import MathProblem  # noqa: E402
from da3po_jax.models.tokenizer import Tokenizer  # noqa: E402
from da3po_jax.rollout import PromptEncoder, ScoredGroups  # noqa: E402
from da3po_jax.rollout.continuous import ContinuousEngine  # noqa: E402
from da3po_jax.run import train  # noqa: E402
from da3po_jax.sampling import GenerateConfig  # noqa: E402
from da3po_jax.sampling.continuous import SlotConfig, SlotDecoder  # noqa: E402
from da3po_jax.update.forwards import response_logprobs  # noqa: E402

pytestmark = pytest.mark.usefixtures("hash_scorer")  # the deterministic verifier stand-in
G = 4  # micro_config's group size
NOT_COMPARED = ("time/", "throughput/", "compile/", "perf/")
CONTINUOUS = {"rollout.engine": "continuous", "rollout.slots": 8, "rollout.steps_per_call": 4}


def _rows(workdir, kind):
    return [r for r in read_rows(workdir) if r["kind"] == kind]


@pytest.mark.slow
def test_da3po_trains_through_the_continuous_engine(tmp_path, caplog, monkeypatch):
    cfg = micro_config(
        "da3po", **CONTINUOUS, **{"train.steps": 3, "train.eval_every": 3, "ds.max_prompts": 12}
    )
    from program_shapes import ProgramRecorder, check_planned_programs  # tests/

    recorder = ProgramRecorder(monkeypatch)
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
    # the compile planner's programs take the arguments this run gave them
    check_planned_programs(recorder, cfg)


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


class _IdsText:
    """Stands in for a `transformers` tokenizer: a text is its token ids, space-separated
    (the engine needs ids for prompts and text for the verifier, nothing more)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(str(int(i)) for i in ids)


def _behaviour_vs_teacher_forced(ready: list[ScoredGroups], graphdef, params) -> tuple:
    """The returned rows' recorded logp_old, versions and masks, and the teacher-forced
    log-probs of the same tokens under each of `params` (the update's forward), host
    arrays [R, N] (R: the valid groups' rows, in order)."""
    rows = [(sg.batch, i) for sg in ready for i in np.flatnonzero(sg.valid)]
    g = rows[0][0].tokens.shape[1]

    def cat(name: str) -> np.ndarray:  # [G, ...] per group
        return np.concatenate([np.asarray(getattr(b, name))[i] for b, i in rows])

    def per_row(name: str) -> np.ndarray:  # [...] per group, repeated for its G rows
        return np.concatenate(
            [np.repeat(np.asarray(getattr(b, name))[i][None], g, 0) for b, i in rows]
        )

    inputs = (per_row("prompt_tokens"), per_row("prompt_mask"), cat("tokens"), cat("response_mask"))
    forward = jax.jit(response_logprobs, static_argnums=0)
    forced = [np.asarray(forward(graphdef, p, *inputs)[0]) for p in params]
    return cat("logp_old"), cat("version"), inputs[3], forced


def test_after_sync_weights_the_engine_samples_with_the_new_weights():
    """Partial rollouts (max_staleness 1, `recompute`): groups admitted under weights A
    (version 0) are carried across a step end (`release`) and go on after `sync_weights`
    to weights B (version 1), beside groups admitted under B. Every token's recorded
    behaviour log-prob equals the teacher-forced log-prob, under the weights of the version
    it is stamped with, of the very token sampled (to float32 rounding), and is visibly
    not that of the other weights: an engine that stamped version 1 but kept decoding
    with A's weights fails here (the slot, version and loop tests pass the weights to the
    decoder themselves, so they cannot see it)."""
    cfg, graphdef, a, _ = tiny_model(seed=0, num_layers=1)  # one layer: quicker compiles
    _, _, b, _ = tiny_model(seed=5, num_layers=1)
    g, n, prompt_len = 4, 12, 9
    gen = GenerateConfig(num_samples=g, max_new_tokens=n, temperature=1.0)
    slots = SlotConfig(slots=8, prompt_len=prompt_len, steps_per_call=3, block=8)
    encoder = PromptEncoder(Tokenizer(_IdsText(), (1,), 0), lambda p: p.prompt, (prompt_len,))
    engine = ContinuousEngine(
        SlotDecoder(graphdef, cfg, gen, slots),
        encoder,
        HashScorer(),
        prompt_len,
        {},
        max_in_flight=8,
        max_staleness=1,
        partial_kv="recompute",
    )
    rng = np.random.default_rng(0)
    problems = [
        MathProblem(f"p{i}", " ".join(map(str, rng.integers(2, cfg.vocab_size, k))), "0")
        for i, k in enumerate((9, 4, 7, 2))
    ]
    keys = jax.random.split(jax.random.key(7), len(problems))
    try:
        engine.sync_weights(a, 0)
        engine.admit(problems[:2], keys[:2])  # one group per 4 slots: both start now
        ready = engine.finished()  # one decode call: 4 of 12 tokens each, under A
        assert not ready and engine.in_flight() == 2
        engine.release()  # the step ends; the rows in flight stay (their cache freed)
        engine.sync_weights(b, 1)
        engine.admit(problems[2:], keys[2:])
        while engine.in_flight():
            ready += engine.finished()
    finally:
        engine.abandon()
    recorded, version, mask, forced = _behaviour_vs_teacher_forced(ready, graphdef, (a, b))
    assert len(recorded) == len(problems) * g
    for v in (0, 1):
        at = mask & (version == v)
        assert at.sum() > 0
        np.testing.assert_allclose(recorded[at], forced[v][at], atol=2e-5, err_msg=f"v{v}")
        # the other weights' log-probs of these tokens are far off: the check has teeth
        assert np.abs(recorded[at] - forced[1 - v][at]).max() > 0.1
    # the two carried groups' rows span both versions (4 tokens under A, the rest under B)
    mixed = (mask & (version == 0)).any(1) & (mask & (version == 1)).any(1)
    assert mixed.sum() == 2 * g
