"""Decode speed of the sampler against the roofline and against `transformers` generate.

    python benchmarks/sampler.py [--preset=qwen2.5-0.5b] [--dtypes=float32,bfloat16]
        [--settings=1x1,8x8,32x8] [--prompt_len=128] [--new_tokens=256] [--compare-hf]

Random weights, EOS disabled (every row generates exactly `new_tokens`), temperature 1.
Prints one JSON object to stdout (progress goes to stderr).

Per setting P x G (prompts x samples per prompt, R = P * G rows):
- `decode_step_s` = (time of a full call - time of a 1-token call) / (new_tokens - 1); the
  1-token call is the prefill plus one draw, so the difference is the decode loop alone.
- `roofline_step_s` = max(bytes / bandwidth, flops / matmul_peak) of an average decode
  step: bytes = parameter bytes + the KV bytes a step must read (prompt plus the average
  number of generated tokens, R rows); flops = 2 * params * R + attention (4 * context *
  heads * head_dim * layers * R). `roofline_fraction` = roofline_step_s / decode_step_s.
- bandwidth: memory traffic of the fastest 1 GiB host copy (numpy, or torch when
  installed), counted as bytes read + bytes written per second (a copy of n bytes moves
  2n; counting n would halve the bandwidth and flatter the fraction); peak:
  `train.perf.peak_flops`, the best of a few large `jnp.dot`s in the compute dtype
  (measured once per process, as the trainer's MFU uses it). JAX's own jitted copy is
  much slower on CPU and would flatter the fraction, so it is not used. The CPU is
  shared, so the bandwidth is measured again next to each setting.
- with --compare-hf: wall time of `transformers` `generate` (sampling, num_return_sequences
  = G, KV cache) on the same weights and settings, and `hf_over_ours` = hf_s / ours_s for
  the whole call (prefill + decode: HF prefills each prompt G times).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from da3po_jax.models import get_preset, init_model, param_table
from da3po_jax.models.config import ModelConfig
from da3po_jax.runtime.perf import peak_flops
from da3po_jax.sampling import GenerateConfig, generate_with_cache, new_cache

_BYTES = {"float32": 4, "bfloat16": 2}


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def copy_bandwidth(gib: float = 1.0, repeats: int = 5) -> dict[str, float]:
    """Memory traffic (bytes read + bytes written per second) of the fastest host copy of a
    `gib` GiB float32 array, by numpy and by torch when installed; `numpy_read` is a
    single-threaded numpy sum (bytes read per second), for reference only."""
    n = int(gib * 2**30) // 4
    src, dst = np.ones(n, np.float32), np.empty(n, np.float32)
    fns = {"numpy": lambda: np.copyto(dst, src)}
    try:
        import torch

        ts, td = torch.from_numpy(src), torch.from_numpy(dst)
        fns["torch"] = lambda: td.copy_(ts)
    except ImportError:
        pass
    fns["numpy_read"] = lambda: src.sum()
    best = {}
    for name, fn in fns.items():
        fn()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        best[name] = (1 if name == "numpy_read" else 2) * n * 4 / min(times)
    return best


def roofline(cfg: ModelConfig, rows: int, prompt_len: int, new_tokens: int, bw, peak):
    """Roofline time of an average decode step (see the module docstring)."""
    b = _BYTES[cfg.dtype]
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * b
    context = prompt_len + new_tokens / 2  # average keys attended per decode step
    param_bytes = cfg.num_params() * _BYTES[cfg.param_dtype]
    kv_bytes = rows * context * kv_per_token
    flops = 2 * cfg.num_params() * rows + 4 * context * cfg.num_heads * cfg.head_dim * (
        cfg.num_layers * rows
    )
    t_mem, t_flops = (param_bytes + kv_bytes) / bw, flops / peak
    return {
        "param_bytes": param_bytes,
        "kv_bytes_per_step": kv_bytes,
        "flops_per_step": flops,
        "memory_time_s": t_mem,
        "compute_time_s": t_flops,
        "roofline_step_s": max(t_mem, t_flops),
        "bound": "memory" if t_mem >= t_flops else "compute",
    }


def time_ours(graphdef, state, cfg, p, g, prompt_len, new_tokens) -> dict[str, float]:
    """Compile (AOT) and time one call each of the full and the 1-token generate."""
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (p, prompt_len)), jnp.int32)
    mask = jnp.ones((p, prompt_len), jnp.bool_)
    result = {}
    for n in (1, new_tokens):
        config = GenerateConfig(num_samples=g, max_new_tokens=n, temperature=1.0)
        cache = new_cache(cfg, tokens, config)
        t = time.perf_counter()
        compiled = generate_with_cache.lower(
            graphdef, state, cache, tokens, mask, jax.random.key(0), config=config
        ).compile()
        result[f"compile_s_{n}"] = time.perf_counter() - t
        t = time.perf_counter()
        out, cache = compiled(state, cache, tokens, mask, jax.random.key(1))
        jax.block_until_ready(out)
        result[f"call_s_{n}"] = time.perf_counter() - t
        assert int(out.lengths.min()) == n, "EOS is disabled: every row must be full length"
        del cache, out, compiled
    decode = result[f"call_s_{new_tokens}"] - result["call_s_1"]
    result["prefill_s"] = result["call_s_1"]
    result["decode_step_s"] = decode / max(new_tokens - 1, 1)
    result["decode_tokens_per_s"] = p * g * (new_tokens - 1) / decode
    return result


def hf_model(cfg: ModelConfig, state):
    """A `transformers` model holding the same weights (converted in memory)."""
    import torch
    import transformers

    flat = {tuple(k): v for k, v in nnx.to_flat_state(state)}
    tensors = {}
    for e in param_table(cfg):
        x = np.asarray(jax.device_get(flat[e.path].get_value()).astype(np.float32))
        tensors[e.hf_name] = torch.from_numpy(np.ascontiguousarray(e.to_hf(x)))
    hf_cfg = transformers.AutoConfig.for_model(**cfg.to_hf_dict())
    model = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if cfg.tie_word_embeddings:
        model.tie_weights()
        missing = [k for k in missing if k != "lm_head.weight"]
    assert not missing and not unexpected, (missing, unexpected)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.param_dtype]
    return model.to(torch_dtype).eval()


def time_hf(model, cfg, p, g, prompt_len, new_tokens) -> float:
    """Wall time of one HF sampling `generate` call (after a short warm-up)."""
    import torch

    rng = np.random.default_rng(0)
    ids = torch.tensor(rng.integers(0, cfg.vocab_size, (p, prompt_len)), dtype=torch.long)
    kwargs = dict(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        num_return_sequences=g,
        eos_token_id=None,
        pad_token_id=0,
        attention_mask=torch.ones_like(ids),
    )
    with torch.no_grad():
        model.generate(
            ids[:1, :8],
            max_new_tokens=2,
            min_new_tokens=2,
            **{**kwargs, "num_return_sequences": 1, "attention_mask": torch.ones(1, 8).long()},
        )
        t = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)
        elapsed = time.perf_counter() - t
    assert out.shape == (p * g, prompt_len + new_tokens), out.shape
    return elapsed


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="qwen2.5-0.5b")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--settings", default="1x1,8x8,32x8", help="PxG list")
    ap.add_argument("--prompt_len", type=int, default=128)
    ap.add_argument("--new_tokens", type=int, default=256)
    ap.add_argument("--compare-hf", dest="compare_hf", action="store_true")
    return ap.parse_args(argv)


def machine(dtype: str) -> dict[str, float]:
    """Bandwidth and matmul peak, measured now: the CPU is shared, so they are measured
    next to each setting rather than once per run."""
    bws = copy_bandwidth()
    return {
        "copy_traffic_bytes_per_s": max(bws["numpy"], bws.get("torch", 0.0)),
        "copy_by": bws,
        "matmul_peak_flops": peak_flops(dtype),
    }


def run_setting(args, cfg, graphdef, state, hf, setting: str) -> dict:
    """All numbers of one P x G setting (see the module docstring)."""
    p, g = (int(x) for x in setting.split("x"))
    row = {"dtype": cfg.dtype, "setting": setting, "prompts": p, "samples": g}
    row.update(machine(cfg.dtype))
    row.update(time_ours(graphdef, state, cfg, p, g, args.prompt_len, args.new_tokens))
    bw, peak = row["copy_traffic_bytes_per_s"], row["matmul_peak_flops"]
    row.update(roofline(cfg, p * g, args.prompt_len, args.new_tokens, bw, peak))
    row["roofline_fraction"] = row["roofline_step_s"] / row["decode_step_s"]
    if hf is not None:
        row["hf_s"] = time_hf(hf, cfg, p, g, args.prompt_len, args.new_tokens)
        row["hf_over_ours"] = row["hf_s"] / row[f"call_s_{args.new_tokens}"]
    return row


def main(argv=None) -> None:
    args = parse_args(argv)
    report = {
        "preset": args.preset,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "device": str(jax.devices()[0]),
        "results": [],
    }
    for dtype in args.dtypes.split(","):
        cfg = get_preset(args.preset, dtype=dtype, param_dtype=dtype)
        graphdef, state = nnx.split(init_model(cfg, 0))
        hf = hf_model(cfg, state) if args.compare_hf else None
        for setting in args.settings.split(","):
            row = run_setting(args, cfg, graphdef, state, hf, setting)
            log(json.dumps(row))
            report["results"].append(row)
        del hf, state
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
