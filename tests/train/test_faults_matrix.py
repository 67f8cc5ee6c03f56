"""The fault / bad-input matrix through the command line: exit status, the last line of
stderr, the workdir left as it was when the run is refused, and no hang (every run has a
time bound). Refusals stop before any compile, so each takes seconds."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from test_faults import snapshot
from test_train_smoke import HashScorer, micro_config

import da3po_jax.run.context as context_lib
from da3po_jax.models import get_preset, init_model, save_model
from da3po_jax.run import train

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
REFUSAL_S = 120  # bound on a refused run (imports included; a hang fails the test)
TRAIN_S = 600


@pytest.fixture(scope="module")
def config_file(tmp_path_factory) -> str:
    """A config file for the CLI: the tests' micro config (tests/train/test_train_smoke.py)."""
    path = tmp_path_factory.mktemp("cfg") / "micro.py"
    path.write_text(
        "import sys\n"
        f"sys.path.insert(0, {HERE!r})\n"
        "from test_train_smoke import micro_config\n\n\n"
        "def get_config():\n"
        "    return micro_config()\n"
    )
    return str(path)


def cli(config_file, workdir, *overrides, timeout=REFUSAL_S):
    cmd = [sys.executable, "-m", "da3po_jax.main", f"--config={config_file}"]
    cmd += [f"--workdir={workdir}", *[f"--config.{o}" for o in overrides]]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    lines = out.stderr.strip().splitlines()
    return out.returncode, lines[-1] if lines else ""


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> str:
    """A finished 2-step run of the micro config (built in process: cheap)."""
    saved, context_lib.RewardScorer = context_lib.RewardScorer, HashScorer
    try:
        workdir = str(tmp_path_factory.mktemp("finished") / "run")
        train(micro_config(), workdir)
    finally:
        context_lib.RewardScorer = saved
    return workdir


