"""Faults and bad input, in process (the CLI's exit statuses and hangs: test_faults_matrix.py).

Each case checks what the run does (error text or recovery) and what it leaves in the
workdir: a refused run changes nothing; a recovered one loses nothing that was saved.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal

import jax
import numpy as np
import pytest
from test_train_smoke import HashScorer, micro_config, read_rows

import da3po_jax.run.context as context_lib
from da3po_jax.rewards.scorer import BatchScores, ScoreResult
from da3po_jax.run import train
from da3po_jax.run.loop import NonFiniteTraining, RLTrainer
from da3po_jax.runtime.checkpoint import CheckpointError
from da3po_jax.runtime.metrics_file import MetricsFileError, read_metrics
from da3po_jax.runtime.signals import run_reporting_errors


@pytest.fixture(autouse=True)
def hash_scorer(monkeypatch):
    monkeypatch.setattr(context_lib, "RewardScorer", HashScorer)


def snapshot(root) -> dict[str, str]:
    """Every file under `root` with a hash of its bytes ({} when root does not exist)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha1(f.read()).hexdigest()
    return out


def keys_of(workdir) -> list[tuple[int, str]]:
    return [(r["step"], r["kind"]) for r in read_rows(workdir)]


def flip_bytes(step_dir: str, n: int = 64) -> str:
    """Flips `n` bytes in the middle of the largest array file of a checkpoint step."""
    files = []
    for dirpath, _, names in os.walk(os.path.join(step_dir, "state")):
        files += [os.path.join(dirpath, f) for f in names]
    path = max(files, key=os.path.getsize)
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        mid = len(data) // 2
        data[mid : mid + n] = bytes(b ^ 0xFF for b in data[mid : mid + n])
        f.seek(0)
        f.write(data)
    return path


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory):
    """A finished 4-step run (checkpoints at 2 and 4) and its final parameters."""
    saved, context_lib.RewardScorer = context_lib.RewardScorer, HashScorer
    try:
        workdir = str(tmp_path_factory.mktemp("four") / "run")
        cfg = micro_config(**{"train.steps": 4, "train.checkpoint_every": 2})
        train(cfg, workdir)
    finally:
        context_lib.RewardScorer = saved
    return workdir


def copy_run(src: str, tmp_path) -> str:
    dst = str(tmp_path / "run")
    shutil.copytree(src, dst)
    return dst


def final_params(workdir: str, step: int):
    """The parameters of checkpoint `step` as host arrays (a flat list)."""
    import orbax.checkpoint as ocp

    path = os.path.join(workdir, "checkpoints", str(step), "state")
    tree = ocp.StandardCheckpointer().restore(path)
    return [np.asarray(x) for x in jax.tree.leaves(tree["train"]["params"])]


# --------------------------------------------------------------- 1. corrupt checkpoint
def test_corrupt_checkpoint_falls_back_to_the_previous_good_one(four_steps, tmp_path, caplog):
    workdir = copy_run(four_steps, tmp_path)
    flip_bytes(os.path.join(workdir, "checkpoints", "4"))
    with caplog.at_level(logging.INFO, logger="da3po_jax"):
        train(micro_config(**{"train.steps": 4, "train.checkpoint_every": 2}), workdir)
    assert "checkpoint step 4 is damaged" in caplog.text
    assert "resumed from" in caplog.text and "at step 2" in caplog.text
    # the damaged step is kept aside, not deleted; step 4 was trained again from step 2
    assert os.path.isdir(os.path.join(workdir, "checkpoints.damaged", "4"))
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "4"]
    redone, reference = final_params(workdir, 4), final_params(four_steps, 4)
    assert all(np.array_equal(a, b) for a, b in zip(redone, reference, strict=True))
    keys = keys_of(workdir)
    assert len(keys) == len(set(keys)), keys


def test_every_checkpoint_damaged_is_an_error_and_nothing_moves(four_steps, tmp_path):
    workdir = copy_run(four_steps, tmp_path)
    for step in ("2", "4"):
        flip_bytes(os.path.join(workdir, "checkpoints", step))
    before = snapshot(workdir)
    with pytest.raises(CheckpointError, match="no checkpoint in .* restores .*step 4.*step 2"):
        train(micro_config(**{"train.steps": 6, "train.checkpoint_every": 2}), workdir)
    assert snapshot(workdir) == before


