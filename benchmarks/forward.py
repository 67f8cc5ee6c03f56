"""Forward / train throughput, memory, packing and compile-time benchmarks of a preset.

Every suite prints one JSON object to stdout (progress goes to stderr). Random weights;
nothing is downloaded. Benchmarks report numbers, they assert nothing.

    python benchmarks/forward.py --preset=qwen2.5-0.5b --batch=4 --seq=256

Suites (`--suite`, default `forward`):

- forward: prefill and train-shape forward+backward (mean next-token log-prob over every
  position, gradients w.r.t. the parameters) tokens/s, FLOP/s and MFU against the
  measured peak of a large `jnp.dot` on the same device and dtype (`train.perf`).
- memory: forward+backward of a 2-layer model on one row of T = 1024 ... `--max_t`
  tokens, naive vs blockwise attention, each (impl, T) in a fresh subprocess: the
  compiled `memory_analysis()` bytes, the wall time of one run and the process's max
  RSS. Naive above `--naive_run_max_t` (and any case whose compiled bytes exceed the
  free memory) is compiled only ("ran": false). `temp_ratio` is temp(T) / temp(T/2),
  `temp_increment_ratio` the same of temp(T) - temp(T/2) (2 = linear, 4 = quadratic).
      python benchmarks/forward.py --suite=memory [--max_t=16384 --impls=naive,blockwise]
- packing: one RL update (`rl_update`, token-mean DAPO loss, AdamW) of a 2-layer model on
  a variable-length batch (prompts of 32..128 tokens left-padded to 128, `--group`
  responses per prompt with geometric lengths of mean `--mean` clipped to `--cap`),
  padded (`--micro_prompts` prompts per micro-batch) vs packed into rows of `--packs`
  LENGTHxROWS (length 0: the row length, the `rl.pack_length` default): best-of-`--iters`
  update seconds after compiling (rounds alternate the modes), useful (prompt + response)
  tokens/s, computed vs real tokens and the speed-up over padded, all in this process.
  The log-prob chunk defaults to 128 positions, which divides both layouts (the preset's
  512 would pad each 1152-column row to 1536).
      python benchmarks/forward.py --suite=packing [--prompts=4 --packs=0x1,2048x1]
- compile: `jax.jit(f).lower(...).compile()` time of the train forward+backward of the
  preset (24 layers for qwen2.5-0.5b) at batch 1 x seq 128, layers unrolled vs
  `scan_layers=True` ("scanned": "unavailable" where ModelConfig has no such field).
      python benchmarks/forward.py --suite=compile
- torch: the train forward+backward at batch 8 x seq 384, ours vs `transformers` Qwen2
  (random init, SDPA, float32, `--torch_threads` threads) on the same shapes, run
  alternately (ours, torch, ours, torch) after a warm-up of each, each run waiting for
  enough free memory first (`--mem_wait`); every sample, tokens/s, MFU (the same FLOP
  count for both), the peak RSS growth of each side and ours / torch. `--no_torch` times
  ours only; `--variants` also times ours with ModelConfig overrides (`logits_chunk=1024`,
  `attention=naive`, `remat=True`, ...) or a patch (below). XLA flags are set from
  outside: `XLA_FLAGS=... python benchmarks/forward.py --suite=torch --no_torch`.
      python benchmarks/forward.py --suite=torch [--iters=2 --variants=flat_logprobs=1024]

What-if patches of the library (`--patch=A,B` for any suite, or as `--variants` entries):
`no_logits_remat` (log-prob chunks not rematerialised), `flat_logprobs=N` (log-probs in
chunks of N tokens of the flattened batch instead of `logits_chunk` positions per row),
`matmul_precision=NAME` (`jax.default_matmul_precision`).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from da3po_jax.models import get_preset, init_model, positions_from_mask
from da3po_jax.runtime.perf import forward_flops, peak_flops

SUITES = ("forward", "memory", "packing", "compile", "torch")
# Per-suite values of the shared flags left unset on the command line.
_DEFAULTS = {
    "forward": dict(batch=4, seq=256, iters=3),
    "memory": dict(layers=2),
    # logits chunk 128 divides both the padded row (128 + 1024) and the pack lengths: the
    # log-prob chunks pad neither layout (512 would pad the 1152 columns to 1536).
    "packing": dict(layers=2, iters=2, logits_chunk=128),
    "compile": dict(batch=1, seq=128),
    "torch": dict(batch=8, seq=384, iters=2),
}
_MIB = 2**20


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- shared
def _config(args, **overrides):
    """The preset in `--dtype` (params and compute), `--layers` layers, with overrides."""
    fields = dict(param_dtype=args.dtype, dtype=args.dtype)
    if args.layers:
        fields["num_layers"] = args.layers
    if args.logits_chunk:
        fields["logits_chunk"] = args.logits_chunk
    return get_preset(args.preset, **{**fields, **overrides})


def _train_grad(graphdef):
    """Gradient w.r.t. the parameters of the mean -log p(next token) over every position
    of unpadded [B, T] tokens (the chunked `token_logprobs`)."""

    def loss(state, tokens):
        model = nnx.merge(graphdef, state)
        mask = jnp.ones(tokens.shape, jnp.bool_)
        targets = jnp.roll(tokens, -1, axis=1)
        logp, _ = model.token_logprobs(tokens, positions_from_mask(mask), mask, targets)
        return -logp.mean()

    return jax.grad(loss)


def _tokens(cfg, batch: int, seq: int, seed: int = 2) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (batch, seq), 0, cfg.vocab_size)


def _timed(fn, *args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def _best_time(fn, *args, iters: int) -> float:
    jax.block_until_ready(fn(*args))  # compile and warm up
    return min(_timed(fn, *args) for _ in range(iters))


def _rate(flops: float, seconds: float, tokens: int, peak: float) -> dict:
    return {
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "flops_per_s": flops / seconds,
        "mfu": flops / seconds / peak,
    }


def _header(args, cfg, suite: str) -> dict:
    head = {"benchmark": "forward"}
    if suite != "forward":
        head["suite"] = suite
    return {
        **head,
        "device": str(jax.devices()[0].device_kind),
        "backend": jax.default_backend(),
        "machine": platform.processor() or platform.machine(),
        "preset": args.preset,
        "num_layers": cfg.num_layers,
        "params": cfg.num_params(),
        "dtype": args.dtype,
    }


def _memory_stats(compiled) -> dict:
    m = compiled.memory_analysis()
    keys = ("temp", "argument", "output", "alias")
    return {f"{k}_bytes": int(getattr(m, f"{k}_size_in_bytes")) for k in keys}


# ------------------------------------------------------------------------ forward suite
def suite_forward(args) -> dict:
    cfg = _config(args)
    graphdef, state = nnx.split(init_model(cfg, seed=0))
    tokens = _tokens(cfg, args.batch, args.seq)
    mask = jnp.ones(tokens.shape, jnp.bool_)
    pos = positions_from_mask(mask)

    @jax.jit
    def prefill(state, tokens):
        model = nnx.merge(graphdef, state)
        h, _ = model.hidden(tokens, pos, mask)
        return model.logits(h[:, -1])

    peak = peak_flops(args.dtype)
    n_tok = args.batch * args.seq
    result = _header(args, cfg, "forward")
    result.update(batch=args.batch, seq=args.seq, matmul_peak_flops=peak)
    t = _best_time(prefill, state, tokens, iters=args.iters)
    flops = forward_flops(cfg, args.batch, args.seq, logits_positions=1)
    result["prefill"] = _rate(flops, t, n_tok, peak)
    if not args.skip_train:
        t = _best_time(jax.jit(_train_grad(graphdef)), state, tokens, iters=args.iters)
        flops = 3 * forward_flops(cfg, args.batch, args.seq)
        result["train_fwd_bwd"] = _rate(flops, t, n_tok, peak)
    return result


# ------------------------------------------------------------------------- memory suite
def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _proc_status_mib(key: str) -> float | None:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return None


def _reset_peak_rss() -> bool:
    """Resets the kernel's RSS high-water mark (VmHWM); False where not permitted."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _available_bytes() -> int:
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    return info["MemAvailable"]


