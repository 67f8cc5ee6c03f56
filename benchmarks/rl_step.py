"""Time breakdown of RL steps (rollout, scoring, update, other) and tokens/s, as JSON.

    python benchmarks/rl_step.py                      # the tiny demo config, after warm-up
    python benchmarks/rl_step.py --preset=qwen2.5-0.5b --max-new-tokens=128
    python benchmarks/rl_step.py --engines=static,continuous [--slots=64 --steps-per-call=16]

With several `--engines` each runs the same steps in this process, one after the other,
and `rollout_speedup` = the first engine's median rollout time / each other's (the
continuous engine's rollout time is its wall time inside `finished()`, scoring overlapped).

The first step compiles and is reported separately; the steady-state numbers are medians
over the following steps. Models are random (nothing is downloaded); with a random policy
nothing is correct, so the benchmark runs GRPO (one generation round per step) unless a
warm-started workdir is given.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--preset", default=None, help="model preset (default: the tiny config's)")
    p.add_argument("--algo", default="grpo")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--mini-batch", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=0, help="groups (turns packing off)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--engines", default="static", help="comma-separated rollout.engine values")
    p.add_argument("--slots", type=int, default=64, help="continuous: rollout.slots")
    p.add_argument("--steps-per-call", type=int, default=16, help="continuous: decode steps/call")
    args = p.parse_args()
    engines = args.engines.split(",")
    results = {e: run(args, e) for e in engines}
    if len(engines) == 1:
        print(json.dumps(results[engines[0]], indent=2))
        return
    base = results[engines[0]]["breakdown_seconds"]["rollout"]
    speedup = {e: base / r["breakdown_seconds"]["rollout"] for e, r in results.items()}
    print(json.dumps({**results, "rollout_speedup": speedup}, indent=2))


def run(args, engine: str) -> dict:
    """The steps of one engine; returns its JSON object."""
    sys.path.insert(0, os.path.join(ROOT, "configs"))
    import tiny_math

    from da3po_jax.config import resolve_settings
    from da3po_jax.models import get_preset, init_model
    from da3po_jax.rewards import RewardScorer
    from da3po_jax.rollout import PromptEncoder
    from da3po_jax.run.build import build_trainer
    from da3po_jax.run.context import RunContext
    from da3po_jax.run.inputs import load_datasets, prompt_renderer, tokenizer_for

    c = tiny_math.get_config()
    c.algo = args.algo
    c.model.preset = args.preset or c.model.preset
    c.model.dtype = c.model.param_dtype = args.dtype
    c.rollout.prompts_per_round = c.rl.train_prompts = args.prompts
    c.rollout.group_size, c.rollout.max_new_tokens = args.group_size, args.max_new_tokens
    c.rl.mini_batch_prompts, c.rl.micro_batch_prompts = args.mini_batch, args.micro_batch
    c.rl.packing = not args.micro_batch  # micro-batches of groups are the unpacked update's
    c.train.steps, c.train.eval_every, c.train.checkpoint_every = args.steps, 0, 0
    c.sft.enable = False
    c.rollout.engine, c.rollout.slots = engine, args.slots
    c.rollout.steps_per_call = args.steps_per_call
    cfg = resolve_settings(c)
    workdir = tempfile.mkdtemp(prefix="rl_step_bench_")
    tokenizer = tokenizer_for(cfg, workdir)
    data = load_datasets(cfg.data, cfg.seed)
    encoder = PromptEncoder(tokenizer, prompt_renderer(cfg, tokenizer), cfg.rollout.buckets)
    scorer = RewardScorer(num_workers=1)
    # The preset's own shapes (vocabulary included), not resized to the tiny tokenizer.
    model = init_model(
        get_preset(
            cfg.model.preset,
            param_dtype=args.dtype,
            dtype=args.dtype,
            logits_chunk=cfg.model.logits_chunk,
        ),
        seed=0,
    )
    trainer = build_trainer(RunContext(cfg, workdir, tokenizer, encoder, data, scorer), model)
    steps = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        m = trainer.step()
        m["wall"] = time.perf_counter() - t0
        steps.append(m)
    trainer.close()
    scorer.close()

    def med(key, rows):
        return statistics.median(r[key] for r in rows)

    steady = steps[1:] or steps
    keys = ("rollout", "scoring", "update")
    parts = {k: med(f"time/{k}", steady) for k in keys}
    for r in steady:
        r["other"] = r["wall"] - sum(r[f"time/{k}"] for k in keys)
    wall = med("wall", steady)
    rows = args.prompts * args.group_size
    train_tokens = rows * (trainer.collector.engine.prompt_len + args.max_new_tokens)
    return {
        "benchmark": "rl_step",
        "engine": engine,
        "preset": c.model.preset,
        "params": model.config.num_params(),
        "algo": args.algo,
        "prompts_x_samples": f"{args.prompts}x{args.group_size}",
        "max_new_tokens": args.max_new_tokens,
        "first_step_seconds (compile)": steps[0]["wall"],
        "step_seconds": wall,
        "breakdown_seconds": {**parts, "other": med("other", steady)},
        "generated_tokens_per_step": med("response/len_mean", steady) * rows,
        "gen_tokens_per_s": med("throughput/gen_tokens_per_s", steady),
        "train_tokens_per_s": train_tokens / parts["update"],
        "update_tflops_per_s": med("perf/update_tflops_per_s", steady),
        "update_mfu": med("perf/update_mfu", steady),
        "compiles": {k: v for k, v in steps[-1].items() if k.startswith("compile/")},
    }


if __name__ == "__main__":
    main()
