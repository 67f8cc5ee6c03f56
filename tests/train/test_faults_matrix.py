"""The fault / bad-input matrix: bad config, data, model files, checkpoints and workdirs
through the commands (`main`, `export`, `eval`, `sample`, `plan`). Every row asserts the
exit status, that the last stderr line names the problem (field, file, row or flag), and
that the files it touches are byte-identical afterwards (a fresh workdir is never
created). Rows marked `cli` run a real process (flag parsing, exit status, no hang: every
process has a time bound); the others call the command's library function through the
same error reporting as the command (`run_reporting_errors`), which saves seconds a row.
Refusals stop before any compile, so one finished run serves every row.

Beside the matrix: a real SIGTERM in the RL loop and in the SFT warm start, a lock left
by a killed process, and a full disk.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import pytest
from test_faults import flip_bytes, snapshot
from test_train_smoke import HashScorer, micro_config

import da3po_jax.run.context as context_lib
from da3po_jax.models import get_preset, init_model, save_model
from da3po_jax.run import train
from da3po_jax.runtime.signals import run_reporting_errors
from da3po_jax.runtime.workdir_lock import LOCK_NAME, WorkdirLock

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
REFUSAL_S = 120  # bound on a refused run (imports included; a hang fails the test)
TRAIN_S = 600


@pytest.fixture(autouse=True)
def hash_scorer(monkeypatch):
    monkeypatch.setattr(context_lib, "RewardScorer", HashScorer)


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
    for name in ("truncated", "badconfig", "nan", "badtok", "noweights"):
        shutil.copytree(good, d / name)
    weights = d / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    (d / "badconfig" / "config.json").write_text('{"hidden_size": 16,')
    (d / "noweights" / "model.safetensors").unlink()
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
    (d / "empty.jsonl").write_text("")
    (d / "data.csv").write_text("problem,answer\n1+1,2\n")
    (d / "corrupt.parquet").write_bytes(b"PAR1" + os.urandom(200))
    os.mkfifo(d / "fifo.jsonl")
    (d / "nodata").mkdir()
    (d / "nodata" / "notes.txt").write_text("no dataset here\n")
    (d / "a_file").write_text("x")
    (d / "noget.py").write_text("STEPS = 3  # a config file without get_config()\n")
    (d / "full").mkdir()
    (d / "full" / "keep.txt").write_text("keep me\n")
    for name in ("model", "truncated", "badconfig", "nan", "badtok", "noweights", "nodata"):
        out[name] = str(d / name)
    for name in ("ok.jsonl", "garbled.jsonl", "columns.jsonl", "empty.jsonl", "data.csv"):
        out[name] = str(d / name)
    for name in ("corrupt.parquet", "fifo.jsonl", "a_file", "full", "noget.py"):
        out[name] = str(d / name)
    return out


# ----------------------------------------------------------------------------- the rows
@dataclasses.dataclass(frozen=True)
class Env:
    """What a row's arguments are built from."""

    files: dict[str, str]
    run: str  # the row's run folder: a copy of the finished run, or a fresh path
    config_file: str
    tmp: str


@dataclasses.dataclass(frozen=True)
class Row:
    """One bad input: `cmd` is main / export / eval / sample / plan; `args(env)` gives the
    flags (`cli`) or the library call's arguments (main: config overrides); `words` must
    be in the last stderr line; `run` is "new" (a fresh workdir, which must stay absent)
    or "copy" (a copy of the finished run, after `prepare(run)`, byte-identical after)."""

    id: str
    cmd: str
    args: Callable[[Env], object]
    words: str | tuple[str, ...]
    run: str = "new"
    cli: bool = False
    prepare: Callable[[str], None] | None = None
    env: dict[str, str] | None = None


def jsonl(path: str) -> dict:
    return {"data.source": "jsonl", "data.train_path": path, "data.eval_path": path}


def _write(relpath: str, data: bytes | None):
    """prepare(run): replaces `relpath` by a file with `data` (None: by a folder)."""

    def prepare(run: str) -> None:
        path = os.path.join(run, relpath)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
        if data is None:
            os.makedirs(path)
        else:
            with open(path, "wb") as f:
                f.write(data)

    return prepare


