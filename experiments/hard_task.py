"""GRPO vs DAPO vs DA3PO on the hard task (`configs/tiny_math_hard.py`) at equal generated
response tokens, from one warm start, over seeds.

  python -m experiments.hard_task                       # 10 seeds x 4 variants
  python -m experiments.hard_task --seeds 0 1 --budget 200000 --workdir /tmp/ht --quick

1. Builds the SFT warm start once (`<workdir>/warm`) and measures its difficulty profile
   on the training prompts: each prompt's success probability estimated from
   `--profile_samples` (32) samples at the rollout temperature, binned at 0, (0, 1/16],
   (1/16, 1/8], (1/8, 1/2), [1/2, 1), 1 (table and histogram).
2. Trains every (variant, seed) from it with `train.token_budget = --budget`: each run stops
   after the step at which its generated response tokens (every sample of every round,
   groups that dynamic sampling drops included) reach the budget, and reports the steps
   that bought. Held-out avg@k and pass@k, overall and on the hard tier (`harder`), are
   read at the run's last evaluation (the stop always evaluates).
3. Reports means with 95% t-intervals over seeds and paired per-seed differences (n - 1
   degrees of freedom), learning curves against generated tokens, and writes the raw
   per-seed values to `docs/results/hard_task.json`.

A run whose `summary.json` exists is reused, so an interrupted study resumes.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import time
from collections.abc import Sequence

import numpy as np

from experiments.compare import ROOT, _fmt, at_budget, base_config, mean_ci, run_variant, warm_start

log = logging.getLogger("experiments")
CONFIG = "tiny_math_hard"
HARD_TIER = "harder"
# name -> overrides; the last entry is the DAA ablation (docs/results.md says why this one)
VARIANTS: dict[str, dict] = {
    "grpo": {"algo": "grpo"},
    "dapo": {"algo": "dapo"},
    "da3po": {"algo": "da3po"},  # default DAA: power, beta 0.5, tau 0.5, cap 4
    "da3po_b1": {"algo": "da3po", "daa.beta": 1.0, "daa.lambda_max": 16.0},
}
PAIRS = (("dapo", "grpo"), ("da3po", "grpo"), ("da3po", "dapo"), ("da3po_b1", "da3po"),
         ("da3po_b1", "dapo"))  # fmt: skip
PROFILE_BINS = (("0", 0.0, 0.0), ("(0,1/16]", 1e-9, 0.0625), ("(1/16,1/8]", 0.0625 + 1e-9, 0.125),
                ("(1/8,1/2)", 0.125 + 1e-9, 0.5 - 1e-9), ("[1/2,1)", 0.5, 1 - 1e-9),
                ("1", 1.0, 1.0))  # fmt: skip
METRICS = ("overall_avg", "hard_avg", "overall_pass", "hard_pass")
# train metrics averaged over a run's steps: what dynamic sampling and DAA did
DYNAMICS = ("reward/acc", "ds/kept_frac", "ds/batch_fill", "daa/frac_hard", "daa/lambda_mean",
            "daa/pos_share_before", "daa/pos_share_after")  # fmt: skip


def study_config(budget: int, eval_every: int, quick: bool = False):
    """The hard task's config for the study's runs (quick: a seconds-long CI version)."""
    c = base_config(10_000, eval_every, micro=quick, config=CONFIG)
    c.rollout.engine = "continuous"  # the default engine
    c.train.token_budget = budget
    c.train.checkpoint_every = 0  # none: a finished run is reused from its summary.json
    if quick:
        c.data.synthetic_tier_weights = (0.0, 0.0, 1.0, 1.0)
        c.rollout.max_new_tokens, c.sft.max_len = 16, 192
    return c


def read_run(run_dir: str, k: int) -> dict:
    """A run's evaluations against its cumulative generated tokens, and its totals."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    tokens = {0: 0.0}
    for r in rows:
        if r["kind"] == "train":
            tokens[r["step"]] = r["tokens/generated_total"]
    evals = [r for r in rows if r["kind"] == "eval"]
    steps = [r for r in rows if r["kind"] == "train"]
    # nan where the run logs no such metric (DAA's under GRPO and DAPO)
    means = {key: float(np.mean([r[key] for r in steps if key in r] or [math.nan]))
             for key in DYNAMICS}  # fmt: skip
    suffix = f"/{HARD_TIER}"
    return {
        "step": [r["step"] for r in evals],
        "tokens": [tokens[r["step"]] for r in evals],
        "overall_avg": [r[f"eval/avg@{k}"] for r in evals],
        "hard_avg": [r.get(f"eval/avg@{k}{suffix}", math.nan) for r in evals],
        "overall_pass": [r[f"eval/pass@{k}"] for r in evals],
        "hard_pass": [r.get(f"eval/pass@{k}{suffix}", math.nan) for r in evals],
        "steps": max(tokens),
        "total_tokens": tokens[max(tokens)],
        "dynamics": means,
    }