# ------------------------------------------------------------ 2. non-finite training
class NaNScorer(HashScorer):
    """Every reward is NaN: every advantage, loss and gradient is non-finite."""

    def score_batch(self, responses, references):
        out = super().score_batch(responses, references)
        results = [ScoreResult(r.correct, float("nan"), r.extracted, r.status) for r in out.results]
        return BatchScores(results, out.stats)


def test_nonfinite_updates_are_skipped_then_stop_the_run(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(context_lib, "RewardScorer", NaNScorer)
    workdir = str(tmp_path / "run")
    cfg = micro_config(**{"train.steps": 4, "train.max_nonfinite_steps": 2, "ds.enable": False})
    with caplog.at_level(logging.WARNING, logger="da3po_jax"):
        with pytest.raises(NonFiniteTraining, match="2 steps in a row .*last checkpoint: step 1"):
            train(cfg, workdir)
    rows = [r for r in read_rows(workdir) if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["optim/nonfinite_updates"] == 2 and r["optim/updates"] == 0 for r in rows)
    assert "non-finite or non-numeric metrics" in caplog.text  # null in JSON, and said so
    # the saved step-1 state is the initial one: params and optimizer untouched
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["1"]
    assert not os.path.exists(os.path.join(workdir, "final_model"))
    import orbax.checkpoint as ocp

    tree = ocp.StandardCheckpointer().restore(os.path.join(workdir, "checkpoints", "1", "state"))
    counts = [np.asarray(v) for k, v in _flat(tree["train"]["opt_state"]) if "count" in k]
    assert counts and all(int(c) == 0 for c in counts)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(tree["train"]["params"]))


def _flat(tree):
    return [(jax.tree_util.keystr(p), v) for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]]


def test_a_nonfinite_state_is_never_saved(tmp_path):
    from da3po_jax.runtime.checkpoint import Checkpointer

    ck = Checkpointer(str(tmp_path), keep=2, finite=("['train']",))
    ck.save(1, {"train": {"w": jax.numpy.ones(3)}}, {})
    ck.wait()
    with pytest.raises(
        CheckpointError, match=r"not saving step 2: .*\['train'\]\['w'\] \(1 values"
    ):
        ck.save(2, {"train": {"w": jax.numpy.array([1.0, float("nan"), 2.0])}}, {})
    ck.close()
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1"]


# ---------------------------------------------- 3./4. refusals leave the workdir alone
@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"rollout.group_size": 8}, r"rollout.group_size: checkpoint 4 vs now 8"),
        ({"algo": "grpo"}, r"algo: checkpoint 'da3po' vs now 'grpo'"),
    ],
)
def test_an_incompatible_resume_changes_nothing(four_steps, tmp_path, overrides, message):
    workdir = copy_run(four_steps, tmp_path)
    before = snapshot(workdir)
    with pytest.raises(CheckpointError, match=message):
        train(micro_config(**{"train.steps": 6, **overrides}), workdir)
    assert snapshot(workdir) == before  # config.json included


def test_checkpoints_being_a_file_is_refused(four_steps, tmp_path):
    workdir = copy_run(four_steps, tmp_path)
    shutil.rmtree(os.path.join(workdir, "checkpoints"))
    with open(os.path.join(workdir, "checkpoints"), "w") as f:
        f.write("not a folder")
    before = snapshot(workdir)
    with pytest.raises(CheckpointError, match="checkpoints path .* is not a folder"):
        train(micro_config(**{"train.steps": 4}), workdir)
    assert snapshot(workdir) == before


def test_a_refused_fresh_run_creates_nothing(tmp_path):
    workdir = str(tmp_path / "new")
    cfg = micro_config(**{"data.source": "jsonl", "data.train_path": str(tmp_path / "no.jsonl")})
    with pytest.raises(Exception, match="no.jsonl"):
        train(cfg, workdir)
    assert not os.path.exists(workdir)


# ------------------------------------------------------------------ 5. SIGTERM / SIGINT
def _signal_after_step(monkeypatch, signum: int, at_step: int):
    step = RLTrainer.step

    def step_then_signal(self):
        metrics = step(self)
        if int(self.state.step) == at_step:
            os.kill(os.getpid(), signum)
        return metrics

    monkeypatch.setattr(RLTrainer, "step", step_then_signal)


