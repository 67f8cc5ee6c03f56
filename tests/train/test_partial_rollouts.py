"""Partial rollouts in the RL loop (`rollout.max_staleness`, docs/algorithms.md "Partial
rollouts"): the config rules, the decoupled objective switched on, DA3PO runs whose
groups span policy versions within the bound, with nothing admitted lost, and the
collect stage over a real engine carrying groups across steps: the DAA prior sees every
judged group and the token budget every sampled token, once across a resume. (That
`max_staleness = 0` leaves the continuous engine's runs as they were is the
`da3po_continuous` case of test_metric_reference.py.)"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_collector import _moments_ema  # noqa: E402
from test_continuous_engine import _IdsText  # noqa: E402
from test_train_smoke import hash_scorer, micro_config, read_rows  # noqa: E402, F401

from da3po_jax.config import resolve_settings as settings_from  # noqa: E402
from da3po_jax.data import MathProblem, PromptIterator  # noqa: E402
from da3po_jax.models import get_preset, init_model  # noqa: E402
from da3po_jax.models.tokenizer import Tokenizer  # noqa: E402
from da3po_jax.rewards.scorer import BatchScores, ScoreResult  # noqa: E402
from da3po_jax.rl import DAAConfig, OverlongConfig  # noqa: E402
from da3po_jax.rollout import CollectConfig, Collector, KeepRule, PromptEncoder  # noqa: E402
from da3po_jax.rollout.continuous import ContinuousEngine  # noqa: E402
from da3po_jax.run import train  # noqa: E402
from da3po_jax.run.build import update_config  # noqa: E402
from da3po_jax.run.loop import TokenBudget  # noqa: E402
from da3po_jax.sampling import GenerateConfig  # noqa: E402
from da3po_jax.sampling.continuous import SlotConfig, SlotDecoder  # noqa: E402

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
    # temperature 1: TIS would be off without partial rollouts
    assert s.rollout.samples_policy_at(1.0)
    assert s.loss.tis_cap == 2.0
    assert update_config(s).recompute_logp_old  # the proximal policy: the step's weights
    off = settings_from(micro_config("da3po", **{**PARTIAL, "rollout.max_staleness": 0}))
    assert off.loss.tis_cap == 0.0 and not update_config(off).recompute_logp_old


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
def test_groups_span_versions_within_the_bound(tmp_path, partial_kv, staleness, monkeypatch):
    overrides = {
        **PARTIAL,
        "rollout.partial_kv": partial_kv,
        "rollout.max_staleness": staleness,
        "train.steps": 4,
        "train.eval_every": 0,
        "train.checkpoint_every": 0,
    }
    from program_shapes import ProgramRecorder, check_planned_programs  # tests/

    config = micro_config("da3po", **overrides)
    recorder = ProgramRecorder(monkeypatch)
    train(config, str(tmp_path))
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
    # the compile planner's programs (per-token versions included) take these arguments
    check_planned_programs(recorder, config)


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
@pytest.mark.parametrize(
    "partial_kv", ["keep", pytest.param("recompute", marks=pytest.mark.extended)]
)  # recompute: extended (CI time); tests/sampling/test_partial_slots.py covers its prefill
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


class _FirstSampleScorer:
    """Deterministic verdicts by prompt: a group of a prompt whose answer is "1" is mixed
    (its first sample correct, as the engine scores whole groups in order), any other
    prompt's group all wrong (never solved)."""

    def score_batch(self, responses, references):
        flags = [ref == "1" and i % G == 0 for i, ref in enumerate(references)]
        results = [ScoreResult(f, float(f), r, "ok") for f, r in zip(flags, responses)]
        return BatchScores(results, {"ok": len(results), "total": len(results)})

    def close(self):
        pass


def _partial_collector(problems, graphdef, cfg) -> Collector:
    """The collect stage over a continuous engine carrying groups one step: 8 slots (2
    groups of G 4), rows of 12 tokens sampled over 6 decode calls of 2, batches of 2, 4
    prompts admitted per step at most, the DAA prior read."""
    n, prompt_len = 12, 9
    gen = GenerateConfig(num_samples=G, max_new_tokens=n, temperature=1.0)
    slots = SlotConfig(slots=8, prompt_len=prompt_len, steps_per_call=2, block=8)
    encoder = PromptEncoder(Tokenizer(_IdsText(), (1,), 0), lambda p: p.prompt, (prompt_len,))
    engine = ContinuousEngine(
        SlotDecoder(graphdef, cfg, gen, slots),
        encoder,
        _FirstSampleScorer(),
        prompt_len,
        {p.id: i for i, p in enumerate(problems)},
        max_in_flight=ContinuousEngine.max_in_flight_for(4, 8, G),
        max_staleness=1,
    )
    config = CollectConfig(
        capacity=2,
        max_prompts=4,
        keep=KeepRule(enable=True, metric="acc", group_size=G, overlong=OverlongConfig(n)),
        daa=DAAConfig(estimator="bayes"),
    )
    return Collector(engine, PromptIterator(problems, seed=0), config)