def _memory_case(args) -> dict:
    """One (impl, T) case, in this (fresh) process: compile, then maybe one run."""
    impl, t = args.case.split(":")[0], int(args.case.split(":")[1])
    cfg = _config(args, attention=impl)
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: init_model(cfg, seed=0)))
    out = {"impl": impl, "T": t, "maxrss_start_mib": _maxrss_mib()}
    start = time.perf_counter()
    spec = jax.ShapeDtypeStruct((1, t), jnp.int32)
    compiled = jax.jit(_train_grad(graphdef)).lower(abstract, spec).compile()
    out["compile_s"] = time.perf_counter() - start
    out.update(_memory_stats(compiled))
    out["maxrss_compiled_mib"] = _maxrss_mib()
    need = out["temp_bytes"] + out["argument_bytes"] + out["output_bytes"]
    if impl == "naive" and t > args.naive_run_max_t:
        return {**out, "ran": False, "reason": f"naive above T={args.naive_run_max_t}"}
    if need > 0.85 * _available_bytes():
        return {**out, "ran": False, "reason": "compiled bytes exceed 85% of MemAvailable"}
    state = nnx.state(init_model(cfg, seed=0))
    tokens = jax.block_until_ready(_tokens(cfg, 1, t))
    before, rss_before = _maxrss_mib(), _proc_status_mib("VmRSS")
    reset = _reset_peak_rss()
    out["run_s"] = _timed(compiled, state, tokens)
    out.update(ran=True, maxrss_before_run_mib=before, maxrss_end_mib=_maxrss_mib())
    out["maxrss_growth_mib"] = out["maxrss_end_mib"] - before
    if reset:  # exact peak of the run itself, over the RSS it started from
        out["run_peak_rss_over_start_mib"] = _proc_status_mib("VmHWM") - rss_before
    return out