def test_a_signal_saves_the_step_its_eval_runs_on_resume_and_resume_is_exact(
    four_steps, tmp_path, monkeypatch, capsys
):
    """SIGINT after step 2, whose eval is due: the step is saved with the eval pending, the
    exit status is 130, and the resumed run ends exactly as an uninterrupted one (SIGTERM,
    exit 0, through a real process: test_faults_matrix.py)."""
    workdir = str(tmp_path / "run")
    cfg = micro_config(**{"train.steps": 4, "train.checkpoint_every": 3})
    before = signal.getsignal(signal.SIGINT)  # default, or SIG_IGN in a pytest-xdist worker
    with monkeypatch.context() as m:
        _signal_after_step(m, signal.SIGINT, at_step=2)
        assert run_reporting_errors(lambda: train(cfg, workdir)) == 130
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("da3po_jax: stopped on SIGINT: checkpoint of step 2 saved"), last
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2"]
    assert (2, "eval") not in keys_of(workdir)
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored
    train(cfg, workdir)  # resume to the end
    redone, reference = final_params(workdir, 4), final_params(four_steps, 4)
    assert all(np.array_equal(a, b) for a, b in zip(redone, reference, strict=True))
    assert keys_of(workdir) == keys_of(four_steps)


# ------------------------------------------------------------------ 6.-8. logs, leftovers
def test_no_duplicate_rows_when_killed_before_the_first_checkpoint(tmp_path):
    workdir = str(tmp_path / "run")
    cfg = micro_config(**{"train.steps": 2, "train.checkpoint_every": 2})
    os.makedirs(workdir)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:  # a run killed at step 1
        f.write('{"step": 0, "kind": "eval", "eval/avg@2": 0.5}\n{"step": 1, "kind": "train"}\n')
    train(cfg, workdir)
    keys = keys_of(workdir)
    assert keys == [(0, "eval"), (1, "train"), (2, "train"), (2, "eval")], keys


def test_a_torn_last_metrics_line_is_dropped_with_a_warning(four_steps, tmp_path, caplog):
    workdir = copy_run(four_steps, tmp_path)
    path = os.path.join(workdir, "metrics.jsonl")
    with open(path, "a") as f:
        f.write('{"step": 5, "kind": "train", "loss/to')
    with caplog.at_level(logging.WARNING, logger="da3po_jax"):
        train(micro_config(**{"train.steps": 4, "train.checkpoint_every": 2}), workdir)
    assert "dropping a torn last line" in caplog.text and path in caplog.text
    assert keys_of(workdir) == keys_of(four_steps)


def test_a_malformed_middle_metrics_line_names_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "kind": "eval"}\n{"step": 1, "ki\n{"step": 2, "kind": "train"}\n')
    with pytest.raises(MetricsFileError, match=rf"{path}: line 2 is not a metrics row"):
        read_metrics(str(path))


@pytest.mark.parametrize("left", ["old_and_new", "only_old"])
def test_export_cleans_what_a_killed_export_left(tmp_path, left):
    from da3po_jax.models import get_preset, init_model, save_model

    model = init_model(get_preset("tiny-qwen2", vocab_size=64), seed=0)
    out = str(tmp_path / "final_model")
    save_model(model, out)
    shutil.copytree(out, out + ".old")  # a kill between the two renames of an export
    os.makedirs(tmp_path / ".final_model.export-abc")  # and one during the write
    if left == "only_old":
        shutil.rmtree(out)
    save_model(model, out, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["final_model"]
    assert os.path.isfile(os.path.join(out, "config.json"))
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["vocab_size"] == 64


def test_a_failed_background_save_names_the_cause_and_keeps_the_last_good(tmp_path, monkeypatch):
    """Orbax logs the error of a failed asynchronous save (e.g. a full disk) and carries
    on: the save is checked at the next wait, and nothing older is rotated away."""
    from da3po_jax.runtime.checkpoint import Checkpointer

    ck = Checkpointer(str(tmp_path), keep=1)
    tree = {"w": jax.numpy.ones(3)}
    ck.save(1, tree, {})
    ck.wait()

    def failing_save(step, args):
        try:
            raise OSError(28, "No space left on device")
        except OSError:
            logging.getLogger("absl").exception("background save of step %d failed", step)

    monkeypatch.setattr(ck._manager, "save", failing_save)
    ck.save(2, tree, {})
    with pytest.raises(CheckpointError, match=r"step 2 .*No space left on device.*are kept"):
        ck.wait()
    assert ck.all_steps() == [1]
    ck.close()


def test_the_last_line_of_an_error_names_a_buried_os_error(capsys):
    def fails():
        try:
            raise OSError(28, "No space left on device")
        except OSError as e:
            raise RuntimeError("export failed") from e

    assert run_reporting_errors(fails) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (
        "da3po_jax: error: RuntimeError: export failed "
        "(caused by OSError: [Errno 28] No space left on device)"
    )