@pytest.fixture(scope="module")
def files(tmp_path_factory, finished) -> dict[str, str]:
    """Bad input files, each next to a good twin."""
    d = tmp_path_factory.mktemp("files")
    out = {}
    model = init_model(get_preset("tiny-qwen2", vocab_size=304), seed=0)
    good = save_model(model, str(d / "model"), tokenizer_dir=os.path.join(finished, "tokenizer"))
    for name in ("truncated", "badconfig", "nan", "badtok"):
        shutil.copytree(good, d / name)
    weights = d / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    (d / "badconfig" / "config.json").write_text('{"hidden_size": 16,')
    tok = d / "badtok" / "tokenizer.json"
    tok.write_text(tok.read_text()[:500])
    from da3po_jax.models.safetensors_io import SafetensorsFile, save_safetensors

    st = SafetensorsFile(str(d / "nan" / "model.safetensors"))
    tensors = {k: np.array(st.get(k)) for k in st.keys()}
    tensors["model.layers.0.mlp.up_proj.weight"][0, :3] = np.nan
    save_safetensors(str(d / "nan" / "model.safetensors"), tensors)
    rows = [{"problem": f"{i} + 1 = ?", "answer": str(i + 1)} for i in range(16)]
    (d / "ok.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "garbled.jsonl").write_text("\x00\xff garbage {{{\nnot json\n")
    (d / "columns.jsonl").write_text("".join(json.dumps({"q": 1, "a": 2}) + "\n" for _ in rows))
    (d / "corrupt.parquet").write_bytes(b"PAR1" + os.urandom(200))
    out.update({k: str(d / k) for k in ("model", "truncated", "badconfig", "nan", "badtok")})
    out.update({k: str(d / k) for k in ("ok.jsonl", "garbled.jsonl", "columns.jsonl")})
    out["corrupt.parquet"] = str(d / "corrupt.parquet")
    return out


def jsonl(path):
    return ("data.source=jsonl", f"data.train_path={path}", f"data.eval_path={path}")


# (case id, overrides built from the bad files, words the last stderr line must hold)
REFUSALS = [
    ("unknown_field", lambda f: ("train.nope=1",), "train.nope"),
    ("ill_typed_field", lambda f: ("train.steps=abc",), "abc"),
    ("prompts_per_call_0", lambda f: ("eval.prompts_per_call=0",), "eval.prompts_per_call=0"),
    ("prompts_per_call_-1", lambda f: ("eval.prompts_per_call=-1",), "eval.prompts_per_call=-1"),
    ("missing_data_file", lambda f: jsonl("/nonexistent/train.jsonl"), "/nonexistent/train.jsonl"),
    ("garbled_data_file", lambda f: jsonl(f["garbled.jsonl"]), "garbled.jsonl"),
    ("wrong_columns", lambda f: jsonl(f["columns.jsonl"]), "columns.jsonl"),
    (
        "corrupt_parquet",
        lambda f: ("data.source=parquet", f"data.train_path={f['corrupt.parquet']}"),
        "corrupt.parquet: not a valid or complete Parquet file",
    ),
    ("missing_model", lambda f: ("model.init_checkpoint=/nonexistent/model",), "/nonexistent"),
    (
        "truncated_safetensors",
        lambda f: (f"model.init_checkpoint={f['truncated']}",),
        "looks truncated or corrupt",
    ),
    (
        "bad_model_config_json",
        lambda f: (f"model.init_checkpoint={f['badconfig']}",),
        "config.json is not valid JSON",
    ),
    (
        "nan_weights",
        lambda f: (f"model.init_checkpoint={f['nan']}",),
        "tensor model.layers.0.mlp.up_proj.weight has 3 non-finite values",
    ),
    (
        "missing_tokenizer",
        lambda f: ("tokenizer.build_tiny=False", "tokenizer.path=/nonexistent/tok"),
        "/nonexistent/tok",
    ),
    (
        "truncated_tokenizer_json",
        lambda f: ("tokenizer.build_tiny=False", f"tokenizer.path={f['badtok']}"),
        "tokenizer.json is not valid JSON",
    ),
]


# Through a real process (flag parsing, exit status, no hang); every case also runs in
# process below, through the same error reporting as the CLI's (seconds less each).
CLI_CASES = (
    "unknown_field",
    "ill_typed_field",
    "prompts_per_call_0",
    "missing_data_file",
    "truncated_safetensors",
    "nan_weights",
)
FLAG_ONLY = ("unknown_field", "ill_typed_field")  # errors of the flag parser itself


def _by_id(ids):
    return [pytest.param(*c[1:], id=c[0]) for c in REFUSALS if c[0] in ids]


@pytest.mark.parametrize("overrides, words", _by_id(CLI_CASES))
def test_bad_input_is_refused_naming_it(config_file, files, tmp_path, overrides, words):
    workdir = tmp_path / "run"
    code, last = cli(config_file, workdir, *overrides(files))
    assert code == 1, last
    assert words in last, last
    assert not workdir.exists()  # nothing was created


def _value(text: str):
    try:
        return json.loads({"True": "true", "False": "false"}.get(text, text))
    except ValueError:
        return text


@pytest.mark.parametrize(
    "overrides, words", _by_id([c[0] for c in REFUSALS if c[0] not in FLAG_ONLY])
)
def test_bad_input_is_refused_in_process(files, tmp_path, capsys, overrides, words):
    from da3po_jax.runtime.signals import run_reporting_errors

    workdir = str(tmp_path / "run")
    cfg = micro_config(**{k: _value(v) for k, v in (o.split("=", 1) for o in overrides(files))})
    assert run_reporting_errors(lambda: train(cfg, workdir)) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("da3po_jax: error: ") and words in last, last
    assert not os.path.exists(workdir)


@pytest.mark.parametrize(
    "case, words",
    [
        ("incompatible_resume", "rollout.group_size: checkpoint 4 vs now 8"),
        ("checkpoints_is_a_file", "is not a folder"),
        ("workdir_is_a_file", "is not a folder"),
    ],
)
def test_a_refused_resume_changes_nothing(config_file, finished, tmp_path, case, words):
    workdir = str(tmp_path / "run")
    shutil.copytree(finished, workdir)
    overrides = ["train.steps=4"]
    if case == "incompatible_resume":
        overrides.append("rollout.group_size=8")
    elif case == "checkpoints_is_a_file":
        shutil.rmtree(os.path.join(workdir, "checkpoints"))
        with open(os.path.join(workdir, "checkpoints"), "w") as f:
            f.write("x")
    else:
        shutil.rmtree(workdir)
        with open(workdir, "w") as f:
            f.write("x")
    before = snapshot(workdir) if os.path.isdir(workdir) else open(workdir).read()
    code, last = cli(config_file, workdir, *overrides)
    assert code == 1 and words in last, last
    after = snapshot(workdir) if os.path.isdir(workdir) else open(workdir).read()
    assert after == before


def _train_steps(workdir: str) -> list[int]:
    path = os.path.join(workdir, "metrics.jsonl")
    steps = []
    if os.path.isfile(path):
        for line in open(path):
            try:
                row = json.loads(line)
            except ValueError:
                continue  # being written
            if row["kind"] == "train":
                steps.append(row["step"])
    return steps


def _wait_for_step_after(workdir: str, after: int, proc, bound: float) -> None:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline and proc.poll() is None:
        if any(s > after for s in _train_steps(workdir)):
            return
        time.sleep(0.2)
    raise AssertionError(f"the run wrote no training step after {after} in time")


def test_sigterm_saves_a_checkpoint_and_exits_0(config_file, tmp_path):
    """A real SIGTERM mid-run (SIGINT and exact resume: test_faults.py, in process)."""
    workdir = str(tmp_path / "run")
    cmd = [sys.executable, "-m", "da3po_jax.main", f"--config={config_file}"]
    cmd += [f"--workdir={workdir}", "--config.train.steps=6", "--config.train.checkpoint_every=3"]
    step = 0
    for signum, code in ((signal.SIGTERM, 0),):
        proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
        _wait_for_step_after(workdir, step, proc, TRAIN_S)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=TRAIN_S)
        last = err.strip().splitlines()[-1]
        assert proc.returncode == code, err[-3000:]
        assert f"stopped on {signal.Signals(signum).name}: checkpoint of step" in last, last
        step = int(last.split("checkpoint of step ")[1].split()[0])
        assert str(step) in os.listdir(os.path.join(workdir, "checkpoints"))
        assert step < 6  # stopped early, after the step in progress
        steps = _train_steps(workdir)
        assert steps == list(range(1, step + 1)), steps  # each step once, across the runs


def test_a_full_disk_is_named_on_the_last_line_and_nothing_hangs(config_file, tmp_path):
    """A run on a 1.2 MB filesystem: it fills up at a checkpoint or a metrics row."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", str(mnt)]
    if subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs on this machine")
    try:
        code, last = cli(config_file, mnt / "run", "train.steps=8", timeout=TRAIN_S)
        kept = sorted(os.listdir(mnt / "run" / "checkpoints"))
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
    assert code == 1, last
    assert "No space left on device" in last, last
    assert any(k.isdigit() for k in kept), kept  # the earlier checkpoints are kept