def _run_case(args, impl: str, t: int) -> dict:
    """`_memory_case` in a subprocess (this script, the same flags plus --case)."""
    cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], f"--case={impl}:{t}"]
    log(f"memory: {impl} T={t}")
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.case_timeout)
    except subprocess.TimeoutExpired:
        return {"impl": impl, "T": t, "error": f"timed out after {args.case_timeout} s"}
    lines = [s for s in proc.stdout.splitlines() if s.startswith("{")]
    if proc.returncode or not lines:
        tail = proc.stderr.strip().splitlines()[-3:]
        return {"impl": impl, "T": t, "returncode": proc.returncode, "error": tail}
    return {**json.loads(lines[-1]), "child_wall_s": time.perf_counter() - start}


def _ratios(cases: list[dict]) -> dict:
    """Per impl: {T: temp(T) / temp(T/2)} and the same of the increments."""
    out = {}
    for impl in dict.fromkeys(c["impl"] for c in cases):
        temp = {c["T"]: c["temp_bytes"] for c in cases if c["impl"] == impl and "temp_bytes" in c}
        ts = sorted(temp)
        ratio = {t: temp[t] / temp[t // 2] for t in ts if t // 2 in temp}
        inc = {t: temp[t] - temp[t // 2] for t in ts if t // 2 in temp}
        inc_ratio = {t: inc[t] / inc[t // 2] for t in inc if t // 2 in inc and inc[t // 2]}
        out[impl] = {"temp_ratio": ratio, "temp_increment_ratio": inc_ratio}
    return out


def suite_memory(args) -> dict:
    if args.case:
        return _memory_case(args)
    cfg = _config(args)
    ts, t = [], args.min_t
    while t <= args.max_t:
        ts.append(t)
        t *= 2
    cases = [_run_case(args, impl, t) for impl in args.impls.split(",") for t in ts]
    result = _header(args, cfg, "memory")
    result.update(batch=1, logits_chunk=cfg.logits_chunk, attention_block=cfg.attention_block)
    result["cases"] = cases
    result["ratios"] = _ratios(cases)
    return result


# ------------------------------------------------------------------------ packing suite
def _group_batch(args, vocab: int):
    """A `GroupBatch` of `--prompts` groups of `--group` responses, and its facts."""
    from da3po_jax.rollout.batch import GroupBatch

    rng = np.random.default_rng(args.seed)
    n, g, tp, tn = args.prompts, args.group, args.prompt_bucket, args.cap
    lp = rng.integers(args.prompt_min, tp + 1, n)
    prompt_mask = np.arange(tp)[None] >= (tp - lp)[:, None]
    ln = np.minimum(rng.geometric(1.0 / args.mean, (n, g)), tn)
    response_mask = np.arange(tn)[None, None] < ln[..., None]
    correct = (rng.random((n, g)) < 0.5).astype(np.float32)
    correct[:, 0], correct[:, 1] = 1.0, 0.0  # every group mixed: every row trains
    logp_old = np.log(1.0 / vocab) + 0.1 * rng.standard_normal((n, g, tn))
    batch = GroupBatch(
        prompt_tokens=jnp.asarray(np.where(prompt_mask, rng.integers(1, vocab, (n, tp)), 0)),
        prompt_mask=jnp.asarray(prompt_mask),
        tokens=jnp.asarray(np.where(response_mask, rng.integers(1, vocab, (n, g, tn)), 0)),
        response_mask=jnp.asarray(response_mask),
        logp_old=jnp.asarray(logp_old, jnp.float32),
        rewards=jnp.asarray(correct),
        correct=jnp.asarray(correct),
        lengths=jnp.asarray(ln, jnp.int32),
        truncated=jnp.asarray(ln >= tn),
        prompt_index=jnp.arange(n, dtype=jnp.int32),
    )
    facts = {
        "rows": n * g,
        "row_columns": tp + tn,
        "real_tokens": int(lp.sum() * g + ln.sum()),
        "padded_tokens": n * g * (tp + tn),
        "prompt_len_mean": float(lp.mean()),
        "response_len_mean": float(ln.mean()),
        "response_len_max": int(ln.max()),
        "truncated": int((ln >= tn).sum()),
    }
    return batch, facts


def _rl_config(args, pack):
    from da3po_jax.rl import AdvantageConfig, LossConfig, OverlongConfig
    from da3po_jax.update import UpdateConfig

    return UpdateConfig(
        group_size=args.group,
        mini_batch_prompts=args.prompts,
        micro_batch_prompts=args.micro_prompts,
        num_iterations=1,
        loss=LossConfig(eps_low=0.2, eps_high=0.28, agg="token-mean"),
        adv=AdvantageConfig(),
        daa=None,
        overlong=OverlongConfig(max_len=args.cap, buffer=args.cap // 4),
        pack=pack,
    )


def _update_modes(args, batch, valid, row_len: int) -> dict:
    """name -> (UpdateConfig, plan or None, tokens the forward computes, micro-batches)."""
    from da3po_jax.update import pack_plan
    from da3po_jax.update.packing import PackConfig

    rows = args.prompts * args.group
    micro = args.prompts // (args.micro_prompts or args.prompts)
    modes = {"padded": (_rl_config(args, None), None, rows * row_len, micro)}
    for item in args.packs.split(","):
        length, n_rows = (int(x) for x in item.lower().split("x"))
        pack = PackConfig(length=length, rows=n_rows).resolve(row_len)
        cfg = _rl_config(args, pack)
        plan, _ = pack_plan(batch, valid, cfg)
        used = len(set(np.asarray(plan.micro)[np.asarray(plan.micro) >= 0].tolist()))
        modes[f"packed_{pack.length}x{pack.rows}"] = (
            cfg,
            plan,
            used * pack.rows * pack.length,
            used,
        )
    return modes


def suite_packing(args) -> dict:
    import optax

    from da3po_jax.update import UpdateBatch, UpdateProgram, rl_update
    from da3po_jax.update.state import init_train_state

    cfg = _config(args)
    tx = optax.adamw(1e-6)
    graphdef, state = init_train_state(init_model(cfg, seed=0), tx, 0)
    batch, facts = _group_batch(args, cfg.vocab_size)
    valid = jnp.ones(args.prompts, jnp.bool_)
    modes = _update_modes(args, batch, valid, facts["row_columns"])
    step = jax.jit(rl_update, static_argnames="program", donate_argnames="state")
    report, compiled = {}, {}
    for name, (rl_cfg, plan, computed, micro) in modes.items():
        log(f"packing: compiling {name}")
        start = time.perf_counter()
        program = UpdateProgram(graphdef, tx, rl_cfg)
        lowered = step.lower(program, state, UpdateBatch(batch, valid, plan=plan))
        compiled[name] = lowered.compile()
        report[name] = {"compile_s": time.perf_counter() - start, "micro_batches": micro}
        report[name]["temp_bytes"] = _memory_stats(compiled[name])["temp_bytes"]
        report[name].update(computed_tokens=computed, fill=facts["real_tokens"] / computed)
        report[name].update(warmup_s=[], samples_s=[])

    def call(name, key):
        nonlocal state
        start = time.perf_counter()
        state, metrics = jax.block_until_ready(
            compiled[name](state, UpdateBatch(batch, valid, plan=modes[name][1]))
        )
        report[name][key].append(time.perf_counter() - start)
        log(f"packing: {name} {report[name][key][-1]:.1f} s")

    for key, rounds in (("warmup_s", args.warmup), ("samples_s", args.iters)):
        for _ in range(rounds):  # rounds alternate the modes against machine drift
            for name in modes:
                call(name, key)
    for r in report.values():
        r["best_s"] = min(r["samples_s"])
        r["useful_tokens_per_s"] = facts["real_tokens"] / r["best_s"]
        r["speedup_vs_padded"] = report["padded"]["best_s"] / r["best_s"]
    result = _header(args, cfg, "packing")
    result.update(prompts=args.prompts, group=args.group, mean=args.mean, cap=args.cap)
    result.update(micro_batch_prompts=args.micro_prompts, logits_chunk=cfg.logits_chunk)
    result.update(batch=facts, modes=report)
    packed = {k: v for k, v in report.items() if k != "padded"}
    if packed:
        result["best_packed"] = max(packed, key=lambda k: packed[k]["speedup_vs_padded"])
    return result


# ------------------------------------------------------------------------ compile suite
def _compile_case(cfg, batch: int, seq: int) -> dict:
    """Lower + compile time of the train forward+backward (abstract parameters)."""
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: init_model(cfg, seed=0)))
    spec = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    start = time.perf_counter()
    lowered = jax.jit(_train_grad(graphdef)).lower(abstract, spec)
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    done = time.perf_counter()
    hlo = compiled.as_text()
    return {
        "lower_s": lowered_at - start,
        "compile_s": done - lowered_at,
        "lower_plus_compile_s": done - start,
        "hlo_lines": hlo.count("\n"),
        "hlo_while_loops": hlo.count(" while("),
        **_memory_stats(compiled),
    }


def suite_compile(args) -> dict:
    _compile_case(get_preset("tiny-qwen2"), 1, 8)  # one-time backend / lowering set-up
    cfg = _config(args)
    result = _header(args, cfg, "compile")
    result.update(batch=args.batch, seq=args.seq)
    log("compile: unrolled")
    result["unrolled"] = _compile_case(cfg, args.batch, args.seq)
    try:
        scan_cfg = _config(args, scan_layers=True)
    except TypeError:  # ModelConfig has no scan_layers field (yet)
        result["scanned"] = "unavailable"
        return result
    log("compile: scanned")
    try:
        result["scanned"] = _compile_case(scan_cfg, args.batch, args.seq)
    except Exception as e:  # noqa: BLE001 -- a benchmark reports, it does not crash
        result["scanned"] = {"error": f"{type(e).__name__}: {e}"}
        return result
    unrolled, scanned = result["unrolled"], result["scanned"]
    result["unrolled_over_scanned"] = {
        k: unrolled[k] / scanned[k] for k in ("lower_s", "compile_s", "lower_plus_compile_s")
    }
    return result


# ------------------------------------------------- what-if patches of the library code
def _logit_blocks(hs, ts, w, temperature: float, remat: bool):
    """Log-probs and entropies of hidden blocks hs [n, m..., hidden] with targets ts
    [n, m...], block by block (`lax.map`), as `models.transformer.chunked_logprobs`."""

    def block(hc, tc):
        logits = jnp.dot(hc, w, preferred_element_type=jnp.float32) / temperature
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0]
        entropy = lse - jnp.sum(jnp.exp(logits - lse[..., None]) * logits, axis=-1)
        return picked - lse, entropy

    block = jax.checkpoint(block) if remat else block
    return jax.lax.map(lambda xs: block(*xs), (hs, ts))


def _logprobs_without_remat(h, w, targets, chunk, temperature=1.0):
    """`chunked_logprobs` with its chunks not rematerialised (each chunk's logits are
    kept for the backward instead of being recomputed)."""
    b, t, _ = h.shape
    chunk = max(1, min(chunk, t))
    n = -(-t // chunk)
    h = jnp.pad(h, ((0, 0), (0, n * chunk - t), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, n * chunk - t)))
    hs = h.reshape(b, n, chunk, -1).swapaxes(0, 1)
    ts = targets.reshape(b, n, chunk).swapaxes(0, 1)
    logp, ent = _logit_blocks(hs, ts, w, temperature, remat=False)
    cut = lambda x: x.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]  # noqa: E731
    return cut(logp), cut(ent)


def _flat_logprobs(tokens_per_chunk: int):
    """`chunked_logprobs` over the flattened B * T tokens in chunks of `tokens_per_chunk`
    tokens: the logits GEMM has M = tokens_per_chunk rows whatever B is, and only the
    flat total is padded (not every row to a multiple of the chunk)."""

    def logprobs(h, w, targets, chunk, temperature=1.0):
        del chunk
        b, t, d = h.shape
        total = b * t
        c = max(1, min(tokens_per_chunk, total))
        n = -(-total // c)
        hs = jnp.pad(h.reshape(total, d), ((0, n * c - total), (0, 0))).reshape(n, c, d)
        ts = jnp.pad(targets.reshape(total), (0, n * c - total)).reshape(n, c)
        logp, ent = _logit_blocks(hs, ts, w, temperature, remat=True)
        cut = lambda x: x.reshape(-1)[:total].reshape(b, t)  # noqa: E731
        return cut(logp), cut(ent)

    return logprobs


@contextlib.contextmanager
def _patched(module, name: str, value):
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def _patch(spec: str):
    """The context of a what-if patch (`--patch` / `--variants` entry), None if `spec` is
    not one: no_logits_remat, flat_logprobs=TOKENS, matmul_precision=NAME."""
    from da3po_jax.models import transformer

    key, _, value = spec.partition("=")
    if key == "no_logits_remat":
        return _patched(transformer, "chunked_logprobs", _logprobs_without_remat)
    if key == "flat_logprobs":
        return _patched(transformer, "chunked_logprobs", _flat_logprobs(int(value)))
    if key == "matmul_precision":
        return jax.default_matmul_precision(value)
    return None


# -------------------------------------------------------------------------- torch suite
def _variant(spec: str):
    """(ModelConfig overrides, context) of a `--variants` entry: a patch, or FIELD=VALUE."""
    context = _patch(spec)
    if context is not None:
        return {}, context
    key, _, value = spec.partition("=")
    parsed = {"True": True, "False": False}.get(value, int(value) if value.isdigit() else value)
    return {key: parsed}, contextlib.nullcontext()


def _release_memory() -> None:
    """Returns freed heap memory to the OS (glibc), so that the two frameworks, which
    each allocate a step's activations afresh, do not stack their freed peaks."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _wait_for_memory(need: float, timeout: float) -> float:
    """Waits (up to `timeout` s, then runs anyway) until MemAvailable >= `need` bytes: on
    a shared machine a step of either framework can take most of the memory."""
    start = time.perf_counter()
    while _available_bytes() < need and time.perf_counter() - start < timeout:
        time.sleep(5)
    waited = time.perf_counter() - start
    if waited > 1:
        log(f"torch: waited {waited:.0f} s for {need / 2**30:.1f} GiB of free memory")
    return waited


def _alternate(runs: dict, need: float, args) -> dict:
    """A warm-up of each side, then `--iters` rounds (ours, torch, ours, torch, ...); per
    side the warm-up, the samples and the peak RSS growth (MiB) of its largest run."""
    out = {name: {"warmup_s": None, "samples_s": [], "peak_rss_growth_mib": 0.0} for name in runs}
    needs = dict.fromkeys(runs, need)  # torch's own need is known after its warm-up
    for i in range(-1, args.iters):
        for name, run in runs.items():
            _wait_for_memory(1.1 * needs[name], args.mem_wait)
            rss, reset = _proc_status_mib("VmRSS"), _reset_peak_rss()
            seconds = run()
            if reset:
                growth = _proc_status_mib("VmHWM") - rss
                out[name]["peak_rss_growth_mib"] = max(out[name]["peak_rss_growth_mib"], growth)
                needs[name] = growth * _MIB
            _release_memory()
            if i < 0:
                out[name]["warmup_s"] = seconds
            else:
                out[name]["samples_s"].append(seconds)
            log(f"torch: {name} {'warm-up' if i < 0 else f'sample {i}'}: {seconds:.1f} s")
    return out


def _summary(timing: dict, flops, n_tok, peak) -> dict:
    return {**timing, **_rate(flops, min(timing["samples_s"]), n_tok, peak)}


def _run_variants(args, cfg, state, tokens, flops, n_tok, peak, base_best: float) -> dict:
    """Ours under each `--variants` entry (same parameters): compile, one warm-up, best of
    --iters, and the speed-up over the unmodified run."""
    out = {}
    for spec in filter(None, args.variants.split(",")):
        log(f"torch: variant {spec}")
        overrides, context = _variant(spec)
        variant_cfg = cfg.replace(**overrides)
        graphdef = nnx.graphdef(nnx.eval_shape(lambda c=variant_cfg: init_model(c, seed=0)))
        with context:
            compiled = jax.jit(_train_grad(graphdef)).lower(state, tokens).compile()
            warm = _timed(compiled, state, tokens)
            samples = [_timed(compiled, state, tokens) for _ in range(args.iters)]
        _release_memory()
        out[spec] = _summary({"warmup_s": warm, "samples_s": samples}, flops, n_tok, peak)
        out[spec]["speedup_vs_ours"] = base_best / min(samples)
        log(f"torch: variant {spec}: {min(samples):.1f} s")
    return out


def suite_torch(args) -> dict:
    cfg = _config(args)
    rng = np.random.default_rng(args.seed)
    tokens_np = rng.integers(0, cfg.vocab_size, (args.batch, args.seq))
    tokens = jnp.asarray(tokens_np, jnp.int32)
    peak, n_tok = peak_flops(args.dtype), args.batch * args.seq
    flops = 3 * forward_flops(cfg, args.batch, args.seq)
    graphdef, state = nnx.split(init_model(cfg, seed=0))
    log("torch: compiling ours")
    compiled = jax.jit(_train_grad(graphdef)).lower(state, tokens).compile()
    runs = {"ours": lambda: _timed(compiled, state, tokens)}
    result = _header(args, cfg, "torch")
    result.update(batch=args.batch, seq=args.seq, matmul_peak_flops=peak, train_flops=flops)
    result["ours_compiled"] = _memory_stats(compiled)
    if not args.no_torch:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import _torch_qwen as tq

        log("torch: building the transformers model")
        model = tq.build(cfg, args.torch_threads)
        ids, targets = tq.inputs(tokens_np)
        runs["torch"] = lambda: tq.train_step(model, ids, targets)
        result.update(versions=tq.versions(), torch_threads=args.torch_threads)
    stats = result["ours_compiled"]
    timings = _alternate(runs, stats["temp_bytes"] + stats["output_bytes"], args)
    for name, timing in timings.items():
        result[name] = _summary(timing, flops, n_tok, peak)
    if "torch" in runs:
        result["ours_over_torch"] = result["ours"]["tokens_per_s"] / result["torch"]["tokens_per_s"]
    if args.variants:
        best = result["ours"]["seconds"]
        result["variants"] = _run_variants(args, cfg, state, tokens, flops, n_tok, peak, best)
    return result


# ------------------------------------------------------------------------------- main
def _parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--suite", default="forward", choices=SUITES)
    p.add_argument("--preset", default="qwen2.5-0.5b")
    p.add_argument("--batch", type=int, default=None, help="forward: 4, torch: 8, compile: 1")
    p.add_argument("--seq", type=int, default=None, help="forward: 256, torch: 384, compile: 128")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--layers", type=int, default=None, help="override the layer count")
    p.add_argument("--iters", type=int, default=None, help="timed runs (best is reported)")
    p.add_argument("--logits_chunk", type=int, default=None, help="packing: 128, else preset's")
    p.add_argument("--skip-train", action="store_true", help="forward: prefill only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--patch", default="", help="what-if library patches (see _patch), any suite")
    g = p.add_argument_group("memory")
    g.add_argument("--min_t", type=int, default=1024)
    g.add_argument("--max_t", type=int, default=16384)
    g.add_argument("--impls", default="naive,blockwise")
    g.add_argument("--naive_run_max_t", type=int, default=4096, help="naive above: compile only")
    g.add_argument("--case_timeout", type=int, default=3600, help="seconds per subprocess")
    g.add_argument("--case", default="", help=argparse.SUPPRESS)  # IMPL:T, in the child
    g = p.add_argument_group("packing")
    g.add_argument("--prompts", type=int, default=4)
    g.add_argument("--group", type=int, default=8, help="responses per prompt (G)")
    g.add_argument("--mean", type=float, default=150.0, help="mean response length")
    g.add_argument("--cap", type=int, default=1024, help="max new tokens (length clip)")
    g.add_argument("--prompt_min", type=int, default=32)
    g.add_argument("--prompt_bucket", type=int, default=128, help="prompt columns (max len)")
    g.add_argument("--micro_prompts", type=int, default=1, help="padded micro-batch prompts")
    g.add_argument("--packs", default="0x1,2048x1", help="LENGTHxROWS,... (0: row length)")
    g.add_argument("--warmup", type=int, default=0, help="untimed rounds after compiling")
    g = p.add_argument_group("torch")
    g.add_argument("--torch_threads", type=int, default=2)
    g.add_argument("--no_torch", action="store_true", help="time ours (and variants) only")
    g.add_argument("--mem_wait", type=float, default=900, help="max s to wait for free memory")
    g.add_argument("--variants", default="", help="e.g. logits_chunk=1024,no_logits_remat")
    args = p.parse_args()
    for key, value in _DEFAULTS[args.suite].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main() -> None:
    args = _parse_args()
    suites = {
        "forward": suite_forward,
        "memory": suite_memory,
        "packing": suite_packing,
        "compile": suite_compile,
        "torch": suite_torch,
    }
    load = os.getloadavg()
    with contextlib.ExitStack() as stack:
        for spec in filter(None, args.patch.split(",")):
            stack.enter_context(_patch(spec))
        result = suites[args.suite](args)
    if args.patch:
        result["patches"] = args.patch.split(",")
    # 1/5/15-minute load averages: the CPU may be shared, which is context for the times.
    result["load_average"] = {"start": load, "end": os.getloadavg()}
    print(json.dumps(result) if args.case else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
