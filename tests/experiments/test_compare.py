"""The comparison scripts: statistics by hand, and a micro end-to-end study (seconds)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `experiments` is a top-level folder, not an installed package
    sys.path.insert(0, str(ROOT))

from experiments import ablate, compare  # noqa: E402


def test_mean_ci_by_hand():
    # mean 2, sample sd 1, n = 3: half-width = t(0.975, 2) * 1 / sqrt(3) = 4.303 / 1.732
    m, h = compare.mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0
    assert h == pytest.approx(4.303 / math.sqrt(3), rel=1e-6)
    m, h = compare.mean_ci([0.5])
    assert m == 0.5 and math.isnan(h)


def test_budget_and_step_lookup():
    curve = {
        "step": [0, 10, 20],
        "samples": [0, 300, 900],
        "acc": [0.1, 0.2, 0.3],
        "hard": [0, 0, 0],
    }
    assert compare.at_budget(curve, 299, "acc") == 0.1
    assert compare.at_budget(curve, 300, "acc") == 0.2
    assert compare.at_budget(curve, 5000, "acc") == 0.3
    assert compare.at_step(curve, 15, "acc") == 0.2


def test_analyse_pairs_seeds():
    def curve(a):
        return {"step": [0, 10], "samples": [0, 100], "acc": [0.1, a], "hard": [0.0, a / 2]}

    curves = {"a": {0: curve(0.2), 1: curve(0.4)}, "b": {0: curve(0.3), 1: curve(0.6)}}
    res = compare.analyse(curves, [100], [10])
    assert res["step"]["10"]["a"]["acc"][0] == pytest.approx(0.3)
    d, h = res["paired"]["b"]["acc"]  # differences 0.1 and 0.2
    assert d == pytest.approx(0.15)
    assert h == pytest.approx(12.706 * np.std([0.1, 0.2], ddof=1) / math.sqrt(2))


def test_ablation_groups_are_valid_configs():
    from da3po_jax.config import resolve_settings

    for group in ablate.GROUPS.values():
        for overrides in group.values():
            c = compare.base_config(10, 5)
            for key, value in overrides.items():
                compare.set_field(c, key, value)
            resolve_settings(c)  # raises on a bad field


@pytest.mark.extended
@pytest.mark.slow
def test_compare_micro_study(tmp_path):
    out = tmp_path / "out"
    args = ["--micro", "--seeds", "0", "1", "--steps", "1", "--eval_every", "1"]
    compare.main(args + ["--workdir", str(tmp_path / "runs"), "--out", str(out)])
    data = json.loads((out / "compare.json").read_text())
    assert set(data["curves"]) == {"grpo", "dapo", "da3po"}
    assert (out / "compare_curves.png").stat().st_size > 0
    table = (out / "compare.md").read_text()
    assert "At equal generated samples" in table and "Paired" in table
    # the reported step-1 mean is the mean of the runs' own eval rows
    for name, runs in data["curves"].items():
        want = np.mean([r["acc"][-1] for r in runs.values()])
        assert data["result"]["step"]["1"][name]["acc"][0] == pytest.approx(want)
        for seed, r in runs.items():
            run_dir = tmp_path / "runs" / f"{name}_n1_s{seed}"
            rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
            gen = sum(x.get("samples/generated", 0) for x in rows if x["kind"] == "train")
            assert r["samples"][-1] == gen > 0


@pytest.mark.extended
@pytest.mark.slow
def test_opd_micro_study(tmp_path):
    from experiments import opd

    out = tmp_path / "out"
    opd.main(["--micro", "--seeds", "0", "--workdir", str(tmp_path / "runs"), "--out", str(out)])
    res = json.loads((out / "opd.json").read_text())["result"]
    assert set(res) == {"opd", "ra_opd", "paired"}
    assert (out / "opd_curves.png").stat().st_size > 0
    # RA-OPD logs a kept fraction in [0, 1]; OPD has none
    kept = res["ra_opd"]["kept_frac"][0]
    assert 0.0 <= kept <= 1.0
    assert math.isnan(res["opd"]["kept_frac"][0])
    # the table's final accuracy is the run's own last eval row
    rows = [json.loads(x) for x in (tmp_path / "runs" / "opd_s0" / "metrics.jsonl").open()]
    last = [r for r in rows if r["kind"] == "eval"][-1]
    assert res["opd"]["final"][0] == pytest.approx(last["eval/avg@2"])


@pytest.mark.extended
@pytest.mark.slow
def test_staleness_micro_study(tmp_path):
    from experiments import staleness

    out, runs = tmp_path / "out", tmp_path / "runs"
    args = ["--micro", "--seeds", "0", "1", "--steps", "3", "--eval_every", "3"]
    staleness.main(args + ["--workdir", str(runs), "--out", str(out)])
    data = json.loads((out / "staleness.json").read_text())
    assert set(data["curves"]) == {"sync", "partial"}
    assert "partial" in data["result"]["paired"]
    # the timings are the runs' own step rows after the first
    for name in ("sync", "partial"):
        per_seed = []
        for seed in (0, 1):
            rows = [json.loads(x) for x in (runs / f"{name}_n3_s{seed}" / "metrics.jsonl").open()]
            per_seed.append(
                np.mean(
                    [r["time/step"] for r in rows if r.get("step", 0) > 1 and r["kind"] == "train"]
                )
            )
        assert data["result"]["timings"][name]["time/step"][0] == pytest.approx(np.mean(per_seed))


def test_difficulty_bins_partition_pass_rates():
    from experiments.difficulty import table

    # float32 rates exactly on the bin edges (1/8, 1/2) fall in one bin each
    rates = np.asarray([0, 1 / 16, 2 / 16, 3 / 16, 8 / 16, 1.0], np.float32)
    res, md = table(rates, ["hard", "hard", "hard", "easy", "easy", "easy"])
    assert res["hard"]["shares"] == pytest.approx([1 / 3, 2 / 3, 0, 0, 0])
    assert res["easy"]["shares"] == pytest.approx([0, 0, 1 / 3, 1 / 3, 1 / 3])
    assert res["all"]["n"] == 6 and res["all"]["mean"] == pytest.approx(float(rates.mean()))
    assert "| hard | 3 |" in md