def _metrics_line(line: bytes):
    """prepare(run): inserts `line` before the last row of metrics.jsonl."""

    def prepare(run: str) -> None:
        path = os.path.join(run, "metrics.jsonl")
        lines = open(path, "rb").read().splitlines(keepends=True)
        open(path, "wb").write(b"".join([*lines[:-1], line + b"\n", lines[-1]]))

    return prepare


def _damage_all(run: str) -> None:
    for step in os.listdir(os.path.join(run, "checkpoints")):
        flip_bytes(os.path.join(run, "checkpoints", step))


def _run_is_a_file(run: str) -> None:
    shutil.rmtree(run)
    with open(run, "w") as f:
        f.write("x")


def _hold_lock(run: str) -> None:
    """prepare(run): this test process holds the run's lock (released after the row)."""
    HELD.append(WorkdirLock(run))
    HELD[-1].acquire()


def _export(e: Env, out: str, *more: str) -> list[str]:
    return [f"--workdir={e.run}", f"--out={out}", *more]


HELD: list[WorkdirLock] = []  # locks a row's `prepare` took (released after the row)
M, X, V, S, P = "main", "export", "eval", "sample", "plan"
TEACHER_MISSING = {"algo": "opd", "teacher.path": "/nonexistent/teacher"}
ROWS = [
    # ------------------------------------------------------------------ config (main)
    Row("unknown_field", M, lambda e: ["train.nope=1"], "--config.train.nope", cli=True),
    Row(
        "misspelt_field",
        M,
        lambda e: ["rollout.group_size=4", "train.stpes=3"],
        ("--config.train.stpes: config.train has no field 'stpes'", "did you mean 'steps'"),
        cli=True,
    ),
    Row(
        "misspelt_section",
        M,
        lambda e: ["trian.steps=3"],
        "--config.trian.steps: config has no field 'trian' (did you mean 'train'?)",
        cli=True,
    ),
    Row("ill_typed_field", M, lambda e: ["train.steps=abc"], "abc", cli=True),
    Row(
        "config_without_get_config",
        M,
        lambda e: {"--config": e.files["noget.py"]},
        "defines no get_config()",
        cli=True,
    ),
    Row(
        "missing_config_file",
        M,
        lambda e: {"--config": "/nonexistent/config.py"},
        "--config=/nonexistent/config.py: no such config file",
        cli=True,
    ),
    Row("empty_workdir_flag", M, lambda e: {"--workdir": ""}, "--workdir is empty", cli=True),
    Row("group_size_1", M, lambda e: {"rollout.group_size": 1}, "config.rollout.group_size=1"),
    Row("unknown_algo", M, lambda e: {"algo": "ppo"}, "algo"),
    Row("prompts_per_call_0", M, lambda e: {"eval.prompts_per_call": 0}, "prompts_per_call=0"),
    Row(
        "mini_batch_not_dividing",
        M,
        lambda e: {"rl.mini_batch_prompts": 3},
        "config.rl.mini_batch_prompts=3 must divide",
    ),
    Row("ds_max_prompts_small", M, lambda e: {"ds.max_prompts": 2}, "config.ds.max_prompts=2"),
    Row("overlong_buffer", M, lambda e: {"overlong.buffer": 100}, "config.overlong.buffer=100"),
    Row("mesh_two_axes", M, lambda e: {"mesh.shape": (1, 1)}, "config.mesh.shape=(1, 1)"),
    Row("eps_low", M, lambda e: {"loss.eps_low": 1.5}, "config.loss.eps_low=1.5"),
    Row(
        "staleness_static",
        M,
        lambda e: {"rollout.max_staleness": 1},
        "config.rollout.max_staleness=1 needs a slot engine",
    ),
    Row("lambda_max", M, lambda e: {"daa.lambda_max": 0.5}, "config.daa.lambda_max=0.5"),
    Row("daa_factor", M, lambda e: {"daa.factor": 0.5}, "config.daa.factor=0.5 must be >= 1"),
    Row(
        "response_past_the_context",
        M,
        lambda e: {"rollout.max_new_tokens": 1000},
        ("config.rollout.max_new_tokens=1000 after the", "max_position_embeddings=1024"),
    ),
    Row(
        "eval_past_the_context",
        M,
        lambda e: {"eval.max_new_tokens": 1000},
        ("config.eval.max_new_tokens=1000 after the", "held-out prompts"),
    ),
    Row("unknown_preset", M, lambda e: {"model.preset": "gpt-9"}, "config.model.preset='gpt-9'"),
    Row("negative_lr", M, lambda e: {"optim.lr": -1.0}, "config.optim.lr=-1.0"),
    Row("reward_order", M, lambda e: {"reward.correct": -1.0}, "config.reward.correct=-1.0"),
    Row("no_train_path", M, lambda e: {"data.source": "jsonl"}, "config.data.train_path"),
    Row("tfds_no_name", M, lambda e: {"data.source": "tfds"}, "config.data.tfds_name"),
    # ------------------------------------------------------------------- data (main)
    Row(
        "missing_data_file",
        M,
        lambda e: jsonl("/nonexistent/train.jsonl"),
        "/nonexistent/train.jsonl",
        cli=True,
    ),
    Row("garbled_data_file", M, lambda e: jsonl(e.files["garbled.jsonl"]), "garbled.jsonl"),
    Row("wrong_columns", M, lambda e: jsonl(e.files["columns.jsonl"]), "columns.jsonl"),
    Row("empty_data_file", M, lambda e: jsonl(e.files["empty.jsonl"]), "empty.jsonl: no usable"),
    Row(
        "unsupported_extension",
        M,
        lambda e: jsonl(e.files["data.csv"]),
        "data.csv: unsupported extension '.csv'",
    ),
    Row(
        "corrupt_parquet",
        M,
        lambda e: {"data.source": "parquet", "data.train_path": e.files["corrupt.parquet"]},
        "corrupt.parquet: not a valid or complete Parquet file",
    ),
    Row(
        "fifo_data_file",
        M,
        lambda e: jsonl(e.files["fifo.jsonl"]),
        "fifo.jsonl' is a FIFO (named pipe), not a regular file",
    ),
    Row(
        "folder_without_data",
        M,
        lambda e: jsonl(e.files["nodata"]),
        ("no dataset files match", "nodata"),
    ),
    Row(
        "missing_eval_file",
        M,
        lambda e: jsonl(e.files["ok.jsonl"]) | {"data.eval_path": "/nonexistent/eval.jsonl"},
        "/nonexistent/eval.jsonl",
    ),
    Row(
        "every_prompt_too_long",
        M,
        lambda e: {"rollout.prompt_buckets": (4,)},
        ("every one of the 64 train prompts is longer than", "4 tokens", "synthetic row"),
    ),
    # ------------------------------------------------------------ model files (main)
    Row(
        "missing_model",
        M,
        lambda e: {"model.init_checkpoint": "/nonexistent/model"},
        "/nonexistent",
    ),
    Row(
        "truncated_safetensors",
        M,
        lambda e: {"model.init_checkpoint": e.files["truncated"]},
        "looks truncated or corrupt",
        cli=True,
    ),
    Row(
        "bad_model_config_json",
        M,
        lambda e: {"model.init_checkpoint": e.files["badconfig"]},
        "config.json is not valid JSON",
    ),
    Row(
        "nan_weights",
        M,
        lambda e: {"model.init_checkpoint": e.files["nan"]},
        "tensor model.layers.0.mlp.up_proj.weight has 3 non-finite values",
    ),
    Row(
        "no_weight_files",
        M,
        lambda e: {"model.init_checkpoint": e.files["noweights"]},
        "noweights",
    ),
    Row(
        "missing_tokenizer",
        M,
        lambda e: {"tokenizer.build_tiny": False, "tokenizer.path": "/nonexistent/tok"},
        "/nonexistent/tok",
    ),
    Row(
        "truncated_tokenizer_json",
        M,
        lambda e: {"tokenizer.build_tiny": False, "tokenizer.path": e.files["badtok"]},
        "tokenizer.json is not valid JSON",
    ),
    Row(
        "opd_teacher_missing",
        M,
        lambda e: TEACHER_MISSING,
        "config.teacher.path='/nonexistent/teacher' does not exist",
    ),
    Row(
        "refused_run_keeps_config_json",
        M,
        lambda e: TEACHER_MISSING,
        "config.teacher.path='/nonexistent/teacher' does not exist",
        "copy",
        prepare=lambda run: shutil.rmtree(os.path.join(run, "checkpoints")),
    ),
    Row(
        "opd_teacher_without_model",
        M,
        lambda e: TEACHER_MISSING | {"teacher.path": e.files["nodata"]},
        "nodata' holds no config.json",
    ),
    # ---------------------------------------------------------------- devices (main)
    Row(
        "mesh_over_devices",
        M,
        lambda e: {"mesh.shape": (2, 1, 1)},
        "mesh.shape=(2, 1, 1)",
    ),
    Row(
        "slots_vs_devices",
        M,
        lambda e: ["rollout.engine=continuous", "rollout.slots=12"],
        "config.rollout.slots=12 must be a multiple of the 8 devices",
        cli=True,
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"},
    ),
    Row(
        "pack_rows_vs_devices",
        M,
        lambda e: ["rl.packing=True", "rl.pack_rows=3"],
        "config.rl.pack_rows=3 must be a multiple of the 8 devices",
        cli=True,
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"},
    ),
    # ------------------------------------------------- workdir and checkpoints (main)
    Row("workdir_is_a_file", M, lambda e: {}, "is not a folder", "copy", prepare=_run_is_a_file),
    Row(
        "checkpoints_is_a_file",
        M,
        lambda e: {"train.steps": 4},
        "checkpoints",
        "copy",
        prepare=_write("checkpoints", b"x"),
    ),
    Row(
        "metrics_is_a_folder",
        M,
        lambda e: {"train.steps": 4},
        "metrics.jsonl' is a folder",
        "copy",
        prepare=_write("metrics.jsonl", None),
    ),
    Row(
        "incompatible_resume",
        M,
        lambda e: ["train.steps=4", "rollout.group_size=8"],
        "rollout.group_size: checkpoint 4 vs now 8",
        "copy",
        cli=True,
    ),
    Row(
        "other_training_data",
        M,
        lambda e: {"train.steps": 4, "data.synthetic_train": 48},
        ("was written for other training data", "now 48 prompts"),
        "copy",
    ),
    Row(
        "malformed_metrics_row",
        M,
        lambda e: {"train.steps": 4},
        ("metrics.jsonl: line", "is not a metrics row"),
        "copy",
        prepare=_metrics_line(b'{"no": "step"}'),
    ),
    Row(
        "non_utf8_metrics_row",
        M,
        lambda e: {"train.steps": 4},
        ("metrics.jsonl: line", "utf-8"),
        "copy",
        prepare=_metrics_line(b'{"step": 1, "kind": "\xff\xfe"}'),
    ),
    Row(
        "every_checkpoint_damaged",
        M,
        lambda e: {"train.steps": 4},
        ("no checkpoint in", "restores"),
        "copy",
        prepare=_damage_all,
    ),
    Row(
        "workdir_locked",
        M,
        lambda e: ["train.steps=4"],
        ("is in use by another run", f"pid {os.getpid()}"),
        "copy",
        cli=True,
        prepare=_hold_lock,
    ),
    Row(
        "workdir_locked_in_process",
        M,
        lambda e: {"train.steps": 4},
        ("is in use by another run", f"pid {os.getpid()}"),
        "copy",
        prepare=_hold_lock,
    ),
    # ---------------------------------------------------------------------- export
    Row(
        "export_over_checkpoints",
        X,
        lambda e: _export(e, os.path.join(e.run, "checkpoints"), "--overwrite"),
        "checkpoints' is inside the training run",
        "copy",
        cli=True,
    ),
    Row(
        "export_over_final_model",
        X,
        lambda e: _export(e, os.path.join(e.run, "final_model"), "--overwrite"),
        "final_model' is inside the training run",
        "copy",
    ),
    Row(
        "export_into_new_folder_of_run",
        X,
        lambda e: _export(e, os.path.join(e.run, "exported")),
        "exported' is inside the training run",
        "copy",
    ),
    Row(
        "export_onto_run",
        X,
        lambda e: _export(e, e.run, "--overwrite"),
        "holds the run being read",
        "copy",
    ),
    Row(
        "export_onto_parent",
        X,
        lambda e: _export(e, os.path.dirname(e.run), "--overwrite"),
        "holds the run being read",
        "copy",
    ),
    Row(
        "export_out_is_file",
        X,
        lambda e: _export(e, e.files["a_file"]),
        "a_file' exists and is not a folder",
        "copy",
    ),
    Row(
        "export_out_not_empty",
        X,
        lambda e: _export(e, e.files["full"]),
        "full' exists and is not empty; pass --overwrite",
        "copy",
    ),
    Row(
        "export_missing_step",
        X,
        lambda e: _export(e, os.path.join(e.tmp, "out"), "--step=99"),
        ("SavedRunError: --step=99 is not in", "the steps kept are 1, 2"),
        "copy",
    ),
    Row(
        "export_missing_workdir",
        X,
        lambda e: [f"--workdir={e.tmp}/none", f"--out={e.tmp}/out"],
        "none' does not exist or is not a folder",
    ),
    Row(
        "export_workdir_without_config",
        X,
        lambda e: [f"--workdir={e.files['nodata']}", f"--out={e.tmp}/out"],
        "config.json' not found",
    ),
    Row(
        "export_empty_workdir_flag",
        X,
        lambda e: ["--workdir=", f"--out={e.tmp}/out"],
        "--workdir is empty",
        cli=True,
    ),
    # ------------------------------------------------------------------------ eval
    Row(
        "eval_missing_checkpoint",
        V,
        lambda e: [f"--checkpoint={e.tmp}/none"],
        "none' does not exist or is not a folder",
    ),
    Row(
        "eval_missing_step",
        V,
        lambda e: [f"--checkpoint={e.run}/checkpoints/99"],
        ("--step=99 is not in", "the steps kept are 1, 2"),
        "copy",
        cli=True,
    ),
    Row(
        "eval_out_inside_run",
        V,
        lambda e: [f"--checkpoint={e.run}", f"--out={e.run}/checkpoints", "--overwrite"],
        "checkpoints' is inside the training run",
        "copy",
    ),
    Row(
        "eval_unknown_group_field",
        V,
        lambda e: [f"--checkpoint={e.run}", "--group_by=colour"],
        "eval.group_by='colour': no problem has that field",
        "copy",
    ),
    Row(
        "eval_folder_without_config",
        V,
        lambda e: [f"--checkpoint={e.files['model']}"],
        "--config is required",
    ),
    Row("eval_empty_checkpoint_flag", V, lambda e: ["--checkpoint="], "--checkpoint is empty"),
    # ---------------------------------------------------------------------- sample
    Row(
        "sample_too_many_new_tokens",
        S,
        lambda e: [f"--model={e.files['model']}", "--prompt=hi", "--max_new_tokens=100000000"],
        ("--max_new_tokens=100000000", "max_position_embeddings"),
        cli=True,
    ),
    Row(
        "sample_missing_model",
        S,
        lambda e: [f"--model={e.tmp}/none", "--prompt=hi"],
        "none' does not exist",
        cli=True,
    ),
    # ------------------------------------------------------------------------ plan
    Row(
        "plan_negative_prompt_len",
        P,
        lambda e: ["--config=configs/tiny_math.py", "--prompt_len=-100"],
        "--prompt_len=-100: must be >= 0",
        cli=True,
    ),
    Row(
        "plan_usable_above_1",
        P,
        lambda e: ["--config=configs/tiny_math.py", "--usable=7"],
        "--usable=7.0: must be in (0, 1]",
        cli=True,
    ),
]


