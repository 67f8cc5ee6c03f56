"""`plot_curves` / `curve_panels`: which panels `curves.png` shows for RL and SFT logs,
the PNG itself, and its atomic replacement."""

from __future__ import annotations

import json
import os

import matplotlib.figure
import matplotlib.image
import pytest
from matplotlib._pylab_helpers import Gcf

from da3po_jax.runtime.curves import _drawn, _x_label, curve_panels, plot_curves
from da3po_jax.runtime.metrics_file import read_metrics

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

TRAIN_KEYS = (
    "reward/mean",
    "reward/acc",
    "loss/total",
    "loss/pg",
    "loss/approx_kl",
    "loss/kl_ref",
    "opd/reverse_kl",
    "loss/entropy",
    "response/len_mean",
    "response/len_max",
    "loss/clipfrac_low",
    "loss/clipfrac_high",
    "loss/clipfrac_dual",
    "ds/kept_frac",
    "ds/all_correct_frac",
    "ds/all_wrong_frac",
    "daa/lambda_mean",
    "daa/lambda_max",
    "daa/pos_share_before",
    "daa/pos_share_after",
    "optim/grad_norm",
    "optim/lr",  # in no panel
)


def _train_row(step: int) -> dict:
    row = {"step": step, "kind": "train"}
    row.update({k: 0.1 * (i + 1) + 0.01 * step for i, k in enumerate(TRAIN_KEYS)})
    row["opd/reverse_kl"] = None  # null at every step: not drawn
    if step % 2:
        row["loss/entropy"] = None  # null at some steps: drawn from the others
    return row


def _eval_row(step: int) -> dict:
    return {
        "step": step,
        "kind": "eval",
        "eval/avg@4/hard": 0.1 + 0.01 * step,
        "eval/avg@4": 0.3 + 0.01 * step,
        "eval/avg@4/easy": 0.6 + 0.01 * step,
        "eval/pass@4": 0.5,  # in no panel
        "eval/response_len": 40.0 - step,
        "eval/num_prompts": 30.0,
    }


def _sft_rows() -> list[dict]:
    rows = [
        {"step": s, "kind": "sft", "sft/loss": 2.0 / (s + 1), "sft/grad_norm": 1.0}
        for s in range(0, 50, 10)
    ]
    rows += [{"step": s, "kind": "sft", "sft/check_acc": 0.2 * s / 40} for s in (20, 40)]
    return rows


def _rl_rows() -> list[dict]:
    rows = [_eval_row(0)]
    for step in range(1, 9):
        rows.append(_train_row(step))
        if step % 4 == 0:
            rows.append(_eval_row(step))
    return rows


def _write(path, rows, tail: str = "") -> str:
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
        f.write(tail)
    return str(path)


RL_PANELS = [
    ("training rollouts: reward / accuracy", ["reward/mean", "reward/acc"]),
    ("held-out avg@k", ["eval/avg@4", "eval/avg@4/easy", "eval/avg@4/hard"]),
    ("loss", ["loss/total", "loss/pg"]),
    ("KL", ["loss/approx_kl", "loss/kl_ref"]),
    ("entropy", ["loss/entropy"]),
    ("response length (tokens)", ["response/len_mean", "response/len_max", "eval/response_len"]),
    ("clip fractions", ["loss/clipfrac_low", "loss/clipfrac_high", "loss/clipfrac_dual"]),
    ("dynamic sampling", ["ds/kept_frac", "ds/all_correct_frac", "ds/all_wrong_frac"]),
    ("DAA amplification λ", ["daa/lambda_mean", "daa/lambda_max"]),
    ("DAA positive-advantage share", ["daa/pos_share_before", "daa/pos_share_after"]),
    ("gradient norm", ["optim/grad_norm"]),
]


def test_rl_panels(tmp_path):
    rows = read_metrics(_write(tmp_path / "metrics.jsonl", _rl_rows()))
    assert curve_panels(rows) == RL_PANELS
    drawn = dict((p.title, series) for p, series in _drawn(rows))
    assert all(_x_label(series) == "RL step" for series in drawn.values())
    held_out = {s.key: s for s in drawn["held-out avg@k"]}
    assert held_out["eval/avg@4"].steps == [0, 4, 8]
    assert held_out["eval/avg@4"].width > held_out["eval/avg@4/easy"].width
    assert held_out["eval/avg@4/easy"].width == held_out["eval/avg@4/hard"].width
    (entropy,) = drawn["entropy"]
    assert entropy.steps == [2, 4, 6, 8]  # the null steps are skipped


