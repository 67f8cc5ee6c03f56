"""`python -m da3po_jax.eval`, and what the training loop logs at each eval (sampled
responses to JSONL and TensorBoard, curves.png).

One micro run (1 RL step, evals at steps 0 and 1, checkpoint 1, final model exported) is
shared by every test. Verdicts come from `HashScorer` (a response is correct when a hash
of its text says so), so groups are mixed and every verdict in a report can be recomputed
from the response text alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
import zlib

import numpy as np
import pytest
from test_train_smoke import HashScorer, micro_config

import da3po_jax.eval as eval_lib
import da3po_jax.run.context as context_lib
import da3po_jax.runtime.logger as logger_lib
from da3po_jax.run import train
from da3po_jax.runtime.logger import MetricsLogger
from da3po_jax.runtime.metrics_file import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K = 2  # eval.num_samples of the micro config
LOGGED = 3  # eval.log_samples of the run


def hash_verdict(response: str) -> bool:
    return zlib.crc32(response.encode()) % 3 == 0


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> types.SimpleNamespace:
    """The finished micro run, its config, and the curves.png writes it made."""
    plots: list[tuple[str, int]] = []
    original_plot = logger_lib.plot_curves

    def recording_plot(metrics_path, out_png, *args, **kwargs):
        rows = read_metrics(metrics_path)
        plots.append((out_png, max((r["step"] for r in rows), default=-1)))
        return original_plot(metrics_path, out_png, *args, **kwargs)

    scorer, context_lib.RewardScorer = context_lib.RewardScorer, HashScorer
    logger_lib.plot_curves = recording_plot
    try:
        workdir = str(tmp_path_factory.mktemp("eval") / "run")
        config = micro_config(
            "grpo",
            **{
                "train.steps": 1,
                "train.eval_every": 1,
                "train.export_final": True,
                "eval.log_samples": LOGGED,
                "rollout.prompt_buckets": (64,),
                "rl.packing": False,
            },
        )
        train(config, workdir)
    finally:
        context_lib.RewardScorer, logger_lib.plot_curves = scorer, original_plot
    return types.SimpleNamespace(workdir=workdir, config=config, plots=plots)


@pytest.fixture
def hash_scorer(monkeypatch):
    monkeypatch.setattr(context_lib, "RewardScorer", HashScorer)


def read_samples(out: str) -> list[dict]:
    with open(os.path.join(out, "samples.jsonl")) as f:
        return [json.loads(line) for line in f]


def eval_rows(workdir: str) -> dict[int, dict]:
    return {
        r["step"]: r
        for r in read_metrics(os.path.join(workdir, "metrics.jsonl"))
        if r["kind"] == "eval"
    }


def test_a_run_checkpoint_reproduces_the_loops_eval(run, tmp_path, hash_scorer):
    """Step 1 of the run, evaluated with the run's own config (the default), gives the
    metrics the training loop logged at step 1: same parameters, prompts and keys."""
    out = str(tmp_path / "report")
    report = eval_lib.run_eval(None, os.path.join(run.workdir, "checkpoints", "1"), out)
    logged = eval_rows(run.workdir)[1]
    assert report["step"] == 1 and report["k"] == K and report["num_prompts"] == 8
    keys = [k for k in logged if k.startswith("eval/")]
    assert len(keys) > 6  # overall and per-tier avg@k / pass@k, lengths
    for key in keys:
        assert report["metrics"][key] == pytest.approx(logged[key], abs=1e-6), key
    with open(os.path.join(out, "report.json")) as f:
        assert json.load(f) == json.loads(json.dumps(report))


def test_samples_hold_every_response_with_its_verdict(run, tmp_path, hash_scorer):
    out = str(tmp_path / "report")
    report = eval_lib.run_eval(None, run.workdir, out, group_by="tier")
    samples = read_samples(out)
    assert len(samples) == report["num_prompts"] * K
    assert {(s["id"], s["sample"]) for s in samples} == {
        (s["id"], g) for s in samples for g in range(K)
    }
    verdicts = [s["correct"] for s in samples]
    assert verdicts == [hash_verdict(s["response"]) for s in samples]
    assert 0 < sum(verdicts) < len(verdicts)  # mixed: the checks below can fail
    assert all(s["prompt"].endswith("<|im_start|>assistant\n") for s in samples)
    m = report["metrics"]
    assert m[f"eval/avg@{K}"] == pytest.approx(np.mean(verdicts))
    assert m["eval/response_len"] == pytest.approx(np.mean([s["length"] for s in samples]))
    for tier in {s["tier"] for s in samples}:
        mine = [s for s in samples if s["tier"] == tier]
        assert m[f"eval/avg@{K}/{tier}"] == pytest.approx(np.mean([s["correct"] for s in mine]))
        by_id: dict[str, list[bool]] = {}
        for s in mine:
            by_id.setdefault(s["id"], []).append(s["correct"])
        passed = np.mean([any(v) for v in by_id.values()])  # pass@k with n = k samples
        assert m[f"eval/pass@{K}/{tier}"] == pytest.approx(passed)


def test_group_by_a_dataset_field(run, tmp_path, hash_scorer):
    """The synthetic problems' `kind` (an operation) groups the report; a field no problem
    has is refused by name before anything is written."""
    out = str(tmp_path / "by_kind")
    report = eval_lib.run_eval(None, run.workdir, out, group_by="kind")
    groups = {k.split("/", 2)[2] for k in report["metrics"] if k.startswith(f"eval/avg@{K}/")}
    assert groups and not groups & {"easy", "medium", "hard"}
    with pytest.raises(ValueError, match="eval.group_by='subject': no problem has that field"):
        eval_lib.run_eval(None, run.workdir, str(tmp_path / "nope"), group_by="subject")
    assert not os.path.exists(tmp_path / "nope")


def test_a_model_folder_in_bfloat16_on_the_default_mesh(run, tmp_path, hash_scorer):
    out = str(tmp_path / "hf")
    folder = os.path.join(run.workdir, "final_model")
    report = eval_lib.run_eval(run.config, folder, out, dtype="bfloat16")
    assert report["step"] is None and report["checkpoint"] == folder
    assert report["settings"]["param_dtype"] == report["settings"]["dtype"] == "bfloat16"
    samples = read_samples(out)
    assert len(samples) == 8 * K
    assert report["metrics"][f"eval/avg@{K}"] == pytest.approx(
        np.mean([s["correct"] for s in samples])
    )


def test_refusals_name_the_problem_and_write_nothing(run, tmp_path, hash_scorer):
    with pytest.raises(eval_lib.EvalError, match="does not exist"):
        eval_lib.run_eval(None, str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(eval_lib.EvalError, match="neither a training run's folder"):
        eval_lib.run_eval(None, str(tmp_path / "empty"))
    with pytest.raises(eval_lib.EvalError, match="--config is required"):
        eval_lib.run_eval(None, os.path.join(run.workdir, "final_model"))
    with pytest.raises(ValueError, match="--step=7 is not in"):
        eval_lib.run_eval(None, os.path.join(run.workdir, "checkpoints", "7"), str(tmp_path / "o"))
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with pytest.raises(eval_lib.EvalError, match="exists and is not empty; pass --overwrite"):
        eval_lib.run_eval(None, run.workdir, str(taken))
    assert os.listdir(taken) == ["keep.txt"]
    assert not os.path.exists(tmp_path / "o")


def eval_command(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "da3po_jax.eval", *flags],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        timeout=300,
    )


def test_the_command_prints_the_table(run, tmp_path):
    """The real command (real verifier workers) on the run's step, via WORKDIR/N."""
    out = str(tmp_path / "cli")
    proc = eval_command(f"--checkpoint={run.workdir}/1", f"--out={out}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == f"{run.workdir} (step 1): 8 prompts x {K} samples"
    assert lines[1].split() == [f"avg@{K}", f"pass@{K}"]
    assert lines[2].split()[0] == "all" and {ln.split()[0] for ln in lines[3:-2]} <= {
        "easy",
        "medium",
        "hard",
    }
    assert lines[-2].startswith("  mean response") and lines[-1] == f"  report: {out}"
    assert os.path.isfile(os.path.join(out, "report.json"))
    again = eval_command(f"--checkpoint={run.workdir}", f"--out={out}")
    assert again.returncode == 1
    assert (
        again.stderr.strip()
        .splitlines()[-1]
        .startswith(f"da3po_jax: error: EvalError: --out {out!r} exists and is not empty")
    )


def test_the_loop_logs_sampled_responses_at_each_eval(run):
    """eval_samples.jsonl: `eval.log_samples` responses per eval (steps 0 and 1), each
    with prompt, response, reference and verdict; TensorBoard has them as text."""
    with open(os.path.join(run.workdir, "eval_samples.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [0] * LOGGED + [1] * LOGGED
    for r in rows:
        assert {"prompt", "response", "reference", "correct"} <= set(r)
        assert r["correct"] == hash_verdict(r["response"])
    events = os.path.join(run.workdir, "tensorboard")
    blob = b"".join(open(os.path.join(events, f), "rb").read() for f in os.listdir(events))
    assert b"eval/samples" in blob and rows[0]["reference"].encode() in blob


def test_curves_are_drawn_at_every_eval(run):
    """curves.png is redrawn after the step-0 eval and after the step-1 eval, each time
    with the rows written so far (not only at the end of the run)."""
    curves = os.path.join(run.workdir, "curves.png")
    assert [p for p in run.plots if p[0] == curves] == [(curves, 0), (curves, 1)]
    with open(curves, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_resumed_run_drops_logged_samples_of_later_steps(tmp_path):
    logger = MetricsLogger(str(tmp_path))
    for step in (1, 2, 3):
        logger.write_samples(step, [{"prompt": "p", "response": f"r{step}", "correct": True}])
    logger.truncate(2)
    logger.close()
    with open(tmp_path / "eval_samples.jsonl") as f:
        assert [json.loads(line)["response"] for line in f] == ["r1", "r2"]


EIGHT_DEVICES = """
import json, sys
sys.path.insert(0, {here!r})
from test_train_smoke import HashScorer
import jax
import da3po_jax.eval as eval_lib
import da3po_jax.run.context as context_lib
context_lib.RewardScorer = HashScorer
assert jax.device_count() == 8
report = eval_lib.run_eval(None, {checkpoint!r}, {out!r})
print(json.dumps(report))
"""


@pytest.mark.multidevice
def test_sharded_over_eight_devices_gives_the_same_report(run, tmp_path, hash_scorer):
    """The run's config mesh (-1, 1, 1) spreads the eval over 8 simulated devices: the
    parameters and prompts are sharded, and the report equals the one-device one."""
    checkpoint = os.path.join(run.workdir, "checkpoints", "1")
    one = eval_lib.run_eval(None, checkpoint, str(tmp_path / "one"))
    code = EIGHT_DEVICES.format(
        here=os.path.dirname(os.path.abspath(__file__)),
        checkpoint=checkpoint,
        out=str(tmp_path / "eight"),
    )
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    eight = json.loads(proc.stdout.strip().splitlines()[-1])
    assert eight["settings"]["mesh"] == {"data": 8, "fsdp": 1, "tensor": 1}
    assert eight["metrics"] == pytest.approx(one["metrics"], abs=1e-6)
    assert read_samples(str(tmp_path / "eight")) == read_samples(str(tmp_path / "one"))
