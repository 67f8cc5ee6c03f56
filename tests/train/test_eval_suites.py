"""Evaluation suites end to end: the loop's evals, summary.json, curves, TensorBoard and
`python -m da3po_jax.eval` report one row per benchmark, each at its own k.

One micro run (1 RL step, evals at steps 0 and 1) with the synthetic held-out set and three
suites in published layouts (`tests/suite_fixtures.py`: MATH-500 at k=2, AIME 2024 at k=4,
OlympiadBench at k=1) is shared by every test. Verdicts come from `HashScorer`, so every
number can be recomputed from the sampled text.
"""

from __future__ import annotations

import json
import os
import types

import numpy as np
import pytest
from suite_fixtures import SUITES, write_suites  # tests/
from test_eval_cli import eval_rows, hash_verdict, read_samples
from test_train_smoke import HashScorer, micro_config

import da3po_jax.eval as eval_lib
import da3po_jax.run.context as context_lib
from da3po_jax.run import train
from da3po_jax.run.evaluation import pass_at_k
from da3po_jax.runtime.curves import curve_panels
from da3po_jax.runtime.metrics_file import read_metrics

TITLES = {"math500": "MATH-500", "aime2024": "AIME 2024", "olympiadbench": "OlympiadBench"}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> types.SimpleNamespace:
    root = tmp_path_factory.mktemp("suites")
    specs = write_suites(str(root / "suites"))
    scorer, context_lib.RewardScorer = context_lib.RewardScorer, HashScorer
    try:
        workdir = str(root / "run")
        config = micro_config(
            "grpo",
            **{
                "train.steps": 1,
                "train.eval_every": 1,
                "eval.suites": specs,
                "eval.log_samples": 2,
                "rollout.prompt_buckets": (64,),
                "rl.packing": False,
            },
        )
        summary = train(config, workdir)
    finally:
        context_lib.RewardScorer = scorer
    return types.SimpleNamespace(workdir=workdir, specs=specs, summary=summary, config=config)


@pytest.fixture
def hash_scorer(monkeypatch):
    monkeypatch.setattr(context_lib, "RewardScorer", HashScorer)


def test_the_loop_logs_every_suite_at_its_own_k(run):
    for step, row in eval_rows(run.workdir).items():
        assert row["eval/num_prompts"] == 8  # the held-out set, keys as before suites
        assert "eval/avg@2" in row and "eval/avg@2/easy" in row
        for name, (k, _, count) in SUITES.items():
            assert row[f"eval/{name}/num_prompts"] == count, (step, name)
            avg, passed = row[f"eval/{name}/avg@{k}"], row[f"eval/{name}/pass@{k}"]
            assert 0 <= avg <= passed + 1e-6 <= 1 + 1e-6  # avg@k is a float32 mean
            assert f"eval/{name}/response_len" in row
        levels = {key.rsplit("/", 1)[1] for key in row if key.startswith("eval/math500/avg@2/")}
        assert levels and levels <= {"Level 1", "Level 2", "Level 3"}
        for kind in ("avg", "pass"):
            columns = [row[f"eval/{n}/{kind}@{k}"] for n, (k, _, _) in SUITES.items()]
            assert row[f"eval/average/{kind}@k"] == pytest.approx(np.mean(columns))