def _value(v):
    """A config override's text as the CLI takes it."""
    return str(v) if not isinstance(v, tuple) else ",".join(map(str, v))


def _cli(row: Row, env: Env) -> tuple[int, str]:
    args = row.args(env)
    module = {M: "main", X: "export", V: "eval", S: "sample", P: "plan"}[row.cmd]
    cmd = [sys.executable, "-m", f"da3po_jax.{module}"]
    if row.cmd == M:
        flags = {"--config": env.config_file, "--workdir": env.run}
        if isinstance(args, dict) and any(k.startswith("--") for k in args):
            flags |= args
            args = []
        cmd += [f"{k}={v}" for k, v in flags.items()]
        overrides = args.items() if isinstance(args, dict) else (a.split("=", 1) for a in args)
        cmd += [f"--config.{k}={_value(v)}" for k, v in overrides]
    else:
        cmd += list(args)
    proc_env = dict(os.environ, **(row.env or {}))
    out = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=REFUSAL_S, env=proc_env
    )
    lines = out.stderr.strip().splitlines()
    return out.returncode, lines[-1] if lines else ""


def _in_process(row: Row, env: Env, capsys) -> tuple[int, str]:
    args = row.args(env)
    if row.cmd == M:
        cfg = micro_config(**args)
        fn = lambda: train(cfg, env.run)  # noqa: E731
    else:
        flags = dict(a.removeprefix("--").split("=", 1) for a in args if "=" in a)
        bools = {a.removeprefix("--") for a in args if "=" not in a}
        if row.cmd == X:
            from da3po_jax.export import export_checkpoint

            step = int(flags["step"]) if "step" in flags else None
            fn = lambda: export_checkpoint(  # noqa: E731
                flags["workdir"], flags["out"], step, overwrite="overwrite" in bools
            )
        else:
            from da3po_jax.eval import run_eval

            fn = lambda: run_eval(  # noqa: E731
                None,
                flags["checkpoint"],
                flags.get("out", ""),
                group_by=flags.get("group_by"),
                overwrite="overwrite" in bools,
            )
    capsys.readouterr()
    code = run_reporting_errors(fn)
    lines = capsys.readouterr().err.strip().splitlines()
    return code, lines[-1] if lines else ""


