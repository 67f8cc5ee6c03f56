"""End-to-end trainer checks on a micro config: smoke runs, exact resume, dynamic sampling."""

from __future__ import annotations

import json
import logging
import os
import zlib

import jax
import numpy as np
import pytest
from ml_collections import config_flags  # noqa: F401  (config files import ml_collections)

import da3po_jax.run.context as context_lib
from da3po_jax.config import ALGORITHMS, DISTILLATION, resolve_settings
from da3po_jax.rewards.scorer import BatchScores, ScoreResult
from da3po_jax.run import train
from da3po_jax.run.loop import RLTrainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_config(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs", name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def micro_config(algo: str = "da3po", **overrides):
    c = load_config("tiny_math.py")
    c.algo = algo
    c.model.preset = "tiny-qwen2"
    # the static engine, the reference in exactness tests; tests of the continuous engine
    # (the default) name it
    c.rollout.engine = "static"
    c.tokenizer.vocab_size = 300
    c.data.synthetic_train, c.data.synthetic_eval, c.data.synthetic_sft = 64, 8, 32
    c.rollout.prompts_per_round, c.rollout.group_size = 4, 4
    c.rollout.max_new_tokens = 8
    c.rl.train_prompts, c.rl.mini_batch_prompts = 4, 2
    c.ds.max_prompts = 12  # 3 rounds of 4
    c.train.steps, c.train.eval_every, c.train.checkpoint_every = 2, 2, 1
    c.eval.num_samples, c.eval.max_prompts, c.eval.prompts_per_call = 2, 8, 8
    c.sft.enable = False
    c.optim.lr, c.optim.warmup_steps = 1e-3, 0
    for key, value in overrides.items():
        node = c
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c


class HashScorer:
    """Deterministic stand-in for the verifier: a response is 'correct' when a hash of its
    text says so, so groups of a random policy are mixed and resuming replays exactly."""

    def __init__(self, correct_reward=1.0, incorrect_reward=0.0, **kwargs):
        self.calls = 0
        self.rewards = (float(incorrect_reward), float(correct_reward))

    def score_batch(self, responses, references):
        self.calls += 1
        results = [
            ScoreResult(bool(zlib.crc32(r.encode()) % 3 == 0), 0.0, r, "ok") for r in responses
        ]
        results = [
            ScoreResult(r.correct, self.rewards[r.correct], r.extracted, "ok") for r in results
        ]
        return BatchScores(results, {"ok": len(results), "total": len(results)})

    def close(self):
        pass


@pytest.fixture
def hash_scorer(monkeypatch):
    monkeypatch.setattr(context_lib, "RewardScorer", HashScorer)


def read_rows(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


# da3po also exercises the less common paths: reference KL, recomputed old log-probs,
# micro-batches and the bayes estimator.
EXTRA = {
    "grpo": {},
    "dapo": {},
    "da3po": {
        "loss.kl_coef": 0.05,
        "rollout.logp_old": "recompute",
        "rl.packing": False,
        "rl.micro_batch_prompts": 1,
        "daa.estimator": "bayes",
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "dapo", "da3po"])
def test_two_step_smoke(tmp_path, hash_scorer, algo, monkeypatch):
    workdir = str(tmp_path / algo)
    from program_shapes import ProgramRecorder, check_planned_programs  # tests/

    config = micro_config(algo, **EXTRA[algo])
    recorder = ProgramRecorder(monkeypatch)
    summary = train(config, workdir)
    assert summary["steps"] == 2
    rows = [r for r in read_rows(workdir) if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert np.isfinite(r["loss/total"]) and r["loss/num_tokens"] > 0
        assert 0.0 < r["reward/acc"] < 1.0
        if algo == "grpo":
            assert r["ds/prompts"] == 4 and "daa/lambda_mean" not in r
        else:
            assert r["ds/prompts"] in (4, 8, 12)
        if algo == "da3po":
            assert r["daa/lambda_mean"] >= 1.0
            assert r["loss/kl_ref"] >= 0.0  # the reference forward ran
    for name in (
        "curves.png",
        "summary.json",
        "config.json",
        "tokenizer/tokenizer.json",
        "final_model/model.safetensors",
        "final_model/tokenizer.json",
    ):
        assert os.path.exists(os.path.join(workdir, name)), name
    assert "eval/avg@2" in summary["after"]
    # the compile planner's programs (the static engine's, with its eval) take these arguments
    check_planned_programs(recorder, config)


class Interrupt(Exception):
    pass


def final_params(workdir, cfg):
    """Parameters of the latest checkpoint in `workdir`."""
    from da3po_jax.runtime.checkpoint import Checkpointer

    ck = Checkpointer(workdir)
    step = ck.latest_step()
    path = os.path.join(ck.directory, str(step), "state")
    import orbax.checkpoint as ocp

    tree = ocp.StandardCheckpointer().restore(path)
    ck.close()
    return step, tree["train"]["params"]


@pytest.mark.slow
def test_resume_matches_uninterrupted_run(tmp_path, hash_scorer, monkeypatch):
    cfg = micro_config(
        "da3po", **{"train.steps": 4, "train.eval_every": 0, "daa.estimator": "history"}
    )
    full = str(tmp_path / "full")
    train(cfg, full)

    part = str(tmp_path / "part")
    original = RLTrainer.step
    calls = {"n": 0}

    def crashing_step(self):
        calls["n"] += 1
        if calls["n"] == 3:  # dies in the middle of step 3, after step 2's checkpoint
            raise Interrupt
        return original(self)

    monkeypatch.setattr(RLTrainer, "step", crashing_step)
    with pytest.raises(Interrupt):
        train(cfg, part)
    monkeypatch.setattr(RLTrainer, "step", original)
    train(cfg, part)  # same command, same workdir: resumes from step 2

    rows_full = [r for r in read_rows(full) if r["kind"] == "train"]
    rows_part = [r for r in read_rows(part) if r["kind"] == "train"]
    assert [r["step"] for r in rows_part] == [1, 2, 3, 4]
    skip = ("time/", "throughput/", "compile/", "perf/")  # measurements of the process
    for a, b in zip(rows_full, rows_part):
        for key in a:
            if not key.startswith(skip) and isinstance(a[key], float):
                assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-6), (a["step"], key)
    step_a, params_a = final_params(full, cfg)
    step_b, params_b = final_params(part, cfg)
    assert step_a == step_b == 4
    for x, y in zip(jax.tree.leaves(params_a), jax.tree.leaves(params_b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=1e-6)


def test_incompatible_checkpoint_is_refused(tmp_path, hash_scorer):
    workdir = str(tmp_path / "run")
    train(micro_config("dapo", **{"train.steps": 1, "train.eval_every": 0}), workdir)
    before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
    from da3po_jax.runtime.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="rollout.group_size: checkpoint 4 vs now 8"):
        train(micro_config("dapo", **{"rollout.group_size": 8, "train.eval_every": 0}), workdir)
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == before
    # another engine carries a surplus of another size (4 prompts per round vs 4 x 8 / 4)
    other = {"rollout.engine": "continuous", "rollout.slots": 8, "train.eval_every": 0}
    with pytest.raises(CheckpointError, match="surplus_groups: checkpoint 4 vs now 8"):
        train(micro_config("dapo", **other), workdir)
    # the stacked (scanned) parameter tree is another layout
    with pytest.raises(CheckpointError, match="model.scan_layers: checkpoint False vs now True"):
        train(micro_config("dapo", **{"model.scan_layers": True, "train.eval_every": 0}), workdir)
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == before

    # A damaged checkpoint: a clear error, and the files stay as they were.
    state_dir = os.path.join(workdir, "checkpoints", "1", "state")
    victims = [
        os.path.join(d, f)
        for d, _, fs in os.walk(state_dir)
        for f in fs
        if os.path.basename(d) == "d"
    ]  # the array data files
    assert victims
    for path in victims:
        os.remove(path)
    left = sorted(os.walk(os.path.join(workdir, "checkpoints")))
    with pytest.raises(CheckpointError, match="no checkpoint in .* restores .*cannot restore"):
        train(micro_config("dapo", **{"train.steps": 2, "train.eval_every": 0}), workdir)
    assert sorted(os.walk(os.path.join(workdir, "checkpoints"))) == left


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match=r"config.rollout.group_size=1 must be >= 2"):
        resolve_settings(micro_config(**{"rollout.group_size": 1}))
    with pytest.raises(ValueError, match=r"config.algo='ppo' must be one of"):
        resolve_settings(micro_config(algo="ppo"))
    with pytest.raises(ValueError, match=r"config.loss.agg='mean' must be one of"):
        resolve_settings(micro_config(**{"loss.agg": "mean"}))
    with pytest.raises(ValueError, match=r"mini_batch_prompts=3 must divide"):
        resolve_settings(micro_config(**{"rl.mini_batch_prompts": 3}))


def test_algorithm_presets_and_explicit_overrides():
    grpo = resolve_settings(micro_config("grpo"))
    assert (grpo.ds.enable, grpo.daa.enable, grpo.loss.eps_high, grpo.loss.agg) == (
        False,
        False,
        0.2,
        "seq-mean-token-mean",
    )
    dapo = resolve_settings(micro_config("dapo"))
    assert (dapo.ds.enable, dapo.daa.enable, dapo.loss.eps_high, dapo.loss.agg) == (
        True,
        False,
        0.28,
        "token-mean",
    )
    assert dapo.overlong.buffer == 8 // 5
    da3po = resolve_settings(micro_config("da3po", **{"loss.eps_high": 0.3}))
    assert da3po.daa.enable and da3po.loss.eps_high == 0.3  # explicit value wins


@pytest.mark.parametrize(
    "name",
    sorted(
        f for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".py") and f != "base.py"
    ),
)
def test_every_config_file_parses_and_validates(name):
    config = load_config(name)
    if not config.tokenizer.build_tiny and not config.model.path:  # real recipes: a model
        with pytest.raises(ValueError, match="config.model.path is required"):
            resolve_settings(config)
        config.model.path = "/models/some-hf-folder"
    if config.data.source != "synthetic" and not config.data.train_path:  # ... and data
        with pytest.raises(ValueError, match="config.data.train_path is required"):
            resolve_settings(config)
        config.data.train_path = "/data/train.parquet"
    if config.algo in DISTILLATION and not config.teacher.path:  # nor a teacher folder
        with pytest.raises(ValueError, match="config.teacher.path is required"):
            resolve_settings(config)
        config.teacher.path = "/models/some-teacher-folder"
    cfg = resolve_settings(config)
    assert cfg.algo in ALGORITHMS
    assert cfg.rl.train_prompts % cfg.rl.mini_batch_prompts == 0


