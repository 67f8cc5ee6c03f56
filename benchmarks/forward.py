"""Forward (prefill) and train-shape forward+backward throughput of a preset model.

Prints one JSON object: tokens/s, achieved FLOP/s and MFU against the measured peak of a
large `jnp.dot` on the same device and dtype. Random weights; nothing is downloaded.

    python benchmarks/forward.py --preset=qwen2.5-0.5b --batch=4 --seq=256
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import jax
import jax.numpy as jnp
from flax import nnx

from da3po_jax.models import get_preset, init_model, positions_from_mask
from da3po_jax.train.perf import forward_flops, peak_flops


def _best_time(fn, *args, iters: int) -> float:
    jax.block_until_ready(fn(*args))  # compile and warm up
    best = float("inf")
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--preset", default="qwen2.5-0.5b")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--layers", type=int, default=None, help="override the layer count")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--skip-train", action="store_true")
    args = p.parse_args()

    overrides = dict(param_dtype=args.dtype, dtype=args.dtype)
    if args.layers:
        overrides["num_layers"] = args.layers
    cfg = get_preset(args.preset, **overrides)
    graphdef, state = nnx.split(init_model(cfg, seed=0))
    tokens = jax.random.randint(jax.random.key(2), (args.batch, args.seq), 0, cfg.vocab_size)
    mask = jnp.ones(tokens.shape, jnp.bool_)
    pos = positions_from_mask(mask)

    @jax.jit
    def prefill(state, tokens):
        model = nnx.merge(graphdef, state)
        h, _ = model.hidden(tokens, pos, mask)
        return model.logits(h[:, -1])

    @jax.jit
    def train_grad(state, tokens):
        def loss(state):
            model = nnx.merge(graphdef, state)
            logp, _ = model.token_logprobs(tokens, pos, mask, jnp.roll(tokens, -1, axis=1))
            return -logp.mean()

        return jax.grad(loss)(state)

    peak = peak_flops(args.dtype)
    n_tok = args.batch * args.seq
    result = {
        "benchmark": "forward",
        "device": str(jax.devices()[0].device_kind),
        "backend": jax.default_backend(),
        "machine": platform.processor() or platform.machine(),
        "preset": args.preset,
        "num_layers": cfg.num_layers,
        "params": cfg.num_params(),
        "dtype": args.dtype,
        "batch": args.batch,
        "seq": args.seq,
        "matmul_peak_flops": peak,
    }
    t = _best_time(prefill, state, tokens, iters=args.iters)
    flops = forward_flops(cfg, args.batch, args.seq, logits_positions=1)
    result["prefill"] = {
        "seconds": t,
        "tokens_per_s": n_tok / t,
        "flops_per_s": flops / t,
        "mfu": flops / t / peak,
    }
    if not args.skip_train:
        t = _best_time(train_grad, state, tokens, iters=args.iters)
        flops = 3 * forward_flops(cfg, args.batch, args.seq)
        result["train_fwd_bwd"] = {
            "seconds": t,
            "tokens_per_s": n_tok / t,
            "flops_per_s": flops / t,
            "mfu": flops / t / peak,
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