def test_sft_panels():
    assert curve_panels(_sft_rows()) == [
        ("loss", ["sft/loss"]),
        ("gradient norm", ["sft/grad_norm"]),
        ("SFT check accuracy", ["sft/check_acc"]),
    ]
    assert {_x_label(series) for _, series in _drawn(_sft_rows())} == {"SFT step"}


def test_only_eval_and_empty_rows():
    assert curve_panels([_eval_row(0)]) == [
        ("held-out avg@k", ["eval/avg@4", "eval/avg@4/easy", "eval/avg@4/hard"]),
        ("response length (tokens)", ["eval/response_len"]),
    ]
    assert curve_panels([]) == []
    assert curve_panels([{"step": 0, "kind": "eval", "eval/num_prompts": 3.0}]) == []
    assert curve_panels([{"step": 1, "kind": "train", "reward/mean": None}]) == []


def _read_png(path):
    with open(path, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE
    return matplotlib.image.imread(path)


def test_plot_curves_writes_the_rl_grid(tmp_path):
    metrics = _write(tmp_path / "metrics.jsonl", _rl_rows())
    out = str(tmp_path / "curves.png")
    assert plot_curves(metrics, out) == out
    image = _read_png(out)
    # 11 panels, 3 a row: 4 rows of 3.2 in (+0.4 in of title) by 3 columns of 4.4 in, 100 dpi
    assert image.shape[:2] == (1320, 1320)
    assert image[..., :3].std() > 0.05  # something was drawn
    assert Gcf.get_num_fig_managers() == 0  # no pyplot figure left behind
    assert sorted(os.listdir(tmp_path)) == ["curves.png", "metrics.jsonl"]


def test_plot_curves_sft_and_a_file_being_written(tmp_path):
    metrics = _write(tmp_path / "metrics.jsonl", _sft_rows(), tail='{"step": 60, "kind": "sf')
    out = str(tmp_path / "sub" / "curves.png")
    assert plot_curves(metrics, out, ncols=2) == out
    assert _read_png(out).shape[:2] == (680, 880)  # 3 panels: 2 rows of 2


def test_plot_curves_without_data_writes_nothing(tmp_path):
    out = tmp_path / "curves.png"
    assert plot_curves(str(tmp_path / "missing.jsonl"), str(out)) is None
    empty = _write(tmp_path / "metrics.jsonl", [])
    assert plot_curves(empty, str(out)) is None
    no_keys = _write(tmp_path / "other.jsonl", [{"step": 0, "kind": "eval", "eval/x": 1.0}])
    assert plot_curves(no_keys, str(out)) is None
    assert not out.exists()


def test_plot_curves_replaces_an_existing_png(tmp_path):
    out = tmp_path / "curves.png"
    out.write_bytes(b"an older plot")
    metrics = _write(tmp_path / "metrics.jsonl", [_eval_row(0)])
    assert plot_curves(metrics, str(out)) == str(out)
    first = _read_png(out)
    _write(tmp_path / "metrics.jsonl", [_eval_row(0), _train_row(1), _eval_row(4)])
    plot_curves(metrics, str(out))
    assert _read_png(out).shape != first.shape  # the new rows' panels
    assert sorted(os.listdir(tmp_path)) == ["curves.png", "metrics.jsonl"]


def test_a_failed_write_leaves_the_old_png(tmp_path, monkeypatch):
    out = tmp_path / "curves.png"
    out.write_bytes(PNG_SIGNATURE + b"old")
    metrics = _write(tmp_path / "metrics.jsonl", _rl_rows())

    def torn_save(self, fname, **kwargs):
        with open(fname, "wb") as f:
            f.write(PNG_SIGNATURE[:4])
        raise OSError("No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", torn_save)
    with pytest.raises(OSError, match="No space"):
        plot_curves(metrics, str(out))
    assert out.read_bytes() == PNG_SIGNATURE + b"old"
    assert sorted(os.listdir(tmp_path)) == ["curves.png", "metrics.jsonl"]
