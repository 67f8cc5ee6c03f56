"""The hard-task study: its statistics and tables by hand, the task's config, and a micro
end-to-end study (extended)."""

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

from experiments import compare, hard_task  # noqa: E402


def _curve(final_hard: float, final_all: float, steps: int, tokens: float, lam=math.nan) -> dict:
    return {
        "step": [0, steps],
        "tokens": [0.0, tokens],
        "overall_avg": [0.1, final_all],
        "hard_avg": [0.0, final_hard],
        "overall_pass": [0.2, min(1.0, 2 * final_all)],
        "hard_pass": [0.0, min(1.0, 2 * final_hard)],
        "steps": steps,
        "total_tokens": tokens,
        "dynamics": {k: lam if k.startswith("daa") else 0.5 for k in hard_task.DYNAMICS},
    }


def test_per_seed_lists_and_paired_t_intervals_by_hand():
    curves = {
        "dapo": {0: _curve(0.10, 0.30, 20, 1000), 1: _curve(0.20, 0.40, 22, 1010),
                 2: _curve(0.15, 0.35, 21, 1005)},
        "da3po": {0: _curve(0.12, 0.30, 19, 1002, 2.0), 1: _curve(0.26, 0.41, 21, 1003, 3.0),
                  2: _curve(0.16, 0.33, 20, 1001, 4.0)},
    }  # fmt: skip
    algos = hard_task.per_seed(curves)
    assert algos["dapo"]["hard_avg"] == [0.10, 0.20, 0.15]
    assert algos["da3po"]["steps"] == [19, 21, 20]
    assert algos["da3po"]["tokens"] == [1002, 1003, 1001]
    diffs = hard_task.paired(algos, [("da3po", "dapo"), ("grpo", "dapo")])
    assert set(diffs) == {"da3po - dapo"}  # pairs with a missing variant are skipped
    # differences 0.02, 0.06, 0.01: mean 0.03, sd 0.026458, t(0.975, 2) = 4.303
    mean, half = diffs["da3po - dapo"]["hard_avg"]
    assert mean == pytest.approx(0.03)
    assert half == pytest.approx(4.303 * math.sqrt(0.0007) / math.sqrt(3), rel=1e-4)
    table = hard_task.markdown(algos, diffs, 8, 1000)
    assert "| da3po | 20.0 | 1,002 |" in table
    assert "| da3po - dapo | " in table
    assert algos["da3po"]["dynamics"]["daa/lambda_mean"] == [2.0, 3.0, 4.0]
    row = next(line for line in table.splitlines() if line.startswith("| da3po | 0.500"))
    assert "| 3.000 |" in row  # lambda means 2, 3, 4 over the seeds
    assert "| dapo | 0.500 | 0.500 | 0.500 | – |" in table  # no DAA metrics: a dash


def test_curve_lookup_is_the_last_eval_within_the_tokens():
    c = _curve(0.3, 0.5, 10, 800.0)
    assert compare.at_budget(c, 799, "hard_avg", "tokens") == 0.0
    assert compare.at_budget(c, 800, "hard_avg", "tokens") == 0.3
    lone = {"tokens": [5.0], "hard_avg": [1.0]}
    assert math.isnan(compare.at_budget(lone, 1, "hard_avg", "tokens"))


def test_read_run_pairs_evals_with_cumulative_tokens(tmp_path):
    rows = [
        {"kind": "eval", "step": 0, "eval/avg@8": 0.1, "eval/pass@8": 0.3,
         "eval/avg@8/harder": 0.01, "eval/pass@8/harder": 0.05},
        {"kind": "train", "step": 1, "tokens/generated_total": 500.0},
        {"kind": "train", "step": 2, "tokens/generated_total": 1100.0},
        {"kind": "eval", "step": 2, "eval/avg@8": 0.2, "eval/pass@8": 0.4,
         "eval/avg@8/harder": 0.03, "eval/pass@8/harder": 0.1},
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    run = hard_task.read_run(str(tmp_path), 8)
    assert run["tokens"] == [0.0, 1100.0] and run["step"] == [0, 2]
    assert run["hard_avg"] == [0.01, 0.03] and run["overall_pass"] == [0.3, 0.4]
    assert run["steps"] == 2 and run["total_tokens"] == 1100.0
    assert math.isnan(run["dynamics"]["daa/lambda_mean"])  # not logged: nan


def test_variants_are_valid_configs_and_the_task_is_the_hard_one():
    from da3po_jax.config import resolve_settings

    for overrides in hard_task.VARIANTS.values():
        c = hard_task.study_config(10_000, 20)
        for key, value in overrides.items():
            compare.set_field(c, key, value)
        s = resolve_settings(c)
        assert s.rollout.group_size == 16 and s.train.token_budget == 10_000
        assert (
            dict(zip(("easy", "medium", "hard", "harder"), s.data.synthetic_tier_weights))["harder"]
            == 3.0
        )


def test_profile_bins_split_at_one_sixteenth():
    from experiments.difficulty import table

    rates = np.asarray([0, 1 / 32, 2 / 32, 3 / 32, 4 / 32, 5 / 32, 1.0], np.float32)
    res, _ = table(rates, ["harder"] * 7, hard_task.PROFILE_BINS)
    assert res["harder"]["shares"] == pytest.approx([1 / 7, 2 / 7, 2 / 7, 1 / 7, 0, 1 / 7])


@pytest.mark.extended
@pytest.mark.slow
def test_hard_task_micro_study(tmp_path):
    out = tmp_path / "figures"
    path = tmp_path / "hard_task.json"
    args = ["--quick", "--seeds", "0", "1", "--budget", "300", "--eval_every", "1"]
    args += ["--variants", "dapo", "da3po", "--profile_samples", "4", "--profile_prompts", "8"]
    hard_task.main(args + ["--workdir", str(tmp_path / "runs"), "--figures", str(out),
                           "--json", str(path)])  # fmt: skip
    data = json.loads(path.read_text())
    assert data["group_size"] == 4 and set(data["algos"]) == {"dapo", "da3po"}
    for row in data["algos"].values():
        assert len(row["hard_avg"]) == len(row["overall_avg"]) == 2
        assert all(t >= 300 for t in row["tokens"]) and all(s >= 1 for s in row["steps"])
    d = data["da3po_minus_dapo_hard"]
    diffs = np.subtract(data["algos"]["da3po"]["hard_avg"], data["algos"]["dapo"]["hard_avg"])
    assert d["mean"] == pytest.approx(diffs.mean())
    assert d["ci95_half"] == pytest.approx(12.706 * diffs.std(ddof=1) / math.sqrt(2))
    assert data["difficulty"]["prompts"] == 8
    for name in ("hard_task.md", "hard_task_curves.png", "hard_task_difficulty.png"):
        assert (out / name).stat().st_size > 0
