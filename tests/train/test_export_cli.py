"""`python -m da3po_jax.export`: a run's checkpoint as a Hugging Face folder.

One micro run (2 RL steps, both checkpoints kept) is shared by every test. Its parameters
at each saved step are recorded as the trainer hands them to the checkpointer, so what
the export writes is compared with what training produced, not with a second restore.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags
from absl import logging as absl_logging
from absl.testing import flagsaver
from conftest import hf_logits, left_padded_batch
from flax import nnx
from safetensors import safe_open
from test_faults import snapshot
from test_train_smoke import HashScorer, micro_config

import da3po_jax.export as export_lib
import da3po_jax.run.context as context_lib
from da3po_jax.config import resolve_settings
from da3po_jax.models import load_model, positions_from_mask
from da3po_jax.models.tokenizer import Tokenizer
from da3po_jax.run import train
from da3po_jax.run.inputs import policy_model
from da3po_jax.runtime.checkpoint import Checkpointer
from da3po_jax.update.state import init_train_state, make_optimizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI_S = 180  # bound on one command (imports included; a hang fails the test)
# the micro run at its cheapest: no held-out eval, one prompt bucket and no packing (fewer
# programs to compile); the end of the run still exports `final_model`
CHEAP = {
    "train.eval_every": 0,
    "data.synthetic_eval": 0,
    "rollout.prompt_buckets": (64,),
    "rl.packing": False,
    "train.export_final": True,
}


def flat_params(params) -> dict[str, np.ndarray]:
    """{"layers/0/attn/q": host array} of an `nnx.State` of parameters."""
    return {
        "/".join(map(str, path)): np.asarray(jax.device_get(var.get_value()))
        for path, var in nnx.to_flat_state(params)
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> types.SimpleNamespace:
    """A finished 2-step micro run (checkpoints 1 and 2), the parameters the trainer saved
    at each step, and the initial ones."""
    saved_params: dict[int, dict[str, np.ndarray]] = {}
    original_save = Checkpointer.save

    def recording_save(self, step, tree, host):
        saved_params[step] = flat_params(tree["train"].params)
        return original_save(self, step, tree, host)

    scorer, context_lib.RewardScorer = context_lib.RewardScorer, HashScorer
    Checkpointer.save = recording_save
    try:
        workdir = str(tmp_path_factory.mktemp("export") / "run")
        config = micro_config("grpo", **CHEAP)
        train(config, workdir)
    finally:
        context_lib.RewardScorer, Checkpointer.save = scorer, original_save
    cfg = resolve_settings(config)
    tokenizer = Tokenizer.load(os.path.join(workdir, "tokenizer"))
    initial = policy_model(
        cfg.model, tokenizer, seed=cfg.seed
    )  # the run's starting point (seeded, no SFT)
    return types.SimpleNamespace(
        workdir=workdir,
        cfg=cfg,
        tokenizer=tokenizer,
        params=saved_params,
        initial=flat_params(nnx.state(initial)),
        graphdef=nnx.graphdef(initial),
    )


@pytest.fixture(autouse=True)
def restore_logging():
    """`main` configures the package logger and absl's verbosity as the CLI does; other
    tests in this process get them back as they were."""
    ours = logging.getLogger("da3po_jax")
    state = (list(ours.handlers), ours.propagate, ours.level, absl_logging.get_verbosity())
    yield
    ours.handlers[:], ours.propagate, ours.level = state[0], state[1], state[2]
    absl_logging.set_verbosity(state[3])


def run_main(capsys, **values) -> tuple[int, str, str]:
    """(exit status, stdout, last stderr line) of `export.main` with these flag values."""
    flags.FLAGS.mark_as_parsed()
    capsys.readouterr()
    with flagsaver.flagsaver(**values):
        try:
            export_lib.main(["da3po_jax.export"])
            code = 0
        except SystemExit as e:
            code = e.code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    return code, out, lines[-1] if lines else ""


def hf_matches(out: str, params, graphdef, vocab: int) -> float:
    """The largest |logit| difference between `transformers` loading `out` and our model
    with `params`, on three left-padded sequences."""
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    tokens, mask = left_padded_batch(vocab, lengths=(11, 6, 3), seed=5)
    model = nnx.merge(graphdef, params)
    ours, _ = model(jnp.asarray(tokens), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask))
    return float(np.abs(np.asarray(ours) - hf_logits(hf.float().eval(), tokens, mask))[mask].max())


def exported_params(out: str) -> dict[str, np.ndarray]:
    return flat_params(nnx.state(load_model(out)))


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


# ------------------------------------------------------------------------------ exports
def test_newest_step_exports_the_trained_policy(run, tmp_path, capsys):
    before = snapshot(run.workdir)
    out = str(tmp_path / "hf")
    code, stdout, _ = run_main(capsys, workdir=run.workdir, out=out)
    assert code == 0
    assert stdout.strip() == f"exported step 2 of {run.workdir} to {out}"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert os.path.isfile(os.path.join(out, name)), name
    got = exported_params(out)
    assert_same(got, run.params[2])
    # trained: every matrix moved away from its initial value
    assert all(not np.array_equal(got[k], run.initial[k]) for k in got if got[k].ndim > 1)
    # the end of the run exported the same step-2 policy
    assert_same(exported_params(os.path.join(run.workdir, "final_model")), got)
    params = nnx.state(load_model(out))
    assert hf_matches(out, params, run.graphdef, run.tokenizer.vocab_size) <= 1e-4
    assert snapshot(run.workdir) == before


def test_step_selects_an_older_checkpoint(run, tmp_path, capsys, monkeypatch):
    read = []  # what orbax restored: the parameters only, no optimizer state or carry
    restore_state = Checkpointer._restore_state

    def spy(self, step, args):
        read.append(restore_state(self, step, args))
        return read[-1]

    monkeypatch.setattr(Checkpointer, "_restore_state", spy)
    out = str(tmp_path / "hf1")
    code, stdout, _ = run_main(capsys, workdir=run.workdir, out=out, step=1)
    assert code == 0 and stdout.startswith("exported step 1 of ")
    assert len(read) == 1 and list(read[0]) == ["train"] and list(read[0]["train"]) == ["params"]
    assert len(jax.tree.leaves(read[0])) == len(run.params[1])
    got = exported_params(out)
    assert_same(got, run.params[1])
    assert any(not np.array_equal(got[k], run.params[2][k]) for k in got)
    assert any(not np.array_equal(got[k], run.initial[k]) for k in got)


def test_overwrite_replaces_a_non_empty_out(run, tmp_path, capsys):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    code, _, last = run_main(capsys, workdir=run.workdir, out=str(out))
    assert code == 1
    assert last == (
        f"da3po_jax: error: SavedRunError: --out {str(out)!r} exists and is not empty; "
        "pass --overwrite to replace it (nothing was changed)"
    )
    assert os.listdir(out) == ["keep.txt"] and (out / "keep.txt").read_text() == "precious"
    code, _, _ = run_main(capsys, workdir=run.workdir, out=str(out), step=1, overwrite=True)
    assert code == 0 and not (out / "keep.txt").exists()
    assert_same(exported_params(str(out)), run.params[1])


def test_scan_layers_checkpoint_exports_per_layer_weights(run, tmp_path, capsys):
    """A run with `model.scan_layers=True` checkpoints stacked [layers, ...] parameters;
    the export writes HF's per-layer tensors. The checkpoint is written as the trainer
    writes one (`init_train_state`, `Checkpointer.save` of {"train", "carry"})."""
    workdir = tmp_path / "scan"
    workdir.mkdir()
    config = micro_config("grpo", **{"model.scan_layers": True})
    cfg = resolve_settings(config)
    (workdir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, default=str))
    shutil.copytree(os.path.join(run.workdir, "tokenizer"), workdir / "tokenizer")
    model = policy_model(cfg.model, run.tokenizer, seed=11)
    assert nnx.state(model)["layers"]["attn"]["q"].shape[0] == model.config.num_layers
    tx, _ = make_optimizer(cfg.optim, 2)
    graphdef, state = init_train_state(model, tx, cfg.seed)
    checkpointer = Checkpointer(str(workdir))
    checkpointer.save(3, {"train": state, "carry": {"x": jnp.ones(4)}}, {"data": {}})
    checkpointer.close()
    out = str(tmp_path / "hf_scan")
    code, stdout, _ = run_main(capsys, workdir=str(workdir), out=out)
    assert code == 0 and stdout.startswith("exported step 3 of ")
    with safe_open(os.path.join(out, "model.safetensors"), "np") as f:
        names = set(f.keys())
    assert {f"model.layers.{i}.self_attn.q_proj.weight" for i in (0, 1)} <= names
    assert not any("layers.self_attn" in n for n in names)  # no stacked tensor left
    assert hf_matches(out, state.params, graphdef, run.tokenizer.vocab_size) <= 1e-4


# ------------------------------------------------------------------------------ refusals
def test_missing_workdir_or_config_is_refused(tmp_path, capsys):
    missing, out = str(tmp_path / "nowhere"), str(tmp_path / "out")
    code, _, last = run_main(capsys, workdir=missing, out=out)
    assert code == 1
    assert last == (
        f"da3po_jax: error: SavedRunError: --workdir {missing!r} does not exist or is not a folder"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, last = run_main(capsys, workdir=str(empty), out=out)
    assert code == 1
    config = os.path.join(str(empty), "config.json")
    assert last.endswith(f"{config!r} not found: --workdir must be a training run's folder")
    assert not os.path.exists(missing) and not os.path.exists(out)
    assert os.listdir(empty) == []


@pytest.mark.parametrize("with_folder", [False, True])
def test_run_without_checkpoints_is_refused(run, tmp_path, capsys, with_folder):
    workdir = tmp_path / "fresh"
    workdir.mkdir()
    shutil.copy(os.path.join(run.workdir, "config.json"), workdir)
    shutil.copytree(os.path.join(run.workdir, "tokenizer"), workdir / "tokenizer")
    if with_folder:
        (workdir / "checkpoints").mkdir()
    before = snapshot(workdir)
    entries = sorted(os.listdir(workdir))
    out = str(tmp_path / "out")
    code, _, last = run_main(capsys, workdir=str(workdir), out=out)
    assert code == 1
    if with_folder:
        checkpoints = os.path.join(str(workdir), "checkpoints")
        assert last.endswith(f"no checkpoints in {checkpoints!r}: the run saved none yet")
    else:
        assert last.endswith(f"no checkpoints in {str(workdir)!r} (no checkpoints/ folder)")
    assert snapshot(workdir) == before and sorted(os.listdir(workdir)) == entries
    assert not os.path.exists(out)


def test_absent_step_is_refused_with_the_kept_steps(run, tmp_path, capsys):
    before, out = snapshot(run.workdir), str(tmp_path / "out")
    code, _, last = run_main(capsys, workdir=run.workdir, out=out, step=7)
    assert code == 1
    checkpoints = os.path.join(run.workdir, "checkpoints")
    assert last == (
        f"da3po_jax: error: SavedRunError: --step=7 is not in {checkpoints!r}; "
        "the steps kept are 1, 2"
    )
    assert snapshot(run.workdir) == before and not os.path.exists(out)


def test_out_holding_the_run_is_refused_even_with_overwrite(run, capsys):
    before = snapshot(run.workdir)
    parent = os.path.dirname(run.workdir)
    code, _, last = run_main(capsys, workdir=run.workdir, out=parent, overwrite=True)
    assert code == 1
    assert last.endswith(f"--out {parent!r} holds the run being read (nothing was changed)")
    assert snapshot(run.workdir) == before


def swap_state(workdir: str) -> tuple[str, ...]:
    """Step 2's arrays replaced by step 1's: every file reads, the digests do not match.
    Returns the messages that may report it."""
    step_dir = os.path.join(workdir, "checkpoints", "2")
    shutil.rmtree(os.path.join(step_dir, "state"))
    shutil.copytree(os.path.join(workdir, "checkpoints", "1", "state"), f"{step_dir}/state")
    return (f"{step_dir!r} is corrupt: ",)


def flip_all(workdir: str) -> tuple[str, ...]:
    """One byte in every 512 flipped in every data file of step 2: every array of more
    than a few hundred bytes (the policy's matrices among them) is hit, wherever the
    writer placed it: unreadable, or read into values that fail the digest."""
    step_dir = os.path.join(workdir, "checkpoints", "2")
    data = os.path.join(step_dir, "state", "ocdbt.process_0", "d")
    for name in os.listdir(data):
        with open(os.path.join(data, name), "r+b") as f:
            raw = bytearray(f.read())
            for i in range(256, len(raw), 512):
                raw[i] ^= 0xFF
            f.seek(0)
            f.write(raw)
    return (f"cannot restore {step_dir!r} into this run (", f"{step_dir!r} is corrupt: ")


@pytest.mark.parametrize("damage", [swap_state, flip_all])
def test_damaged_checkpoint_is_reported_and_nothing_moves(run, tmp_path, capsys, damage):
    workdir = str(tmp_path / "run")
    shutil.copytree(run.workdir, workdir)
    messages = damage(workdir)
    before, out = snapshot(workdir), str(tmp_path / "out")
    code, _, last = run_main(capsys, workdir=workdir, out=out)
    assert code == 1
    prefix = "da3po_jax: error: DamagedCheckpoint: "
    assert any(last.startswith(prefix + m) for m in messages), last
    assert snapshot(workdir) == before and not os.path.exists(out)
    assert not os.path.exists(os.path.join(workdir, "checkpoints.damaged"))
    if damage is swap_state:  # the intact older step still exports
        code, _, _ = run_main(capsys, workdir=workdir, out=out, step=1)
        assert code == 0
        assert_same(exported_params(out), run.params[1])


# ----------------------------------------------------------------------- command line
def cli(*args: str) -> tuple[int, str, str]:
    cmd = [sys.executable, "-m", "da3po_jax.export", *args]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=CLI_S)
    lines = done.stderr.strip().splitlines()
    return done.returncode, done.stdout, lines[-1] if lines else ""


def test_command_line_exit_status_and_messages(run, tmp_path):
    out = str(tmp_path / "cli")
    code, stdout, _ = cli(f"--workdir={run.workdir}", f"--out={out}", "--step=1")
    assert code == 0, stdout
    assert stdout.strip() == f"exported step 1 of {run.workdir} to {out}"
    assert_same(exported_params(out), run.params[1])
    code, _, last = cli(f"--workdir={run.workdir}", f"--out={out}")
    assert code == 1
    assert last == (
        f"da3po_jax: error: SavedRunError: --out {out!r} exists and is not empty; "
        "pass --overwrite to replace it (nothing was changed)"
    )
    assert_same(exported_params(out), run.params[1])  # the refused run left it as it was