def test_the_loop_logs_samples_of_every_set(run):
    with open(os.path.join(run.workdir, "eval_samples.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    for step in (0, 1):
        suites = [r["suite"] for r in rows if r["step"] == step]
        assert suites == ["", ""] + [n for n in SUITES for _ in range(2)]
    assert all(r["correct"] == hash_verdict(r["response"]) for r in rows)


def test_summary_holds_the_tables_before_and_after(run):
    with open(os.path.join(run.workdir, "summary.json")) as f:
        summary = json.load(f)
    logged = eval_rows(run.workdir)
    for when, step in (("before", 0), ("after", 1)):
        table = summary["suites"][when]
        assert table["step"] == step
        rows = table["table"]
        assert [r["name"] for r in rows] == [*SUITES, "average"]
        assert [r["title"] for r in rows] == [*TITLES.values(), "Average"]
        for r in rows[:-1]:
            k = SUITES[r["name"]][0]
            assert r["k"] == k and r["num_prompts"] == SUITES[r["name"]][2]
            assert r["avg"] == logged[step][f"eval/{r['name']}/avg@{k}"]
            assert r["pass"] == logged[step][f"eval/{r['name']}/pass@{k}"]
        assert rows[-1]["avg"] == pytest.approx(np.mean([r["avg"] for r in rows[:-1]]))


def test_curves_and_tensorboard_show_each_benchmark(run):
    panels = dict(curve_panels(read_metrics(os.path.join(run.workdir, "metrics.jsonl"))))
    drawn = panels["eval suites avg@k"]
    assert sorted(drawn) == sorted(
        ["eval/average/avg@k"] + [f"eval/{n}/avg@{k}" for n, (k, _, _) in SUITES.items()]
    )
    assert panels["held-out avg@k"][0] == "eval/avg@2"  # the held-out set's own panel
    events = os.path.join(run.workdir, "tensorboard")
    blob = b"".join(open(os.path.join(events, f), "rb").read() for f in os.listdir(events))
    for name, (k, _, _) in SUITES.items():
        assert f"eval/{name}/avg_at_{k}".encode() in blob  # TensorBoard tags spell @ _at_


def test_the_eval_command_reproduces_the_loops_suites(run, tmp_path, hash_scorer):
    """Step 1 evaluated with the run's own config gives every number the loop logged at
    step 1, suite by suite; samples.jsonl holds every response with its suite, and each
    suite's avg@k and pass@k are recomputed here from the verdicts."""
    out = str(tmp_path / "report")
    report = eval_lib.run_eval(None, os.path.join(run.workdir, "checkpoints", "1"), out)
    logged = eval_rows(run.workdir)[1]
    for key in (k for k in logged if k.startswith("eval/")):
        assert report["metrics"][key] == pytest.approx(logged[key], abs=1e-6), key
    assert [r["name"] for r in report["suites"]] == [*SUITES, "average"]
    samples = read_samples(out)
    for name, (k, _, count) in SUITES.items():
        mine = [s for s in samples if s["suite"] == name]
        assert len(mine) == count * k and all(s["id"].startswith(f"{name}/") for s in mine)
        assert all(s["correct"] == hash_verdict(s["response"]) for s in mine)
        by_problem: dict[str, list[bool]] = {}
        for s in mine:
            by_problem.setdefault(s["id"], []).append(s["correct"])
        avg = np.mean([np.mean(v) for v in by_problem.values()])
        passed = np.mean([pass_at_k(k, sum(v), k) for v in by_problem.values()])
        assert report["metrics"][f"eval/{name}/avg@{k}"] == pytest.approx(avg)
        assert report["metrics"][f"eval/{name}/pass@{k}"] == pytest.approx(passed)
    text = eval_lib.format_report(report)
    assert "3 eval suites, 15 prompts" in text
    assert "| | MATH-500 | AIME 2024 | OlympiadBench | Average |" in text
    avg_row = [ln for ln in text.splitlines() if ln.strip().startswith("| avg@k |")]
    assert avg_row and f"{100 * report['suites'][-1]['avg']:.1f} |" in avg_row[0]


def test_a_suite_samples_the_same_alone_and_takes_its_own_template(run, tmp_path, hash_scorer):
    """The AIME suite evaluated without the other sets draws the same samples (its keys
    depend on its name only); rendered with `template=boxed`, its prompts carry that
    instruction while the rows stay the same."""
    aime = next(s for s in run.specs if s.startswith("aime2024"))
    config = micro_config("grpo", **{"eval.suites": (aime,), "data.synthetic_eval": 0})
    config.rollout.prompt_buckets = (64,)
    checkpoint = os.path.join(run.workdir, "checkpoints", "1")
    alone = eval_lib.run_eval(config, checkpoint, str(tmp_path / "alone"))
    logged = eval_rows(run.workdir)[1]
    assert not alone["heldout"] and [r["name"] for r in alone["suites"]] == ["aime2024", "average"]
    assert alone["metrics"]["eval/aime2024/avg@4"] == logged["eval/aime2024/avg@4"]
    assert "eval/avg@2" not in alone["metrics"]
    config.eval.suites = (aime.replace("template=tiny", "template=boxed"),)
    config.rollout.prompt_buckets = (64, 128)  # the instruction is 40 more tokens
    boxed = eval_lib.run_eval(config, checkpoint, str(tmp_path / "boxed"))
    samples = read_samples(boxed["out"])
    assert all("\\boxed{}" in s["prompt"] for s in samples)
    assert {s["reference"] for s in samples} == {s["reference"] for s in read_samples(alone["out"])}
