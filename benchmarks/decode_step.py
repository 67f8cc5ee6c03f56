"""What one decode step of the slot engine costs, and how much of it is attention over the
live keys, on `rollout.py`'s model (4 layers, hidden 256, vocab 4096, 64 slots).

    python benchmarks/decode_step.py [--mean=500 --max_new=4096 --decode_attention=paged]

Each slot holds a response of a length drawn as the workload draws them (roughly geometric
with mean --mean, capped at --max_new; a slot seen at a random decode step holds a row
drawn in proportion to its length, at a uniform point of it) behind a 48-token prompt.
Timed (median of --repeats jitted steps, the cache updated in place):

- `full`: every slot live at those contexts (what partial rollouts keep the slots at);
- `half`: half the slots live, the others empty (a per-step engine's drain);
- `one_key`: every slot live with one key each: the step without attention's work.

JSON: each step's `ms`, its `live_keys`, and `attention_share` = (full - one_key) / full:
the part of a full step that fewer decode steps cannot save, since the same keys are
attended to whichever step decodes them.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rollout import model_config  # noqa: E402

from da3po_jax.models import init_model  # noqa: E402
from da3po_jax.models.transformer import SlotCache  # noqa: E402

PROMPT = 48


def contexts(args, rng) -> np.ndarray:
    """[slots] keys per slot: a prompt plus a uniform point of a response, the response
    drawn length-biased (a slot spends time on a row in proportion to its length)."""
    pool = np.minimum(rng.geometric(1.0 / args.mean, 100_000), args.max_new)
    rows = rng.choice(pool, args.slots, p=pool / pool.sum())
    return PROMPT + (rng.random(args.slots) * rows).astype(np.int32) + 1


def make_step(graphdef):
    """One jitted decode step of every slot (the cache donated: updated in place); the
    lengths are data, so every setting below runs the one compiled program."""

    @functools.partial(jax.jit, donate_argnums=1)
    def step(state, cache, tokens, lengths):
        model = nnx.merge(graphdef, state)
        write = jnp.where(lengths > 0, lengths - 1, cache.max_len)
        return model.decode_slots(tokens, jnp.maximum(lengths - 1, 0), cache, write, lengths)

    return step


def time_step(step, state, cache, lengths: np.ndarray, repeats: int):
    """(median wall ms of one `step` of every slot at `lengths` (0: empty slot), the
    cache, updated in place)."""
    lengths = jnp.asarray(lengths, jnp.int32)
    tokens = jnp.ones(lengths.shape, jnp.int32)
    logits, cache = step(state, cache, tokens, lengths)
    times = []
    for _ in range(repeats):
        jax.block_until_ready(cache)
        t = time.perf_counter()
        logits, cache = step(state, cache, tokens, lengths)
        jax.block_until_ready((logits, cache))
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3), cache


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mean", type=float, default=500.0)
    ap.add_argument("--max_new", type=int, default=4096)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--decode_attention", default="paged")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    cfg = model_config(args.decode_attention)
    graphdef, state = nnx.split(init_model(cfg, args.seed))
    rng = np.random.default_rng(args.seed)
    cache = SlotCache.init(cfg, args.slots, PROMPT + args.max_new, args.block)
    cache = jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype), cache)
    full = contexts(args, rng)
    half = np.where(np.arange(args.slots) % 2 == 0, full, 0)
    steps = {"full": full, "half": half, "one_key": np.ones_like(full)}
    report = {"benchmark": "decode_step", "device": str(jax.devices()[0].device_kind)}
    report["workload"] = vars(args)
    step = make_step(graphdef)
    for name, lengths in steps.items():
        ms, cache = time_step(step, state, cache, lengths, args.repeats)
        report[name] = {"ms": ms, "live_keys": int(lengths.sum())}
    report["attention_share"] = 1.0 - report["one_key"]["ms"] / report["full"]["ms"]
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
