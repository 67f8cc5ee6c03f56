"""GRPO vs DAPO vs DA3PO on the tiny synthetic task, from one warm start, over seeds.

  python -m experiments.compare                 # 5 seeds x 3 algorithms, 150 steps each
  python -m experiments.compare --quick         # 2 seeds, 60 steps
  python -m experiments.compare --seeds 0 1 --steps 40 --workdir /tmp/cmp --out docs/figures

Every run starts from the same SFT warm start (built once in `<workdir>/warm`), uses the
same data and differs only in the algorithm and the seed (data order and sampling). A run
whose `summary.json` exists is reused, so an interrupted study resumes. The report gives
held-out avg@k overall and on the hard tier, mean and 95% confidence interval over seeds:
- at equal generated-sample budgets (dynamic sampling spends more samples per step;
  accuracy is read at the last evaluation within the budget), and
- at equal gradient steps,
plus paired per-seed differences against the first algorithm and learning curves (PNG).
`experiments.ablate` runs variants (DAA estimators, caps, dynamic sampling) the same way.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Sequence

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
log = logging.getLogger("experiments")

# two-sided 95% Student t quantiles by degrees of freedom (1..30); normal beyond
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201,
        2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074,
        2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]  # fmt: skip


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% t confidence interval); half-width nan for one value."""
    x = np.asarray(values, np.float64)
    if x.size < 2:
        return float(x.mean()) if x.size else math.nan, math.nan
    t = _T95[x.size - 2] if x.size - 1 <= len(_T95) else 1.96
    return float(x.mean()), float(t * x.std(ddof=1) / math.sqrt(x.size))


def base_config(steps: int, eval_every: int, micro: bool = False, config: str = "tiny_math"):
    """`configs/<config>.py` with the loop length set (micro: a seconds-long CI version)."""
    sys.path.insert(0, os.path.join(ROOT, "configs"))
    c = importlib.import_module(config).get_config()
    c.train.steps, c.train.eval_every = steps, eval_every
    c.train.checkpoint_every = steps
    c.train.export_final = False
    c.rollout.engine = "static"  # the engine docs/results.md's studies were run with
    c.reward.fallback = "none"  # and the verifier's reading (no last-expression fallback)
    if micro:
        c.tokenizer.vocab_size = 300
        c.data.synthetic_train, c.data.synthetic_eval, c.data.synthetic_sft = 64, 16, 64
        c.rollout.prompts_per_round, c.rollout.group_size, c.rollout.max_new_tokens = 4, 4, 8
        c.rl.train_prompts, c.rl.mini_batch_prompts = 4, 2
        c.eval.num_samples, c.eval.max_prompts, c.eval.prompts_per_call = 2, 16, 16
        c.sft.steps, c.sft.batch_size, c.sft.stop_acc, c.sft.max_len = 2, 8, 0.0, 64
    return c


def set_field(c, key: str, value) -> None:
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
        node = node[p]
    node[leaf] = value


def warm_start(workdir: str, cfg) -> tuple[str, str]:
    """(sft_model folder, tokenizer folder), built once by the SFT stage."""
    from da3po_jax.run import train

    warm = os.path.join(workdir, "warm")
    model_dir, tok_dir = os.path.join(warm, "sft_model"), os.path.join(warm, "tokenizer")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        c = cfg.copy_and_resolve_references()
        c.stage = "sft"
        log.info("building the warm start in %s", warm)
        train(c, warm)
    return model_dir, tok_dir


def run_variant(workdir, cfg, name: str, seed: int, overrides: dict, warm) -> str:
    """Trains one (variant, seed) from the warm start; returns its workdir."""
    from da3po_jax.run import train

    out = os.path.join(workdir, f"{name}_n{cfg.train.steps}_s{seed}")
    if os.path.isfile(os.path.join(out, "summary.json")):
        return out
    c = cfg.copy_and_resolve_references()
    c.seed = seed
    c.sft.enable = False
    c.model.init_checkpoint, c.tokenizer.path = warm
    c.tokenizer.build_tiny = False
    for key, value in overrides.items():
        set_field(c, key, value)
    t0 = time.perf_counter()
    train(c, out)
    log.info("%s seed %d: %.0f s", name, seed, time.perf_counter() - t0)
    return out


def read_run(run_dir: str, k: int) -> dict:
    """Eval curve of a run: steps, cumulative generated samples, avg@k overall and hard."""
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    cum, total = {0: 0.0}, 0.0
    for r in rows:
        if r["kind"] == "train":
            total += r.get("samples/generated", 0.0)
            cum[r["step"]] = total
    evals = [r for r in rows if r["kind"] == "eval"]
    return {
        "step": [r["step"] for r in evals],
        "samples": [cum.get(r["step"], total) for r in evals],
        "acc": [r[f"eval/avg@{k}"] for r in evals],
        "hard": [r.get(f"eval/avg@{k}/hard", math.nan) for r in evals],
    }