def _state(path: str):
    if os.path.isdir(path):
        return snapshot(path)
    return open(path, "rb").read() if os.path.exists(path) else None


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS])
def test_bad_input_is_refused_naming_it(row, finished, files, config_file, tmp_path, capsys):
    run = str(tmp_path / "run")
    if row.run == "copy":
        shutil.copytree(finished, run)
        if row.prepare is not None:
            row.prepare(run)
    env = Env(files, run, config_file, str(tmp_path))
    watched = [run, *(files[k] for k in ("full", "a_file", "model"))]
    before = [_state(p) for p in watched]
    try:
        code, last = _cli(row, env) if row.cli else _in_process(row, env, capsys)
        after = [_state(p) for p in watched]  # before a lock the row holds is released
    finally:
        while HELD:
            HELD.pop().release()
    assert code == 1, last
    words = (row.words,) if isinstance(row.words, str) else row.words
    for w in words:
        assert w in last, (w, last)
    if row.cmd in (M, X, V):
        assert last.startswith(("da3po_jax: error: ", "FATAL Flags parsing error")), last
    assert after == before  # byte-identical; a fresh workdir was not created
    if row.run == "new":
        assert not os.path.exists(run)


def test_the_matrix_covers_every_command_and_kind():
    assert len(ROWS) >= 60 and len({r.id for r in ROWS}) == len(ROWS)
    assert {r.cmd for r in ROWS if r.cli} == {M, X, V, S, P}


