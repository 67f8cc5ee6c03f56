"""OPD vs RA-OPD on the embedded tiny task (`configs/tiny_opd.py`), over seeds.

  python -m experiments.opd                      # 3 seeds x {opd, ra_opd}
  python -m experiments.opd --seeds 0 --workdir /tmp/opd_study --out docs/figures

Every run distils the same cached teacher into the same cached student start (the first
run builds both, see `configs/tiny_opd.py`); runs whose `summary.json` exists are reused.
Reports held-out avg@k at the first and last evaluation and its best value, overall and on
the hard tier (mean and 95% CI over seeds), the teacher's accuracy, RA-OPD's kept fraction,
the paired per-seed difference ra_opd - opd, and learning curves (PNG).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import numpy as np

from experiments.compare import ROOT, _fmt, mean_ci, plot, read_run

log = logging.getLogger("experiments")
ALGOS = ("opd", "ra_opd")


def tiny_opd_config(micro: bool = False):
    sys.path.insert(0, os.path.join(ROOT, "configs"))
    import tiny_opd

    c = tiny_opd.get_config()
    c.train.export_final = False
    if micro:  # seconds: a random-init teacher and student, two steps
        from experiments.compare import base_config

        m = base_config(2, 1, micro=True)
        for section in ("tokenizer", "data", "rollout", "rl", "eval", "sft"):
            c[section] = m[section]
        c.teacher.sft_steps = 2
        c.train.checkpoint_every = 2
    return c


def run(workdir: str, algo: str, seed: int, micro: bool) -> str:
    from da3po_jax.run import train

    out = os.path.join(workdir, f"{algo}_s{seed}")
    if not os.path.isfile(os.path.join(out, "summary.json")):
        c = tiny_opd_config(micro)
        c.algo, c.seed = algo, seed
        if micro:
            c.teacher.path = os.path.join(workdir, "cache", "teacher")
            c.sft.out_dir = os.path.join(workdir, "cache", "student")
        train(c, out)
    return out


def summarise(runs: dict[str, dict[int, str]], k: int) -> tuple[dict, str]:
    res: dict = {}
    for algo, by_seed in runs.items():
        rows = {"start": [], "final": [], "best": [], "hard_start": [], "hard_final": []}
        teacher, kept = [], []
        for d in by_seed.values():
            c = read_run(d, k)
            rows["start"].append(c["acc"][0])
            rows["final"].append(c["acc"][-1])
            rows["best"].append(max(c["acc"]))
            rows["hard_start"].append(c["hard"][0])
            rows["hard_final"].append(c["hard"][-1])
            summary = json.load(open(os.path.join(d, "summary.json")))
            teacher.append(summary.get("teacher", {}).get(f"eval/avg@{k}", np.nan))
            metrics = [json.loads(x) for x in open(os.path.join(d, "metrics.jsonl"))]
            fr = [m["ra_opd/kept_frac"] for m in metrics if "ra_opd/kept_frac" in m]
            kept.append(np.mean(fr) if fr else np.nan)
        res[algo] = {key: mean_ci(v) for key, v in rows.items()}
        res[algo]["teacher"] = mean_ci(teacher)
        res[algo]["kept_frac"] = mean_ci(kept)
    seeds = sorted(set(runs["opd"]) & set(runs["ra_opd"]))
    for key in ("final", "best", "hard_final"):
        diff = [_value(runs["ra_opd"][s], k, key) - _value(runs["opd"][s], k, key) for s in seeds]
        res.setdefault("paired", {})[key] = mean_ci(diff)
    n = len(seeds)
    lines = [
        f"avg@{k} on the held-out set, mean ± 95% CI half-width over {n} seeds.",
        "",
        "| algo | start | final | best | hard start | hard final | teacher | RA-OPD kept |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for algo in ALGOS:
        r = res[algo]
        cells = [r[x] for x in ("start", "final", "best", "hard_start", "hard_final", "teacher")]
        kept = _fmt(r["kept_frac"]) if algo == "ra_opd" else "–"
        lines.append(f"| {algo} | " + " | ".join(map(_fmt, cells)) + f" | {kept} |")
    p = res["paired"]
    lines += [
        "",
        f"Paired ra_opd - opd (same seed): final {_fmt(p['final'])}, best {_fmt(p['best'])}, "
        f"hard final {_fmt(p['hard_final'])}.",
    ]
    return res, "\n".join(lines) + "\n"


def _value(run_dir: str, k: int, key: str) -> float:
    c = read_run(run_dir, k)
    return {"final": c["acc"][-1], "best": max(c["acc"]), "hard_final": c["hard"][-1]}[key]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--workdir", default="/tmp/da3po_opd_study")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "figures"))
    p.add_argument("--micro", action="store_true", help="seconds-long smoke version (CI)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    runs = {a: {s: run(args.workdir, a, s, args.micro) for s in args.seeds} for a in ALGOS}
    k = tiny_opd_config(args.micro).eval.num_samples
    res, table = summarise(runs, k)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "opd.md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.out, "opd.json"), "w") as f:
        json.dump({"seeds": args.seeds, "result": res}, f, indent=1)
    curves = {a: {s: read_run(d, k) for s, d in by.items()} for a, by in runs.items()}
    plot(curves, os.path.join(args.out, "opd_curves.png"), k)
    print(table)


if __name__ == "__main__":
    main()