def at_budget(curve: dict, budget: float, key: str, axis: str = "samples") -> float:
    """`key` at the last evaluation whose cumulative `axis` (generated samples, or tokens)
    fits in `budget`."""
    ok = [i for i, s in enumerate(curve[axis]) if s <= budget + 1e-9]
    return curve[key][ok[-1]] if ok else math.nan


def at_step(curve: dict, step: int, key: str) -> float:
    ok = [i for i, s in enumerate(curve["step"]) if s <= step]
    return curve[key][ok[-1]] if ok else math.nan


def analyse(curves: dict[str, dict[int, dict]], budgets, steps, pairs=None) -> dict:
    """Means and CIs per variant at each budget / step, and paired per-seed differences
    `a - b` for each (a, b) in `pairs` (default: every variant against the first)."""
    names = list(curves)
    out: dict = {"budget": {}, "step": {}, "paired": {}}
    for view, points, fn in (("budget", budgets, at_budget), ("step", steps, at_step)):
        for point in points:
            for name in names:
                for key in ("acc", "hard"):
                    vals = [fn(c, point, key) for c in curves[name].values()]
                    out[view].setdefault(str(point), {}).setdefault(name, {})[key] = mean_ci(vals)
    last = steps[-1]
    for name, ref in pairs or [(n, names[0]) for n in names[1:]]:
        seeds = sorted(set(curves[name]) & set(curves[ref]))
        label = name if ref == names[0] else f"{name} - {ref}"
        for key in ("acc", "hard"):
            diff = [
                at_step(curves[name][s], last, key) - at_step(curves[ref][s], last, key)
                for s in seeds
            ]
            out["paired"].setdefault(label, {})[key] = mean_ci(diff)
        for key in ("acc", "hard"):
            b = budgets[-1]
            diff = [
                at_budget(curves[name][s], b, key) - at_budget(curves[ref][s], b, key)
                for s in seeds
            ]
            out["paired"][label][f"{key}@budget"] = mean_ci(diff)
    return out


def _fmt(mc: tuple[float, float]) -> str:
    m, h = mc
    return f"{m:.3f} ± {h:.3f}" if not math.isnan(h) else f"{m:.3f}"


def markdown(result: dict, names: Sequence[str], k: int, n_seeds: int) -> str:
    lines = [f"avg@{k}, mean ± 95% CI half-width over {n_seeds} seeds.", ""]
    for view, label in (("budget", "generated samples"), ("step", "gradient steps")):
        lines += [
            f"**At equal {label}**",
            "",
            "| " + label + " | " + " | ".join(f"{n} (all) | {n} (hard)" for n in names) + " |",
            "|---" * (1 + 2 * len(names)) + "|",
        ]
        for point, per in result[view].items():
            cells = [f"{_fmt(per[n]['acc'])} | {_fmt(per[n]['hard'])}" for n in names]
            lines.append(f"| {float(point):.0f} | " + " | ".join(cells) + " |")
        lines.append("")
    if result["paired"]:
        lines += [
            f"**Paired per-seed differences** (vs {names[0]} unless named; same seed, same "
            "warm start)",
            "",
            "| variant | all @ last step | hard @ last step | all @ budget | hard @ budget |",
            "|---|---|---|---|---|",
        ]
        for name, d in result["paired"].items():
            lines.append(
                f"| {name} | {_fmt(d['acc'])} | {_fmt(d['hard'])} | "
                f"{_fmt(d['acc@budget'])} | {_fmt(d['hard@budget'])} |"
            )
    return "\n".join(lines) + "\n"