def test_over_long_prompts_are_skipped_counted_and_named(finished, tmp_path, caplog):
    """Prompts longer than the largest bucket are dropped like malformed rows (the first
    few named by file and row); the run goes on with the rest."""
    from da3po_jax.data import load_problems
    from da3po_jax.models.tokenizer import Tokenizer
    from da3po_jax.rollout import PromptEncoder
    from da3po_jax.run.inputs import Datasets
    from da3po_jax.run.validate import usable_prompts

    rows = [{"problem": f"{i} + 1 = ?", "answer": str(i + 1)} for i in range(10)]
    for i in (2, 5, 6, 7, 8, 9, 3):
        rows[i]["problem"] = " + ".join(["1"] * 60) + " = ?"
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    problems = load_problems(str(path)).problems
    s = _settings(**jsonl(str(path)))
    tokenizer = Tokenizer.load(os.path.join(finished, "tokenizer"))
    encoder = PromptEncoder(tokenizer, lambda p: p.prompt, s.rollout.buckets)
    assert len(encoder.ids(problems[2])) > max(s.rollout.buckets)
    with caplog.at_level("WARNING", logger="da3po_jax"):
        data = usable_prompts(Datasets(problems, problems[:4], []), encoder)
    assert [p.id for p in data.train] == ["mixed.jsonl:0", "mixed.jsonl:1", "mixed.jsonl:4"]
    assert [p.id for p in data.heldout] == ["mixed.jsonl:0", "mixed.jsonl:1"]
    train_line = next(r.message for r in caplog.records if r.message.startswith("train data"))
    assert "skipped 7 of 10 prompts longer than the largest prompt bucket" in train_line
    named = [f"mixed.jsonl row 'mixed.jsonl:{i}'" for i in (2, 3, 5, 6, 7)]  # the first five
    assert all(n in train_line for n in named) and train_line.endswith(", ..."), train_line
    assert "mixed.jsonl:8" not in train_line
    held_line = next(r.message for r in caplog.records if r.message.startswith("heldout data"))
    assert "skipped 2 of 4 prompts" in held_line


