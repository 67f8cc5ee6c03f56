"""Rollout throughput of continuous batching against the static sampler, same prompts and keys.

    python benchmarks/rollout.py --workload=geometric --mean=150 --max_new=1024 --slots=64
        [--prompts=32 --group=8 --prompt_len=64 --steps_per_call=16 --block=128 --seed=0]
        [--profile]
    python benchmarks/rollout.py --workload=geometric --mean=500 --max_new=4096 --slots=64
    python benchmarks/rollout.py --rl_steps=8 [--max_staleness=1] [workload flags as above]

With --rl_steps=R the benchmark is `rollout_steps.py`'s instead: R consecutive RL steps,
partial rollouts against per-step continuous batching (see that module).

Model: random weights, 4 layers, hidden 256, vocab 4096 (the `tiny-math` preset widened),
float32, temperature 1. A random model's next-token distribution is close to uniform, so
with `stop_ids` = round(vocab / mean) stop ids every step stops with probability about
stop_ids / vocab: response lengths are roughly geometric with the requested mean, capped at
`max_new` (the "long-tailed" workload is `--mean=500 --max_new=4096`). The measured mean
and max length are reported (`len_mean`, `len_max`, `truncated` = fraction of rows that hit
the cap).

Workload: P = --prompts prompts of random token ids, lengths uniform in
[prompt_len / 2, prompt_len], G = --group samples each (R = P * G rows); prompt p is sampled
with key p of `jax.random.split(key(seed), P)` by both engines, in the same process, so the
two engines draw the same tokens wherever their logits agree (see `same_lengths`).

Both engines use the same device batch width S = --slots:
- static: `generate_with_cache` over ceil(P / (S // G)) calls of S // G prompts (S rows
  when G divides S), left-padded to [S // G, prompt_len]; the last call is filled up with
  copies of its last prompt (their rows cost steps but are not counted as tokens). Each
  call decodes until its longest row stops (or `max_new`), the cache donated call to call.
- continuous: `generate_continuous` with `SlotConfig(S, prompt_len, steps_per_call,
  block)`: a group of G slots is admitted whenever G slots are free, so freed slots are
  refilled instead of idling until the batch's longest row ends. With R = S it could gain
  nothing over one static call; R should be several times S (the default 32 x 8 = 256 rows
  against 64 slots).

Both are compiled before the clock starts (the static call ahead of time, the continuous
engine's jitted functions by calls on empty slots of the same shapes) and the number of
traces of the generate / admit / decode / read functions during the measured runs is
reported (`traces_during_run`, 0 expected). Each engine's wall time covers everything up to
host copies of the tokens, log-probs and lengths.

Numbers, per engine:
- `wall_s`: wall seconds of the whole rollout.
- `decode_steps`: decode steps run (static: sum over calls of `num_steps`; continuous: the
  decoder's `decode_steps`).
- `utilization` = decode tokens / decode slot-steps, decode tokens being every response
  token but each row's first (the prefill draws it): static sum_calls(sum(lengths) - rows)
  / sum_calls(S x num_steps); continuous `decode_tokens / slot_steps`.
- `useful_tok_s` = total response tokens (stop tokens included, fill-up rows excluded) /
  `wall_s`.
- `step_s` = `wall_s / decode_steps` (everything included: prefill, admission, host work).
- continuous also: its counters `slot_steps`, `decode_tokens`; static also `per_call`
  (wall seconds, steps and longest row of each call).
Top level:
- `speedup` = continuous `useful_tok_s` / static `useful_tok_s`.
- `utilization_bound`: the best utilization any S-slot engine could reach on the measured
  lengths, decode tokens / (S x max(ceil(decode tokens / S), longest row - 1)): no engine
  runs fewer steps than its longest row, so with few rows per slot the drain after the
  last admission caps utilization well below 1 whatever the engine does.
- `same_lengths`, `lengths_equal_frac`, `tokens_equal_frac`: per (prompt, sample) row, both
  engines agree on the length / on every token. They share keys but not arithmetic (the
  static path attends over its whole masked cache, the slots block by block with an online
  softmax), so log-probs agree only to float rounding (`logp_max_abs_diff`, over each row's
  common prefix) and an inverse-CDF draw can flip where a uniform falls that close to a
  CDF boundary; a flipped token changes the rest of its row (`diverged_rows`: the first
  16, with the first differing position).
- `load_avg_start` / `load_avg_end`: the machine's load averages (shared machines are
  noisy; compare runs made under similar load).

Per-step costs differ too, not only step counts: a static decode step attends over the
whole [prompt_len + max_new - 1] cache of every row, a slot decode step over the blocks
below the longest live slot (`decode_attention`), so one long row makes every slot's step
cost as much as if all were that long.

With --profile, a second continuous run follows the measured one with the engine's three
jitted functions wrapped to count calls and time them to completion, each decode call's
slot state read before and after it (`continuous_profile`: calls and seconds of admission,
decode and read-back calls, `host_other_s` the rest of the wall time; `phases`: `fill` =
decode calls while prompts are still waiting for slots, `drain` = after the last admission,
each with its utilization, seconds per step and `attention_block_utilization` = blocks of
live keys / blocks visited (S x the longest live slot's blocks), from the lengths at each
call's start), plus one decode call of K steps right after filling every slot
(`full_decode_call`). The wrapped calls are synchronous, so the profiled run is slightly
slower than the measured one.

Prints one JSON object to stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from da3po_jax.models import get_preset, init_model
from da3po_jax.sampling import (
    GenerateConfig,
    continuous,
    generate_with_cache,
    new_cache,
    trace_count,
)
from da3po_jax.sampling.continuous import SlotConfig, generate_continuous, trace_counts


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def model_config(decode_attention: str = "auto"):
    """4 layers, hidden 256, vocab 4096; the context fits the long-tailed workload."""
    return get_preset(
        "tiny-math",
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=768,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        max_position_embeddings=16384,
        decode_attention=decode_attention,
    )


def make_workload(args, vocab: int):
    """Prompts (token id lists), per-prompt keys and the stop ids."""
    rng = np.random.default_rng(args.seed)
    n_stop = max(1, round(vocab / args.mean))
    stop_ids = tuple(
        int(i) for i in np.sort(rng.choice(np.arange(1, vocab), n_stop, replace=False))
    )
    lo = max(1, args.prompt_len // 2)
    lengths = rng.integers(lo, args.prompt_len + 1, args.prompts)
    prompts = [rng.integers(1, vocab, n).astype(np.int32).tolist() for n in lengths]
    keys = jax.random.split(jax.random.key(args.seed), args.prompts)
    return prompts, keys, stop_ids


# ----------------------------------------------------------------------------- static
def static_batches(prompts, keys, per_call: int, prompt_len: int, pad_id: int):
    """[(tokens [A, Tp], mask [A, Tp], keys [A], real prompts in the call)], left-padded;
    the last call is filled up with copies of its last prompt."""
    out = []
    for start in range(0, len(prompts), per_call):
        idx = list(range(start, min(start + per_call, len(prompts))))
        real = len(idx)
        idx += [idx[-1]] * (per_call - real)
        tokens = np.full((per_call, prompt_len), pad_id, np.int32)
        mask = np.zeros((per_call, prompt_len), bool)
        for a, p in enumerate(idx):
            ids = prompts[p]
            tokens[a, prompt_len - len(ids) :] = ids
            mask[a, prompt_len - len(ids) :] = True
        out.append((tokens, mask, keys[np.asarray(idx)], real))
    return out


def run_static(graphdef, state, cfg, batches, gen: GenerateConfig) -> dict:
    """All calls, timed (the compile happens first, ahead of time)."""
    tokens0, mask0, keys0, _ = batches[0]
    cache = new_cache(cfg, jnp.asarray(tokens0), gen)
    t = time.perf_counter()
    generate_with_cache.lower(
        graphdef, state, cache, jnp.asarray(tokens0), jnp.asarray(mask0), keys0, config=gen
    ).compile()
    log(f"static: compiled in {time.perf_counter() - t:.1f}s")
    traces = trace_count()
    lengths, tokens_out, logp_out, calls = [], [], [], []
    jax.block_until_ready(cache)
    start = time.perf_counter()
    for tokens, mask, keys, real in batches:
        t = time.perf_counter()
        out, cache = generate_with_cache(
            graphdef, state, cache, jnp.asarray(tokens), jnp.asarray(mask), keys, config=gen
        )
        out = jax.device_get(out)
        calls.append({"wall_s": time.perf_counter() - t, "num_steps": int(out.num_steps)})
        lengths.append(np.asarray(out.lengths)[:real])
        tokens_out.append(np.asarray(out.tokens)[:real].reshape(-1, gen.max_new_tokens))
        logp_out.append(np.asarray(out.logp)[:real].reshape(-1, gen.max_new_tokens))
        calls[-1]["max_len"] = int(out.lengths.max())
        calls[-1]["all_lengths"] = np.asarray(out.lengths)
        log(
            f"static: call {len(calls)}/{len(batches)}: {calls[-1]['num_steps']} steps, "
            f"{calls[-1]['wall_s']:.2f}s"
        )
    wall = time.perf_counter() - start
    lengths = np.concatenate(lengths).reshape(-1)
    rows = sum(c["all_lengths"].size for c in calls)
    dec_tokens = sum(int(c["all_lengths"].sum()) - c["all_lengths"].size for c in calls)
    slot_steps = sum(c["all_lengths"].size * c["num_steps"] for c in calls)
    steps = sum(c["num_steps"] for c in calls)
    return {
        "lengths": lengths,
        "tokens": np.concatenate(tokens_out),
        "logp": np.concatenate(logp_out),
        "report": {
            "calls": len(calls),
            "rows_per_call": int(calls[0]["all_lengths"].size),
            "rows_run": rows,
            "wall_s": wall,
            "decode_steps": steps,
            "slot_steps": slot_steps,
            "decode_tokens": dec_tokens,
            "utilization": dec_tokens / max(slot_steps, 1),
            "useful_tok_s": float(lengths.sum()) / wall,
            "step_s": wall / max(steps, 1),
            "per_call": [
                {
                    k: round(v, 4) if isinstance(v, float) else v
                    for k, v in c.items()
                    if k != "all_lengths"
                }
                for c in calls
            ],
            "traces_during_run": trace_count() - traces,
        },
    }


# ------------------------------------------------------------------------- continuous
def warm_continuous(graphdef, state, cfg, gen: GenerateConfig, sc: SlotConfig, keys):
    """Compiles admission, decode and read-back on empty slots of the run's shapes."""
    r = sc.resolved(gen.num_samples)
    a, g = r.admit_prompts, gen.num_samples
    t = time.perf_counter()
    slots = continuous.init_slots(cfg, gen, r)
    slots = continuous.admit_groups(
        graphdef,
        state,
        slots,
        jnp.asarray(np.zeros((a, r.prompt_len), np.int32)),
        jnp.asarray(np.ones((a,), np.int32)),
        jnp.asarray(np.full((a, g), r.slots, np.int32)),  # slot S: every write dropped
        jnp.stack([keys[0]] * a),
        gen=gen,
    )
    slots, _ = continuous.decode_steps(graphdef, state, slots, gen=gen, steps=r.steps_per_call)
    jax.block_until_ready(
        continuous.read_rows(slots, jnp.asarray(np.zeros((r.read_rows,), np.int32)))
    )
    log(f"continuous: compiled in {time.perf_counter() - t:.1f}s")
    for x in jax.tree.leaves(slots):
        x.delete()
    return r