def plot(curves: dict[str, dict[int, dict]], path: str, k: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharey="col")
    for name, runs in curves.items():
        for row, x_key in enumerate(("samples", "step")):
            for col, key in enumerate(("acc", "hard")):
                xs = np.asarray([r[x_key] for r in runs.values()], np.float64)
                ys = np.asarray([r[key] for r in runs.values()], np.float64)
                n = min(map(len, xs))
                x, y = xs[:, :n].mean(0), ys[:, :n]
                m = y.mean(0)
                ax = axes[row][col]
                ax.plot(x, m, marker="o", ms=3, label=name)
                if y.shape[0] > 1:
                    h = np.asarray([mean_ci(y[:, i])[1] for i in range(n)])
                    ax.fill_between(x, m - h, m + h, alpha=0.2)
                ax.set_xlabel("generated samples" if x_key == "samples" else "gradient steps")
                ax.set_ylabel(f"held-out avg@{k}" + (" (hard tier)" if key == "hard" else ""))
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def study(
    variants: dict[str, dict],
    seeds: Sequence[int],
    steps: int,
    eval_every: int,
    workdir: str,
    out: str,
    prefix: str,
    micro: bool = False,
    pairs=None,
    extra=None,
) -> dict:
    """Runs every (variant, seed), then writes `<prefix>.json`, `.md` and `_curves.png`.
    `extra(workdir, steps, seeds)`, when given, adds its dict to the result (and the JSON)."""
    cfg = base_config(steps, eval_every, micro)
    warm = warm_start(workdir, cfg)
    k = cfg.eval.num_samples
    curves: dict[str, dict[int, dict]] = {}
    t0 = time.perf_counter()
    for seed in seeds:
        for name, overrides in variants.items():
            run = run_variant(workdir, cfg, name, seed, overrides, warm)
            curves.setdefault(name, {})[seed] = read_run(run, k)
    smallest = min(c["samples"][-1] for runs in curves.values() for c in runs.values())
    budgets = [round(smallest * f) for f in (0.25, 0.5, 0.75, 1.0)]
    step_points = sorted({max(eval_every, steps // 2), steps})
    result = analyse(curves, budgets, step_points, pairs)
    if extra is not None:
        result.update(extra(workdir, steps, seeds))
    names = list(variants)
    os.makedirs(out, exist_ok=True)
    table = markdown(result, names, k, len(seeds))
    with open(os.path.join(out, f"{prefix}.md"), "w") as f:
        f.write(table)
    with open(os.path.join(out, f"{prefix}.json"), "w") as f:
        json.dump(
            {
                "variants": variants,
                "seeds": list(seeds),
                "steps": steps,
                "result": result,
                "curves": curves,
                "wall_s": time.perf_counter() - t0,
            },
            f,
            indent=1,
        )
    plot(curves, os.path.join(out, f"{prefix}_curves.png"), k)
    print(table)
    return result


ALGOS = {"grpo": {"algo": "grpo"}, "dapo": {"algo": "dapo"}, "da3po": {"algo": "da3po"}}


def parse(argv=None, default_prefix="compare"):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--eval_every", type=int, default=25)
    p.add_argument("--quick", action="store_true", help="2 seeds, 60 steps, eval every 20")
    p.add_argument("--micro", action="store_true", help="seconds-long smoke version (CI)")
    p.add_argument("--workdir", default="/tmp/da3po_experiments")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "figures"))
    p.add_argument("--prefix", default=default_prefix)
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.eval_every = args.seeds[:2], 60, 20
    return args


def step_means(workdir: str, steps: int, seeds, names, keys) -> dict:
    """Per variant in `names`, the mean (and 95% CI over seeds) of each seed's mean of the
    train metrics `keys` over the steps after the first (which compiles)."""
    out = {}
    for name in names:
        per_seed: dict[str, list[float]] = {k: [] for k in keys}
        for seed in seeds:
            path = os.path.join(workdir, f"{name}_n{steps}_s{seed}", "metrics.jsonl")
            with open(path) as f:
                rows = [json.loads(line) for line in f]
            rows = [r for r in rows if r["kind"] == "train" and r["step"] > 1]
            for key, values in per_seed.items():
                values.append(float(np.mean([r.get(key, 0.0) for r in rows])))
        out[name] = {k: mean_ci(v) for k, v in per_seed.items()}
    return out


def run_study(args, variants: dict[str, dict], pairs, extra=None) -> dict:
    """`study` of `variants` with the command line's seeds, lengths and folders."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    return study(
        variants,
        args.seeds,
        args.steps,
        args.eval_every,
        args.workdir,
        args.out,
        args.prefix,
        args.micro,
        pairs=pairs,
        extra=extra,
    )


def timed_study(argv, prefix: str, variants: dict[str, dict], pairs, keys) -> dict:
    """`run_study` whose result also holds, under "timings", `step_means` of the train
    metrics `keys` per variant; prints them."""
    args = parse(argv, default_prefix=prefix)

    def timings(workdir: str, steps: int, seeds) -> dict:
        return {"timings": step_means(workdir, steps, seeds, variants, keys)}

    result = run_study(args, variants, pairs, extra=timings)
    for name, t in result["timings"].items():
        print(f"{name}: " + ", ".join(f"{k} {m:.3f} +- {h:.3f}" for k, (m, h) in t.items()))
    return result


def main(argv=None) -> None:
    run_study(parse(argv), ALGOS, [("dapo", "grpo"), ("da3po", "grpo"), ("da3po", "dapo")])


if __name__ == "__main__":
    main()