class ScriptedScorer:
    """Correctness by a script of group patterns per call: 'm' mixed (1 of G correct),
    'w' all wrong, 'c' all correct."""

    script: list[str] = []

    def __init__(self, correct_reward=1.0, incorrect_reward=0.0, **kwargs):
        self.calls = 0
        self.rewards = (float(incorrect_reward), float(correct_reward))

    def score_batch(self, responses, references):
        pattern = self.script[self.calls]
        self.calls += 1
        g = len(responses) // len(pattern)
        row = {"m": [1] + [0] * (g - 1), "w": [0] * g, "c": [1] * g}
        flags = [bool(x) for p in pattern for x in row[p]]
        results = [ScoreResult(f, float(f), "", "ok") for f in flags]
        return BatchScores(results, {"ok": len(results), "total": len(results)})

    def close(self):
        pass


@pytest.mark.slow
def test_dynamic_sampling_refill_surplus_and_round_cap(tmp_path, monkeypatch, caplog):
    ScriptedScorer.script = [
        "mwmc",
        "mmmw",  # step 1: 2 kept, then 3 -> full + 1 surplus
        "wwww",
        "cccc",
        "mwww",
    ]  # step 2: surplus + 0 + 0 + 1 -> cap
    monkeypatch.setattr(context_lib, "RewardScorer", ScriptedScorer)
    workdir = str(tmp_path / "ds")
    cfg = micro_config("dapo", **{"train.eval_every": 0, "ds.max_prompts": 12})
    with caplog.at_level(logging.WARNING, logger="da3po_jax"):
        train(cfg, workdir)
    step1, step2 = [r for r in read_rows(workdir) if r["kind"] == "train"]
    assert (step1["ds/prompts"], step1["ds/batch_fill"], step1["ds/surplus_groups"]) == (8, 1.0, 1)
    assert step1["ds/kept_frac"] == pytest.approx(5 / 8)
    assert step1["ds/all_wrong_frac"] == pytest.approx(2 / 8)
    assert (step2["ds/prompts"], step2["ds/batch_fill"], step2["ds/surplus_groups"]) == (12, 0.5, 0)
    assert step2["ds/all_correct_frac"] == pytest.approx(4 / 12)
    assert "reached ds.max_prompts=12 admitted prompts with 2 of 4 groups" in caplog.text
    assert step2["reward/acc"] == pytest.approx((0 + 16 + 1) / 48)
    # Step 2 trains on the carried surplus group and the new mixed one: no zero-variance
    # group among the non-empty slots.
    assert step2["adv/zero_var_frac"] == 0.0 and step1["adv/zero_var_frac"] == 0.0