def _settings(**overrides):
    from da3po_jax.config import resolve_settings

    return resolve_settings(micro_config(**overrides))


def test_an_empty_workdir_is_refused_in_process(tmp_path, monkeypatch):
    """`train(config, "")` would otherwise train in the current folder."""
    monkeypatch.chdir(tmp_path)
    assert run_reporting_errors(lambda: train(micro_config(), "")) == 1
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- the workdir's lock
def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path, caplog):
    """kill -9 leaves run.lock naming its holder; the next run takes it, saying so."""
    workdir = str(tmp_path / "run")
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from da3po_jax.runtime.workdir_lock import WorkdirLock\n"
            f"WorkdirLock({workdir!r}).acquire()\n"
            "print('locked', flush=True)\n"
            "time.sleep(600)\n",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "locked"
        from da3po_jax.runtime.workdir_lock import WorkdirBusy

        with pytest.raises(WorkdirBusy, match=f"pid {child.pid}"):
            WorkdirLock(workdir).acquire()
    finally:
        child.kill()
        child.wait(timeout=30)
    holder = json.loads(open(os.path.join(workdir, LOCK_NAME)).read())
    assert holder["pid"] == child.pid  # the killed process's record is still there
    with caplog.at_level("WARNING", logger="da3po_jax"), WorkdirLock(workdir):
        mine = json.loads(open(os.path.join(workdir, LOCK_NAME)).read())
    assert f"took over the lock of {workdir}" in caplog.text and f"pid {child.pid}" in caplog.text
    assert mine["pid"] == os.getpid()
    assert open(os.path.join(workdir, LOCK_NAME)).read() == ""  # released cleanly