def per_seed(curves: dict[str, dict[int, dict]]) -> dict[str, dict[str, list]]:
    """Per variant, the per-seed lists (seed order) the JSON reports: final metrics,
    generated tokens and steps."""
    out = {}
    for name, runs in curves.items():
        seeds = sorted(runs)
        row = {"seeds": seeds}
        for key in METRICS:
            row[key] = [runs[s][key][-1] for s in seeds]
        row["tokens"] = [int(runs[s]["total_tokens"]) for s in seeds]
        row["steps"] = [int(runs[s]["steps"]) for s in seeds]
        row["dynamics"] = {k: [runs[s]["dynamics"][k] for s in seeds] for k in DYNAMICS}
        out[name] = row
    return out


def paired(algos: dict[str, dict[str, list]], pairs: Sequence[tuple[str, str]]) -> dict:
    """`a - b` per metric over the seeds both ran: (mean, 95% t half-width)."""
    out = {}
    for a, b in pairs:
        if a not in algos or b not in algos:
            continue
        common = sorted(set(algos[a]["seeds"]) & set(algos[b]["seeds"]))
        ia = [algos[a]["seeds"].index(s) for s in common]
        ib = [algos[b]["seeds"].index(s) for s in common]
        out[f"{a} - {b}"] = {
            key: mean_ci([algos[a][key][i] - algos[b][key][j] for i, j in zip(ia, ib)])
            for key in METRICS
        }
    return out