def test_history_counts_every_generated_group(tmp_path, hash_scorer):
    """The history estimator's per-prompt table counts all generated groups, including
    the ones dynamic sampling filtered out, so after one step (decay acts on zeros) its
    total count equals the number of responses generated."""
    import orbax.checkpoint as ocp

    cfg = micro_config(
        "da3po", **{"train.steps": 1, "train.eval_every": 0, "daa.estimator": "history"}
    )
    workdir = str(tmp_path / "run")
    train(cfg, workdir)
    (row,) = [r for r in read_rows(workdir) if r["kind"] == "train"]
    tree = ocp.StandardCheckpointer().restore(os.path.join(workdir, "checkpoints", "1", "state"))
    history = tree["carry"]["history"]  # orbax gives the RLCarry back as nested dicts
    success, failure = np.asarray(history["success"]), np.asarray(history["failure"])
    assert success.sum() + failure.sum() == row["samples/generated"] > 0
    # with dynamic sampling some groups were filtered, and they are counted too
    assert row["samples/generated"] > cfg.rl.train_prompts * cfg.rollout.group_size or (
        row["ds/kept_frac"] == 1.0
    )
    assert success.sum() == pytest.approx(row["reward/acc"] * row["samples/generated"])


@pytest.mark.slow
def test_token_budget_stops_the_run_and_survives_resume(tmp_path, hash_scorer):
    """train.token_budget: the run stops after the step whose generated response tokens
    (all rounds, dropped groups included) reach the budget, evaluates and checkpoints
    there, and a resumed run with more steps allowed does not go on."""
    free = str(tmp_path / "free")
    train(micro_config("dapo", **{"train.steps": 3, "train.eval_every": 0}), free)
    rows = [r for r in read_rows(free) if r["kind"] == "train"]
    per_step = [r["tokens/generated"] for r in rows]
    assert all(n > 0 for n in per_step)
    # the count is the sum of the generated samples' lengths (each at most max_new_tokens)
    for r in rows:
        assert r["tokens/generated"] <= r["samples/generated"] * 8
        assert r["tokens/generated"] == pytest.approx(
            r["response/len_mean"] * r["samples/generated"], rel=1e-6
        )
    assert [r["tokens/generated_total"] for r in rows] == list(np.cumsum(per_step))

    budget = int(per_step[0] + per_step[1]) - 1  # reached during step 2
    cfg = micro_config(
        "dapo", **{"train.steps": 3, "train.eval_every": 10, "train.token_budget": budget}
    )
    capped = str(tmp_path / "capped")
    summary = train(cfg, capped)
    assert summary["steps"] == 2
    rows = read_rows(capped)
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2]
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [0, 2]  # the stop evaluates
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert train_rows[1]["tokens/generated_total"] == per_step[0] + per_step[1]
    assert os.path.isdir(os.path.join(capped, "checkpoints", "2"))

    cfg.train.steps = 5  # resuming: the budget is already spent, nothing more runs
    again = train(cfg, capped)
    assert again["steps"] == 2
    assert [r["step"] for r in read_rows(capped) if r["kind"] == "train"] == [1, 2]


def test_token_budget_counts_and_the_progress_bar_shows_its_share():
    from da3po_jax.run.loop import TokenBudget, _progress

    budget = TokenBudget(1000)
    assert budget.add(250.0) == {"tokens/generated": 250.0, "tokens/generated_total": 250.0}
    assert not budget.reached
    row = {"reward/mean": 0.5, "reward/acc": 0.5, "throughput/gen_tokens_per_s": 10.0}
    assert _progress(row, budget)["budget"] == "25%"
    assert _progress({}, budget) == {"rounds": "0 (carried surplus)", "budget": "25%"}
    budget.add(750.0)
    assert budget.reached and budget.total == 1000
    unlimited = TokenBudget(0)
    unlimited.add(10**9)
    assert not unlimited.reached and "budget" not in _progress(row, unlimited)