def _partial_problems(vocab: int) -> list[MathProblem]:
    """24 prompts of 3 to 8 random ids; by the order the iterator gives them (2 per slot
    fill): 1-2 solved, 3-6 never, 7-10 solved, the rest never. So step 1's batch fills
    with prompts 1-2 while 3-4 are in flight; step 2 judges those carried and admits 5-8,
    filling with 7-8 (6 groups judged, 4 admitted); step 3 fills with 9-10 while 11-12 are
    in flight at the stop."""
    rng = np.random.default_rng(0)
    prompts = [" ".join(map(str, rng.integers(2, vocab, 3 + i % 6))) for i in range(24)]
    order = PromptIterator([MathProblem(f"p{i}", q, "0") for i, q in enumerate(prompts)], seed=0)
    solved = {p.id for j, p in enumerate(order.next_batch(12)) if j in (0, 1, 6, 7, 8, 9)}
    return [MathProblem(f"p{i}", q, str(int(f"p{i}" in solved))) for i, q in enumerate(prompts)]


def _returned_tokens(engine: ContinuousEngine) -> list[int]:
    """Wraps `engine.finished` to add up the lengths of the rows it returns."""
    returned, finished = [0], engine.finished

    def counting():
        ready = finished()
        returned[0] += sum(int(r.scores.lengths.sum()) for r in ready)
        return ready

    engine.finished = counting
    return returned


def _in_flight_tokens(engine: ContinuousEngine) -> int:
    """The tokens sampled by the work a checkpoint carries (`ContinuousEngine.snapshot`):
    each live row's slot position, the finished rows of the live groups, the groups being
    scored."""
    arrays, meta = engine.snapshot()
    rows = sum(meta["steps"][row[0]] for row in meta["rows"])
    buffers = [np.asarray(arrays[k]["lengths"]) for k in ("groups", "scoring") if k in arrays]
    return rows + sum(int(b.sum()) for b in buffers)


def test_the_collect_stage_counts_every_judged_group_and_sampled_token():
    """Partial rollouts over the continuous engine (an untrained model, the same weights
    each step, their version counted up), 3 steps (`_partial_problems`):

    - the DAA prior's EMA is that of every judged group's accuracy, step by step, step 2
      judging 6 groups, 2 of them carried in flight from step 1 (before, the step's
      accuracy array held `ds.max_prompts` = 4 and the step failed);
    - `train.token_budget`'s count (the steps' `_gen_tokens` added up by `TokenBudget`)
      equals the tokens of the groups returned plus those sampled by the rows in flight
      at the stop, read from the engine's checkpoint snapshot (before, it counted the
      returned groups only);
    - resumed from the snapshot after step 1 in a fresh engine (as a checkpoint restores
      it), steps 2 and 3 count what the uninterrupted run counts: the tokens the rows
      carried in flight had sampled before the checkpoint are not counted again."""
    # no stop id: every row samples its 12 tokens, so which groups a step judges and
    # carries does not depend on the model (one layer of tiny-qwen2: compiles quickly)
    cfg = get_preset("tiny-qwen2", num_layers=1)
    graphdef, params = nnx.split(init_model(cfg, 0))
    problems = _partial_problems(cfg.vocab_size)
    steps, resume_at = 3, 1
    collector = _partial_collector(problems, graphdef, cfg)
    engine = collector.engine
    returned = _returned_tokens(engine)
    carry = collector.initial_carry(len(problems))
    budget, judged, counted, saved = TokenBudget(0), [], [], None
    try:
        for version in range(steps):
            collected, carry = collector.collect(params, carry, jax.random.key(version), version)
            engine.release()
            index = np.concatenate([np.asarray(i) for i, _ in collected.outcomes])
            correct = np.concatenate([np.asarray(c) for _, c in collected.outcomes])
            judged.append(correct[index >= 0].mean(axis=1))
            mean, var = _moments_ema(judged, 0.9)
            assert float(carry.prior.mean) == pytest.approx(mean, rel=1e-6, abs=1e-7), version
            assert float(carry.prior.var) == pytest.approx(var, rel=1e-6, abs=1e-7), version
            counted.append(collected.metrics["_gen_tokens"])
            budget.add(collected.metrics["_gen_tokens"])
            if version + 1 == resume_at:  # what a checkpoint of this step holds
                arrays, meta = engine.snapshot()
                arrays = jax.tree.map(jnp.copy, arrays)  # the engine goes on with its buffers
                saved = (arrays, meta, collector.iterator.state.to_dict(), carry)
        in_flight = _in_flight_tokens(engine)
    finally:
        engine.abandon()
    assert [len(a) for a in judged] == [2, 6, 2]
    assert [a.tolist() for a in judged[1:]] == [[0.0] * 4 + [0.25] * 2, [0.25] * 2]
    assert in_flight > 0  # rows of 2 groups were sampling when the run stopped
    assert budget.total == returned[0] + in_flight

    arrays, meta, data, carry = saved
    assert meta["in_flight"] == 2 and meta["rows"]
    resumed = _partial_collector(problems, graphdef, cfg)
    resumed.engine.restore(arrays, meta)
    assert resumed.engine.tokens_generated() == 0  # what its rows came with is counted
    resumed.iterator.restore(data)
    try:
        for version in range(resume_at, steps):
            collected, carry = resumed.collect(params, carry, jax.random.key(version), version)
            resumed.engine.release()
            assert collected.metrics["_gen_tokens"] == counted[version], version
    finally:
        resumed.engine.abandon()
