"""`benchmarks/rollout.py --rl_steps=R`: R consecutive RL steps of one workload through the
slot decoder, with partial rollouts (groups carried across steps) against per-step
continuous batching (every step drained), in the same process.

    python benchmarks/rollout.py --rl_steps=8 --mean=150 --max_new=1024 --slots=64
    python benchmarks/rollout.py --rl_steps=8 --mean=500 --max_new=4096 --slots=64

The model, stop ids and prompts are `rollout.py`'s (random weights; response lengths
roughly geometric with mean --mean, capped at --max_new). Each step's batch is P =
--prompts groups of G = --group samples; prompt i of the stream is sampled with key i.

- `continuous`: step k submits prompts [kP, (k+1)P) and decodes until all P groups have
  finished (the drain: slots idle while the step's longest rows finish).
- `partial` (`rollout.partial_kv = "keep"`) and `partial_recompute` (`"recompute"`):
  prompts are admitted from the stream as the collector does, while the step has fewer
  than P finished groups and fewer than 4 x S / G prompts are in flight; the step ends
  once it has P finished groups (groups finishing beyond P go to the next step's batch,
  like the dynamic-sampling surplus) and no group admitted at a version <= k -
  --max_staleness is in flight. Then the version is bumped (the weights stay the same
  numbers: the benchmark measures generation, not learning) and, with recompute, the
  cache is freed and every row in flight prefilled anew, as a run does around its update.

Per mode: `wall_s` (R steps, compiled before the clock; `traces_during_run` says whether
anything compiled), `utilization` = decode tokens / slot-steps over the R steps (decode
tokens = every generated token but each row's first, including rows still in flight at
the end), `useful_tok_s` = response tokens of the R x P groups the steps' batches consume
/ `wall_s`, `staleness_hist` = {lag: share of those tokens sampled `lag` versions before
the step that consumes them}, `mixed_groups` (consumed groups with tokens of more than
one version), `steps_s` (wall seconds of each step), and `refill_calls` for recompute.
Top level: `speedup` = partial `useful_tok_s` / continuous `useful_tok_s` (and
`speedup_recompute`), and `utilization_bound_per_step`: the best utilization an engine that
drains every step could reach on the per-step run's lengths (`rollout.py:
utilization_bound` per step, token-weighted).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time

import jax
import numpy as np

from da3po_jax.sampling.continuous import SlotConfig, SlotDecoder, trace_counts
from da3po_jax.sampling.slots import init_slots, refill_slots


def _stream(args, vocab: int, count: int):
    """`count` prompts (token id lists) and their keys, as `rollout.make_workload`."""
    from rollout import make_workload

    wide = type(args)(**{**vars(args), "prompts": count})
    prompts, keys, _ = make_workload(wide, vocab)  # the stop ids are drawn first: the same
    return prompts, keys


def warm_refill(graphdef, state, cfg, gen, sc: SlotConfig) -> None:
    """Compiles `refill_slots` for every width the run can ask for (attention blocks)."""
    r = sc.resolved(gen.num_samples)
    slots = init_slots(cfg, gen, r)
    h = r.read_rows
    rows = np.full((h,), r.slots, np.int32)
    prompts = np.zeros((h, r.prompt_len), np.int32)
    for width in range(r.block, slots.cache.max_len + 1, r.block):
        slots = refill_slots(
            graphdef, state, slots, rows, prompts, np.ones((h,), np.int32), gen=gen, width=width
        )
    jax.block_until_ready(slots)


def _consume(batch: list, version: int, hist: collections.Counter) -> tuple[int, int]:
    """Adds the consumed groups' token lags to `hist`; (response tokens, mixed groups)."""
    tokens = mixed = 0
    for gr in batch:
        mask = gr.mask
        lags = version - gr.version[mask]
        hist.update(lags.tolist())
        tokens += int(mask.sum())
        mixed += int(np.unique(gr.version[mask]).size > 1)
    return tokens, mixed