# ------------------------------------------------------------------- signals, disk
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
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    _wait_for_step_after(workdir, 0, proc, TRAIN_S)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=TRAIN_S)
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 0, err[-3000:]
    assert "stopped on SIGTERM: checkpoint of step" in last, last
    step = int(last.split("checkpoint of step ")[1].split()[0])
    assert str(step) in os.listdir(os.path.join(workdir, "checkpoints"))
    assert step < 6  # stopped early, after the step in progress
    assert _train_steps(workdir) == list(range(1, step + 1))
    assert open(os.path.join(workdir, LOCK_NAME)).read() == ""  # the lock was released


def test_sigterm_during_the_sft_warm_start_exits_nonzero_saying_nothing_was_saved(
    config_file, tmp_path
):
    workdir = str(tmp_path / "run")
    cmd = [sys.executable, "-m", "da3po_jax.main", f"--config={config_file}"]
    cmd += [f"--workdir={workdir}", "--config.sft.enable=True", "--config.sft.steps=100000"]
    cmd += ["--config.sft.stop_acc=0", "--config.sft.batch_size=4"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:  # the warm start's first lines: its progress bar has begun
        seen.append(line)
        if "warm start:" in line:
            break
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=TRAIN_S)
    last = err.strip().splitlines()[-1] if err.strip() else "".join(seen[-1:])
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "stopped on SIGTERM: nothing was saved: the SFT warm start is not" in last, last
    assert not os.path.exists(os.path.join(workdir, "sft_model"))


def test_a_full_disk_is_named_on_the_last_line_and_nothing_hangs(config_file, tmp_path):
    """A run on a 1.2 MB filesystem: it fills up at a checkpoint or a metrics row."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", str(mnt)]
    if subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs on this machine")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "da3po_jax.main", f"--config={config_file}"]
            + [f"--workdir={mnt / 'run'}", "--config.train.steps=8"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=TRAIN_S,
        )
        kept = sorted(os.listdir(mnt / "run" / "checkpoints"))
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1, last
    assert "No space left on device" in last, last
    assert any(k.isdigit() for k in kept), kept  # the earlier checkpoints are kept