def run_continuous(graphdef, state, prompts, keys, gen: GenerateConfig, sc: SlotConfig):
    traces = sum(trace_counts().values())
    start = time.perf_counter()
    groups, dec = generate_continuous(graphdef, state, prompts, keys, gen, sc)
    wall = time.perf_counter() - start
    lengths = np.concatenate([np.asarray(grp.lengths) for grp in groups])
    log(f"continuous: {dec.decode_steps} steps, {wall:.2f}s")
    return {
        "lengths": lengths,
        "tokens": np.concatenate([grp.tokens for grp in groups]),
        "logp": np.concatenate([grp.logp for grp in groups]),
        "truncated": np.concatenate([grp.truncated for grp in groups]),
        "report": {
            "wall_s": wall,
            "decode_steps": dec.decode_steps,
            "slot_steps": dec.slot_steps,
            "decode_tokens": dec.decode_tokens,
            "utilization": dec.decode_tokens / max(dec.slot_steps, 1),
            "useful_tok_s": float(lengths.sum()) / wall,
            "step_s": wall / max(dec.decode_steps, 1),
            "traces_during_run": sum(trace_counts().values()) - traces,
        },
    }


def profile_continuous(graphdef, state, cfg, prompts, keys, gen, sc, resolved):
    """A second continuous run with the jitted functions timed to completion and every
    decode call's slot state read before and after it, then one decode call of K steps with
    every slot running (see the module docstring)."""
    names = ("admit_groups", "decode_steps", "read_rows")
    originals = {n: getattr(continuous, n) for n in names}
    stats = {n: {"calls": 0, "s": 0.0} for n in names}
    s_, block, n_prompts = resolved.slots, resolved.block, len(prompts)
    admitted = [0]
    phases = {
        name: {
            "decode_calls": 0,
            "decode_steps": 0,
            "decode_tokens": 0,
            "decode_s": 0.0,
            "blocks_needed": 0,
            "blocks_visited": 0,
        }
        for name in ("fill", "drain")
    }
    short_calls = [0]

    def timed(name):
        fn = originals[name]

        def wrapper(*a, **k):
            before = None
            if name == "decode_steps":  # read before the call: it donates the slots
                before = jax.device_get((a[2].running, a[2].step, a[2].length))
            t = time.perf_counter()
            out = jax.block_until_ready(fn(*a, **k))
            dt = time.perf_counter() - t
            stats[name]["calls"] += 1
            stats[name]["s"] += dt
            if name == "admit_groups":
                admitted[0] += int(np.sum(np.any(np.asarray(a[5]) < s_, axis=1)))
            if name == "decode_steps":
                running, step0, length = before
                ran, step1 = int(out[1]), np.asarray(jax.device_get(out[0].step))
                ph = phases["fill" if admitted[0] < n_prompts else "drain"]
                ph["decode_calls"] += 1
                ph["decode_steps"] += ran
                ph["decode_tokens"] += int(np.sum(step1 - step0))
                ph["decode_s"] += dt
                live = length[running] + 1  # keys attended at the call's first step
                if live.size:
                    ph["blocks_needed"] += ran * int(np.sum(-(-live // block)))
                    ph["blocks_visited"] += ran * s_ * int(-(-live.max() // block))
                short_calls[0] += ran < sc.steps_per_call
            return out

        return wrapper

    for n in names:
        setattr(continuous, n, timed(n))
    try:
        start = time.perf_counter()
        _, dec = generate_continuous(graphdef, state, prompts, keys, gen, sc)
        wall = time.perf_counter() - start
    finally:
        for n, fn in originals.items():
            setattr(continuous, n, fn)
    report = {"wall_s": wall, "decode_steps": dec.decode_steps}
    for n, st in stats.items():
        report[n] = {
            "calls": st["calls"],
            "s": st["s"],
            "s_per_call": st["s"] / max(st["calls"], 1),
        }
    report["host_other_s"] = wall - sum(st["s"] for st in stats.values())
    report["decode_s_per_step"] = stats["decode_steps"]["s"] / max(dec.decode_steps, 1)
    report["decode_calls_short"] = short_calls[0]
    for ph in phases.values():
        ph["utilization"] = ph["decode_tokens"] / max(s_ * ph["decode_steps"], 1)
        ph["s_per_step"] = ph["decode_s"] / max(ph["decode_steps"], 1)
        ph["attention_block_utilization"] = ph["blocks_needed"] / max(ph["blocks_visited"], 1)
    report["phases"] = phases

    # one decode call with all S slots running, right after admitting S // G prompts
    a, g = resolved.admit_prompts, gen.num_samples
    take = min(a, n_prompts, s_ // g)
    tokens = np.zeros((a, resolved.prompt_len), np.int32)
    lengths = np.ones((a,), np.int32)
    slot_ids = np.full((a, g), s_, np.int32)
    for i in range(take):
        tokens[i, : len(prompts[i])], lengths[i] = prompts[i], len(prompts[i])
        slot_ids[i] = np.arange(i * g, (i + 1) * g)
    slots = continuous.admit_groups(
        graphdef,
        state,
        continuous.init_slots(cfg, gen, resolved),
        jnp.asarray(tokens),
        jnp.asarray(lengths),
        jnp.asarray(slot_ids),
        jnp.stack([keys[i % n_prompts] for i in range(a)]),
        gen=gen,
    )
    running = int(jax.device_get(slots.running).sum())
    t = time.perf_counter()
    slots, ran = continuous.decode_steps(graphdef, state, slots, gen=gen, steps=sc.steps_per_call)
    ran = int(jax.device_get(ran))
    dt = time.perf_counter() - t
    report["full_decode_call"] = {
        "running_at_start": running,
        "steps": ran,
        "s": dt,
        "s_per_step": dt / max(ran, 1),
    }
    return report


# ------------------------------------------------------------------------------- main
def agreement(static: dict, cont: dict) -> dict:
    """Lengths, tokens and log-probs of the two engines, row by row."""
    ls, lc = static["lengths"], cont["lengths"]
    same_len = ls == lc
    same_tok = np.all(static["tokens"] == cont["tokens"], axis=1) & same_len
    diffs, diverged = [], []
    for r in range(ls.size):
        m = min(ls[r], lc[r])
        differ = np.flatnonzero(static["tokens"][r, :m] != cont["tokens"][r, :m])
        first = int(differ[0]) if differ.size else int(m)
        if first:  # log-probs of the common prefix (same context, same token)
            diffs.append(np.max(np.abs(static["logp"][r, :first] - cont["logp"][r, :first])))
        if not same_tok[r]:
            diverged.append(
                {
                    "row": r,
                    "first_diff": first,
                    "static_len": int(ls[r]),
                    "continuous_len": int(lc[r]),
                }
            )
    return {
        "same_lengths": bool(same_len.all()),
        "lengths_equal_frac": float(same_len.mean()),
        "tokens_equal_frac": float(same_tok.mean()),
        "logp_max_abs_diff": float(max(diffs, default=0.0)),
        "diverged_rows": diverged[:16],
    }


def utilization_bound(lengths: np.ndarray, slots: int) -> float:
    """The best utilization any S-slot engine can reach on these lengths: decode tokens /
    (S x max(ceil(decode tokens / S), longest row - 1)), no engine needing fewer steps than
    its longest row."""
    tokens = int(np.sum(lengths - 1))
    return tokens / (slots * max(-(-tokens // slots), int(lengths.max()) - 1, 1))


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="geometric", choices=["geometric"])
    ap.add_argument("--mean", type=float, default=150.0, help="target mean response length")
    ap.add_argument("--max_new", type=int, default=1024)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt_len", type=int, default=64)
    ap.add_argument("--steps_per_call", type=int, default=16)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="time the continuous engine's parts")
    ap.add_argument(
        "--rl_steps", type=int, default=0, help="R > 0: R RL steps, partial vs per-step"
    )
    ap.add_argument("--max_staleness", type=int, default=1, help="partial rollouts' bound")
    ap.add_argument(
        "--decode_attention", default="auto", help="the slots' decode attention (auto: paged)"
    )
    args = ap.parse_args(argv)
    if args.slots < args.group:
        ap.error(f"--slots={args.slots} must hold one group of --group={args.group}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    cfg = model_config(args.decode_attention)
    graphdef, state = nnx.split(init_model(cfg, args.seed))
    prompts, keys, stop_ids = make_workload(args, cfg.vocab_size)
    gen = GenerateConfig(
        num_samples=args.group, max_new_tokens=args.max_new, temperature=1.0, stop_ids=stop_ids
    )
    if args.rl_steps:
        from rollout_steps import main_steps

        return main_steps(args, graphdef, state, cfg, gen)
    sc = SlotConfig(
        slots=args.slots,
        prompt_len=args.prompt_len,
        steps_per_call=args.steps_per_call,
        block=args.block,
    )
    load_start = os.getloadavg()
    per_call = args.slots // args.group
    rows = args.prompts * args.group
    log(
        f"workload: {args.prompts} prompts x {args.group} = {rows} rows, {args.slots} slots, "
        f"{len(stop_ids)} stop ids, max_new {args.max_new}"
    )

    batches = static_batches(prompts, keys, per_call, args.prompt_len, gen.pad_id)
    static = run_static(graphdef, state, cfg, batches, gen)
    resolved = warm_continuous(graphdef, state, cfg, gen, sc, keys)
    cont = run_continuous(graphdef, state, prompts, keys, gen, sc)

    lc = cont["lengths"]
    agree = agreement(static, cont)
    report = {
        "benchmark": "rollout",
        "device": str(jax.devices()[0].device_kind),
        "backend": jax.default_backend(),
        "model": {
            "num_layers": cfg.num_layers,
            "hidden_size": cfg.hidden_size,
            "vocab_size": cfg.vocab_size,
            "params": cfg.num_params(),
            "dtype": cfg.dtype,
        },
        "workload": {
            "name": args.workload,
            "mean": args.mean,
            "max_new": args.max_new,
            "prompts": args.prompts,
            "group": args.group,
            "rows": rows,
            "slots": args.slots,
            "prompt_len": args.prompt_len,
            "steps_per_call": args.steps_per_call,
            "block": args.block,
            "seed": args.seed,
            "temperature": 1.0,
            "static_calls": math.ceil(args.prompts / per_call),
        },
        "stop_ids": len(stop_ids),
        "len_mean": float(lc.mean()),
        "len_max": int(lc.max()),
        "truncated": float(np.mean(cont["truncated"])),
        "utilization_bound": utilization_bound(lc, args.slots),
        **agree,
        "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
        "speedup": cont["report"]["useful_tok_s"] / static["report"]["useful_tok_s"],
        "static": static["report"],
        "continuous": cont["report"],
    }
    if not agree["same_lengths"]:
        report["static_len_mean"] = float(static["lengths"].mean())
    if args.profile:
        log("continuous: profiling run")
        report["continuous_profile"] = profile_continuous(
            graphdef, state, cfg, prompts, keys, gen, sc, resolved
        )
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