def run_steps(graphdef, state, cfg, gen, sc, stream, args, mode: str) -> dict:
    """R steps of `mode` ("continuous", "partial" or "partial_recompute")."""
    prompts, keys = stream
    p, g, r_steps = args.prompts, args.group, args.rl_steps
    dec = SlotDecoder(graphdef, cfg, gen, sc)
    max_in_flight = 4 * max(1, sc.slots // g)
    traces = sum(trace_counts().values())
    nxt, pending, hist = 0, [], collections.Counter()
    useful = mixed = refills = 0
    steps_s, lengths = [], []
    start = time.perf_counter()
    for version in range(r_steps):
        t0 = time.perf_counter()
        if version:
            dec.set_version(version)
            if mode == "partial_recompute" and dec.live_groups():
                dec.drop_cache()  # as `release` does around the update
                dec.refill(state)
                refills += 1
        if mode == "continuous":
            for i in range(version * p, (version + 1) * p):
                dec.submit(i, prompts[i], keys[i])
        while True:
            if mode != "continuous":
                live = len(dec.live_groups()) + len(dec._queue)
                room = min(dec.free_groups(), max_in_flight - live)
                while len(pending) < p and room > 0 and nxt < len(prompts):
                    dec.submit(nxt, prompts[nxt], keys[nxt])
                    nxt, room = nxt + 1, room - 1
            overdue = any(
                gr.start_version <= version - args.max_staleness for gr in dec.live_groups()
            )
            if len(pending) >= p and (mode == "continuous" or not overdue):
                break
            if not dec.busy():
                raise RuntimeError(f"{mode}: the prompt stream ran out at step {version}")
            pending.extend(dec.step(state))
        batch, pending = pending[:p], pending[p:]
        tok, mix = _consume(batch, version, hist)
        useful, mixed = useful + tok, mixed + mix
        lengths.append(np.concatenate([gr.lengths for gr in batch]))
        steps_s.append(time.perf_counter() - t0)
    wall = time.perf_counter() - start
    in_flight = sum(int(dec._steps[s]) - 1 for s in dec._owner)
    decode_tokens = dec.decode_tokens + in_flight
    total = sum(hist.values())
    out = {
        "wall_s": wall,
        "decode_steps": dec.decode_steps,
        "slot_steps": dec.slot_steps,
        "decode_tokens": decode_tokens,
        "utilization": decode_tokens / max(dec.slot_steps, 1),
        "useful_tokens": useful,
        "useful_tok_s": useful / wall,
        "staleness_hist": {str(k): hist[k] / total for k in sorted(hist)},
        "mixed_groups": mixed / (r_steps * p),
        "steps_s": steps_s,
        "prompts_used": nxt if mode != "continuous" else r_steps * p,
        "traces_during_run": sum(trace_counts().values()) - traces,
    }
    if mode == "partial_recompute":
        out["refill_calls"] = refills
    dec.clear()
    return out, lengths


def per_step_bound(args, lengths_by_step: list[np.ndarray]) -> float:
    from rollout import utilization_bound

    tokens = [int(np.sum(x - 1)) for x in lengths_by_step]
    bounds = [utilization_bound(x, args.slots) for x in lengths_by_step]
    return float(np.dot(tokens, bounds) / max(sum(tokens), 1))


def main_steps(args, graphdef, state, cfg, gen) -> None:
    """Runs the three modes on one stream and prints the JSON report."""
    from rollout import warm_continuous

    p, r_steps = args.prompts, args.rl_steps
    # the partial modes read ahead of the R x P prompts the continuous run uses
    stream = _stream(args, cfg.vocab_size, r_steps * p + 8 * max(1, args.slots // args.group))
    sc = SlotConfig(args.slots, args.prompt_len, args.steps_per_call, args.block)
    load_start = os.getloadavg()
    warm_continuous(graphdef, state, cfg, gen, sc, stream[1])
    t = time.perf_counter()
    warm_refill(graphdef, state, cfg, gen, sc)
    log(f"refill: compiled in {time.perf_counter() - t:.1f}s")
    report = {"benchmark": "rollout_steps", "device": str(jax.devices()[0].device_kind)}
    report["workload"] = {k: v for k, v in vars(args).items() if k != "profile"}
    for mode in ("continuous", "partial", "partial_recompute"):
        log(f"{mode}: {r_steps} steps")
        report[mode], step_lengths = run_steps(graphdef, state, cfg, gen, sc, stream, args, mode)
        log(f"{mode}: {report[mode]['wall_s']:.1f}s")
        if mode == "continuous":  # each step's batch is that step's P prompts
            lengths = step_lengths
    report["utilization_bound_per_step"] = per_step_bound(args, lengths)
    report["len_mean"] = float(np.concatenate(lengths).mean())
    report["speedup"] = report["partial"]["useful_tok_s"] / report["continuous"]["useful_tok_s"]
    report["speedup_recompute"] = (
        report["partial_recompute"]["useful_tok_s"] / report["continuous"]["useful_tok_s"]
    )
    report["load_avg_start"], report["load_avg_end"] = load_start, os.getloadavg()
    print(json.dumps(report, indent=1))


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)