def markdown(algos: dict, diffs: dict, k: int, budget: int) -> str:
    n = len(next(iter(algos.values()))["seeds"])
    lines = [
        f"Held-out avg@{k} and pass@{k} at {budget:,} generated response tokens per run "
        f"(the hard tier is `{HARD_TIER}`); mean ± 95% t half-width over {n} seeds.",
        "",
        "| variant | steps | tokens | avg (all) | avg (hard) | pass (all) | pass (hard) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in algos.items():
        cells = [_fmt(mean_ci(row[key])) for key in METRICS]
        steps, tokens = np.mean(row["steps"]), np.mean(row["tokens"])
        lines.append(f"| {name} | {steps:.1f} | {tokens:,.0f} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Paired per-seed differences (same seed, same warm start):",
        "",
        "| difference | avg (all) | avg (hard) | pass (all) | pass (hard) |",
        "|---|---|---|---|---|",
    ]
    for name, d in diffs.items():
        lines.append(f"| {name} | " + " | ".join(_fmt(d[key]) for key in METRICS) + " |")
    lines += ["", "Per-step means over each run, then over seeds (train rollouts):", ""]
    lines += ["| variant | " + " | ".join(DYNAMICS) + " |", "|---" * (1 + len(DYNAMICS)) + "|"]
    for name, row in algos.items():
        means = [float(np.mean(row["dynamics"][k])) for k in DYNAMICS]
        cells = ["–" if math.isnan(m) else f"{m:.3f}" for m in means]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_curves(curves: dict[str, dict[int, dict]], budget: int, path: str, k: int) -> None:
    """Mean (and 95% band over seeds) of held-out avg@k against generated tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # to the largest run's total: the stop overshoots the budget by at most one step
    end = max(c["total_tokens"] for runs in curves.values() for c in runs.values())
    grid = np.linspace(0, max(budget, end), 41)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for name, runs in curves.items():
        for ax, key in zip(axes, ("overall_avg", "hard_avg", "hard_pass")):
            y = np.asarray([[at_budget(c, t, key, "tokens") for t in grid] for c in runs.values()])
            m = y.mean(0)
            ax.plot(grid, m, label=name)
            if y.shape[0] > 1:
                h = np.asarray([mean_ci(y[:, i])[1] for i in range(grid.size)])
                ax.fill_between(grid, m - h, m + h, alpha=0.15)
            ax.set_xlabel("generated response tokens")
            label = {"overall_avg": "avg", "hard_avg": "avg", "hard_pass": "pass"}[key]
            tier = " (all)" if key.startswith("overall") else f" ({HARD_TIER})"
            ax.set_ylabel(f"held-out {label}@{k}{tier}")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def profile(warm: str, args, cfg) -> dict:
    """The warm start's difficulty profile on seed 0's training prompts (table + PNG); the
    pass rates are kept in `<warm>/profile_<samples>x<prompts>.json` and reused."""
    from experiments.difficulty import pass_rates, plot_hist, table

    t0 = time.perf_counter()
    cache = os.path.join(warm, f"profile_{args.profile_samples}x{args.profile_prompts}.json")
    if os.path.isfile(cache):
        with open(cache) as f:
            saved = json.load(f)
        rates, tiers, seconds = np.asarray(saved["rates"]), saved["tiers"], saved["seconds"]
    else:
        rates, tiers = pass_rates(
            warm, args.profile_samples, split="train", cfg=cfg, limit=args.profile_prompts
        )
        seconds = time.perf_counter() - t0
        with open(cache, "w") as f:
            json.dump({"rates": rates.tolist(), "tiers": tiers, "seconds": seconds}, f)
    res, md = table(rates, tiers, PROFILE_BINS)
    png = os.path.join(args.figures, "hard_task_difficulty.png")
    top = max(0.25, float(np.max(rates)) + 2 / args.profile_samples)
    edge = 1 / 16 + 0.5 / args.profile_samples  # the bars left of it are <= 1/16
    plot_hist(rates, tiers, args.profile_samples, png, "training prompts", edge, min(top, 1.0))
    head = (
        f"Success probabilities of the warm start on {len(rates)} training prompts, "
        f"{args.profile_samples} samples each (share of prompts per bin).\n\n"
    )
    with open(os.path.join(args.figures, "hard_task_difficulty.md"), "w") as f:
        f.write(head + md)
    print(head + md)
    band = float(np.mean((rates > 0) & (rates <= 1 / 16)))
    return {"samples": args.profile_samples, "prompts": len(rates), "by_tier": res,
            "share_in_0_1_16": band, "seconds": seconds}  # fmt: skip


def run_all(args, cfg, warm) -> tuple[dict[str, dict[int, dict]], dict[str, float]]:
    """Every (variant, seed) run's curve, and the wall seconds each run took when it was
    trained (kept in `<runs>/wall_s.json`, so a resumed study still reports them)."""
    runs = os.path.join(args.workdir, f"budget{args.budget}")
    os.makedirs(runs, exist_ok=True)
    walls_path = os.path.join(runs, "wall_s.json")
    walls = {}
    if os.path.isfile(walls_path):
        with open(walls_path) as f:
            walls = json.load(f)
    curves: dict[str, dict[int, dict]] = {}
    for seed in args.seeds:
        for name in args.variants:
            t0 = time.perf_counter()
            run = run_variant(runs, cfg, name, seed, VARIANTS[name], warm)
            key = os.path.basename(run)
            if key not in walls:
                walls[key] = time.perf_counter() - t0
                with open(walls_path, "w") as f:
                    json.dump(walls, f, indent=1)
            curves.setdefault(name, {})[seed] = read_run(run, cfg.eval.num_samples)
            log.info("%s seed %d: %.0f s", name, seed, walls[key])
    return curves, walls


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--budget", type=int, default=1_200_000, help="generated tokens per run")
    p.add_argument("--eval_every", type=int, default=20, help="steps between evaluations")
    p.add_argument("--profile_samples", type=int, default=32)
    p.add_argument("--profile_prompts", type=int, default=400)
    p.add_argument("--quick", action="store_true", help="seconds-long smoke version (CI)")
    p.add_argument("--profile_only", action="store_true", help="warm start and profile only")
    p.add_argument("--workdir", default="/tmp/da3po_hard_task")
    p.add_argument("--figures", default=os.path.join(ROOT, "docs", "figures"))
    p.add_argument("--json", default=os.path.join(ROOT, "docs", "results", "hard_task.json"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    t0 = time.perf_counter()
    cfg = study_config(args.budget, args.eval_every, args.quick)
    warm = warm_start(args.workdir, cfg)
    os.makedirs(args.figures, exist_ok=True)
    difficulty = profile(os.path.dirname(warm[0]), args, cfg)
    if args.profile_only:
        return {"difficulty": difficulty}
    curves, walls = run_all(args, cfg, warm)
    algos = per_seed(curves)
    diffs = paired(algos, PAIRS)
    k = cfg.eval.num_samples
    table = markdown(algos, diffs, k, args.budget)
    with open(os.path.join(args.figures, "hard_task.md"), "w") as f:
        f.write(table)
    plot_curves(curves, args.budget, os.path.join(args.figures, "hard_task_curves.png"), k)
    hard = diffs.get("da3po - dapo", {}).get("hard_avg", (math.nan, math.nan))
    result = {
        "config": f"configs/{CONFIG}.py",
        "group_size": cfg.rollout.group_size,
        "k": k,
        "hard_tier": HARD_TIER,
        "token_budget": args.budget,
        "variants": {n: VARIANTS[n] for n in args.variants},
        "algos": algos,
        "da3po_minus_dapo_hard": {"mean": hard[0], "ci95_half": hard[1]},
        "paired": diffs,
        "difficulty": difficulty,
        "curves": {n: {str(s): c for s, c in runs.items()} for n, runs in curves.items()},
        "wall_s": {
            "this_invocation": time.perf_counter() - t0,
            "runs": walls,
            "runs_total": float(sum(walls.values())),
        },  # fmt: skip
    }
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(table)
    return result


if __name__ == "__main__":
    main()
