"""Per-prompt difficulty of the tiny task at the warm start: the regime check for DAA.

  python -m experiments.difficulty --warm /tmp/da3po_experiments/warm --samples 16

Samples `--samples` responses per held-out prompt from the warm-start policy (the one
`experiments.compare` builds), at the rollout temperature, and reports by tier the mean
pass rate and the share of prompts whose estimated pass rate is 0, in (0, 1/8], in
(1/8, 1/2), in [1/2, 1) and 1, plus a histogram (PNG). Dynamic sampling and DAA matter
on the prompts with small but nonzero pass rates.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict

import numpy as np

from experiments.compare import ROOT, base_config

BINS = (("0", 0.0, 0.0), ("(0,1/8]", 1e-9, 0.125), ("(1/8,1/2)", 0.125 + 1e-9, 0.5 - 1e-9),
        ("[1/2,1)", 0.5, 1 - 1e-9), ("1", 1.0, 1.0))  # fmt: skip


def pass_rates(
    warm: str, samples: int, seed: int = 0, split: str = "heldout", cfg=None, limit: int = 0
) -> tuple[np.ndarray, list[str]]:
    """[num_prompts] pass-rate estimates on `split` ("heldout" or "train"; the first
    `limit` of its prompts when > 0), and the prompts' tiers. `cfg`: the study's config
    (default the tiny task's)."""
    import jax

    from da3po_jax.config import resolve_settings
    from da3po_jax.models.tokenizer import Tokenizer
    from da3po_jax.rewards import RewardScorer
    from da3po_jax.rollout import PromptEncoder
    from da3po_jax.rollout.static import sample_and_score
    from da3po_jax.run.inputs import load_datasets, policy_model, prompt_renderer
    from da3po_jax.sampling import GenerateConfig, Sampler

    c = (base_config(1, 1) if cfg is None else cfg).copy_and_resolve_references()
    c.seed, c.stage, c.sft.enable = seed, "rl", False
    c.tokenizer.build_tiny, c.tokenizer.path = False, os.path.join(warm, "tokenizer")
    c.model.init_checkpoint = os.path.join(warm, "sft_model")
    cfg = resolve_settings(c)
    tok = Tokenizer.load(cfg.tokenizer.path)
    model = policy_model(cfg.model, tok, seed=cfg.seed, path=cfg.model.init_checkpoint)
    from flax import nnx

    graphdef, params = nnx.split(model)
    gen = GenerateConfig(
        num_samples=samples,
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        stop_ids=tok.eos_ids,
        pad_id=tok.pad_id,
    )
    data = load_datasets(cfg.data, cfg.seed)
    encoder = PromptEncoder(tok, prompt_renderer(cfg, tok), cfg.rollout.buckets)
    scorer = RewardScorer(num_workers=1, timeout_s=cfg.reward.timeout_s)
    try:
        sampler = Sampler(graphdef, model.config, gen)
        problems, chunk, rates = getattr(data, split), 50, []
        problems = problems[:limit] if limit > 0 else problems
        for start in range(0, len(problems), chunk):
            part = list(problems[start : start + chunk])
            part += [part[i % len(part)] for i in range(chunk - len(part))]
            _, host = sample_and_score(
                sampler,
                params,
                part,
                jax.random.PRNGKey(start),
                encoder=encoder,
                scorer=scorer,
                gen=gen,
            )
            rates.extend(host.correct.mean(axis=1)[: len(problems) - start])
    finally:
        scorer.close()
    return np.asarray(rates[: len(problems)]), [p.tier or "all" for p in problems]


def table(rates: np.ndarray, tiers: list[str], bins=BINS) -> tuple[dict, str]:
    by = defaultdict(list)
    for r, t in zip(rates, tiers):
        by[t].append(r)
    by["all"] = list(rates)
    out, lines = {}, []
    head = "| tier | prompts | mean pass rate | " + " | ".join(b[0] for b in bins) + " |"
    lines += [head, "|---" * (3 + len(bins)) + "|"]
    for tier in sorted(by, key=lambda t: (t == "all", t)):
        x = np.asarray(by[tier], np.float64)  # float32 would round the bin edges
        shares = [float(((x >= lo) & (x <= hi)).mean()) for _, lo, hi in bins]
        out[tier] = {"n": int(x.size), "mean": float(x.mean()), "shares": shares}
        cells = " | ".join(f"{s:.2f}" for s in shares)
        lines.append(f"| {tier} | {x.size} | {x.mean():.3f} | {cells} |")
    return out, "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--warm", default="/tmp/da3po_experiments/warm")
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "figures"))
    args = p.parse_args(argv)
    rates, tiers = pass_rates(args.warm, args.samples)
    res, md = table(rates, tiers)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "difficulty.md"), "w") as f:
        f.write(f"Pass rates of the warm start, {args.samples} samples per held-out prompt.\n\n")
        f.write(md)
    with open(os.path.join(args.out, "difficulty.json"), "w") as f:
        json.dump(res, f, indent=1)
    plot_hist(rates, tiers, args.samples, os.path.join(args.out, "difficulty.png"))
    print(md)


def plot_hist(
    rates, tiers, samples: int, path: str, what: str = "held-out prompts", mark=None, xmax=1.0
) -> None:
    """Histogram of per-prompt pass rates by tier (one bar per possible count); `mark`: a
    pass rate to draw as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    edges = (np.arange(samples + 2) - 0.5) / samples  # one bar per count k, centred on k / n
    names = sorted(set(tiers))
    per_tier = [[r for r, t in zip(rates, tiers) if t == tier] for tier in names]
    ax.hist(per_tier, bins=edges, stacked=True, label=names)
    if mark is not None:
        ax.axvline(mark, color="k", linestyle="--", linewidth=1)
    ax.set_xlim(-0.5 / samples, xmax)
    ax.set_xlabel(f"per-prompt pass rate ({samples} samples)")
    ax.set_ylabel(what)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
