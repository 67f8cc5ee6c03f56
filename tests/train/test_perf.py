"""Compile counters, model FLOPs (against XLA's own count), peak FLOP/s and MFU."""

from __future__ import annotations

import logging
import math
import time

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from da3po_jax.models import ModelConfig, get_preset, init_model, positions_from_mask
from da3po_jax.runtime import perf
from da3po_jax.runtime.perf import (
    CompileCounts,
    forward_flops,
    mfu_metrics,
    peak_flops,
    update_flops,
)

# 1 layer, hidden 8, 2 query heads sharing 1 kv head of width 4, SwiGLU width 16, vocab 32.
HAND = ModelConfig(
    model_type="llama",
    vocab_size=32,
    hidden_size=8,
    intermediate_size=16,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=4,
    logits_chunk=4,
)


def test_forward_flops_by_hand():
    # Per sequence of T = 4 tokens, 2 FLOPs per multiply-add:
    #   q, o projections   2 * 4 * (8 * 8) * 2  = 1024
    #   k, v projections   2 * 4 * (8 * 4) * 2  =  512
    #   gate, up, down     2 * 4 * (8 * 16) * 3 = 3072
    #   scores + values    2 heads * 2 * 2 * 4 * 4 * 4 = 512
    #   LM head            2 * 4 * 8 * 32 = 2048           -> 7168 per sequence
    assert forward_flops(HAND, rows=1, seq_len=4) == 7168
    assert forward_flops(HAND, rows=3, seq_len=4) == 3 * 7168
    # T = 6 with logits_chunk 4: the LM head runs on 8 padded positions (2 * 8 * 8 * 32 =
    # 4096); the rest scales with T (linear parts: 4608 * 6 / 4) or T^2 (attention).
    assert forward_flops(HAND, rows=1, seq_len=6) == 4608 * 6 // 4 + 512 * 36 // 16 + 4096
    # Tied or not, the LM head is the same matmul.
    assert forward_flops(HAND.replace(tie_word_embeddings=True), 1, 4) == 7168


def test_sequence_flops_count_each_sequence_alone():
    """A packed update's work: each sequence's own T x T attention and T LM-head positions
    (no chunk padding), e.g. T = 6: 4608 * 6 / 4 linear + 512 * 36 / 16 attention + LM
    head 2 * 6 * 8 * 32."""
    assert perf.sequence_flops(HAND, [4]) == 7168
    assert perf.sequence_flops(HAND, [4, 6]) == 7168 + 4608 * 6 // 4 + 512 * 36 // 16 + 3072
    assert perf.sequence_flops(HAND, []) == 0.0


def test_update_flops():
    fwd = forward_flops(HAND, 2, 4)
    assert update_flops(HAND, 2, 4, num_iterations=1) == 3 * fwd
    assert update_flops(HAND, 2, 4, num_iterations=2, extra_forwards=2) == 8 * fwd
    assert update_flops(HAND, 2, 4, num_iterations=1, extra_flops=5.0) == 3 * fwd + 5.0


def _xla_flops(cfg: ModelConfig, rows: int, seq_len: int, grad: bool) -> float:
    graphdef, state = nnx.split(init_model(cfg, seed=0))
    tokens = jnp.zeros((rows, seq_len), jnp.int32)
    mask = jnp.ones((rows, seq_len), jnp.int32)

    def loss(state, tokens, mask):
        model = nnx.merge(graphdef, state)
        return model.token_logprobs(tokens, positions_from_mask(mask), mask, tokens)[0].sum()

    fn = jax.grad(loss) if grad else loss
    return jax.jit(fn).lower(state, tokens, mask).cost_analysis()["flops"]


@pytest.mark.parametrize("seq_len", [8, 64])
@pytest.mark.parametrize("grad", [False, True], ids=["forward", "forward+backward"])
def test_flops_match_xla_cost_analysis(seq_len, grad):
    # logits_chunk >= T keeps the chunked LM head out of a loop: XLA's cost analysis counts
    # a loop body once, whatever its trip count.
    # The dense attention: the blockwise kernel's loops would also be counted once.
    cfg = get_preset("tiny-qwen2", logits_chunk=1024, attention="naive")
    ours = (
        update_flops(cfg, 3, seq_len, num_iterations=1) if grad else forward_flops(cfg, 3, seq_len)
    )
    ratio = ours / _xla_flops(cfg, 3, seq_len, grad)
    # XLA also counts elementwise work (softmax over the T x T scores, log-softmax over the
    # vocabulary, RMSNorm, RoPE, SiLU, biases), so our matmul-only count must be below it.
    # Measured ratios: 0.972 (T=8) and 0.964 (T=64) forward, 0.973 / 0.971 with the
    # backward (XLA finds grad ~ 2.98x forward, confirming the 3x rule). 0.93 leaves room
    # for elementwise changes yet fails if the attention term (~13% at T=64) or the LM head
    # (~27%) were dropped; counting k/v with all query heads would push it above 1.
    assert 0.93 <= ratio <= 1.0, ratio


def test_compile_counts_warns_once_on_steady_state_recompile(caplog):
    fn = jax.jit(lambda x: x * 2)
    other = jax.jit(lambda x: x + 1)
    counts = CompileCounts(settle=1)
    counts.watch("double", fn)
    counts.watch("inc", other)
    caplog.set_level(logging.WARNING, logger="da3po_jax.runtime.perf")

    fn(jnp.ones(3))  # first step compiles: inside the settle period
    other(jnp.ones(3))
    assert counts.check(0) == {"compile/double": 1.0, "compile/inc": 1.0}
    fn(jnp.ones(3))  # same shape: cached
    assert counts.check(1) == {"compile/double": 1.0, "compile/inc": 1.0}
    assert not caplog.records

    fn(jnp.ones(5))  # new shape in steady state
    assert counts.check(2) == {"compile/double": 2.0, "compile/inc": 1.0}
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and record.name == "da3po_jax.runtime.perf"
    message = record.getMessage()
    assert "'double'" in message and "step 2" in message and "1 -> 2" in message
    assert "recompile" in message and "shape" in message

    caplog.clear()
    assert counts.check(3)["compile/double"] == 2.0  # no further growth: no new warning
    assert not caplog.records
    assert counts.snapshot() == {"compile/double": 2.0, "compile/inc": 1.0}


def test_compile_counts_counter_callables_and_errors(caplog):
    traces = [0]
    counts = CompileCounts(settle=2)
    counts.watch("sampler", count=lambda: traces[0])
    caplog.set_level(logging.WARNING, logger="da3po_jax.runtime.perf")
    for step in range(2):  # growth inside the 2-check settle period is not warned about
        traces[0] += 1
        counts.check(step)
    assert not caplog.records
    traces[0] += 1
    assert counts.check(2) == {"compile/sampler": 3.0}
    assert len(caplog.records) == 1 and "'sampler'" in caplog.records[0].getMessage()

    with pytest.raises(TypeError, match="not a jax.jit"):
        counts.watch("plain", lambda x: x)
    with pytest.raises(TypeError, match="exactly one"):
        counts.watch("none")
    with pytest.raises(ValueError, match="already watched"):
        counts.watch("sampler", jax.jit(lambda x: x))


def test_compile_counts_reads_nnx_jit_and_the_sampler():
    from da3po_jax.sampling import sampler

    counts = CompileCounts()
    nnx_fn = nnx.jit(lambda x: x - 1)
    counts.watch("nnx", nnx_fn)
    counts.watch("generate", sampler.generate_with_cache)  # a module-level jax.jit
    counts.watch("generate_traces", count=sampler.trace_count)
    nnx_fn(jnp.ones(2))
    snap = counts.snapshot()
    assert snap["compile/nnx"] == 1.0
    assert snap["compile/generate"] >= 0 and snap["compile/generate_traces"] >= 0


def test_peak_flops_positive_finite_and_cached():
    perf._peak_flops.cache_clear()  # a trainer test in this process may have measured it
    start = time.perf_counter()
    peak = peak_flops()
    first = time.perf_counter() - start
    assert math.isfinite(peak) and peak > 0
    start = time.perf_counter()
    assert peak_flops() == peak == peak_flops("float32") == peak_flops(jnp.float32)
    assert time.perf_counter() - start < 0.01 < first


def test_mfu_metrics():
    m = mfu_metrics(flops=6e12, seconds=2.0, peak=1e13)
    assert m == pytest.approx({"perf/update_tflops_per_s": 3.0, "perf/update_mfu": 0.3})
    m = mfu_metrics(flops=6e12, seconds=2.0, peak=1e13, num_devices=3)
    assert m == pytest.approx({"perf/update_tflops_per_s": 3.0, "perf/update_mfu": 0.1})
    zero = {"perf/update_tflops_per_s": 0.0, "perf/update_mfu": 0.0}
    assert mfu_metrics(1e12, 0.0, 1e13) == zero
    assert mfu_metrics(1e12, -1.0, 1e13) == zero
    assert mfu_metrics(1e12, 1.0, 0.0) == {"perf/update_tflops_per_s": 1.0, "perf/update_mfu": 0.0}


@pytest.mark.slow
@pytest.mark.parametrize("packing", [False, True])
def test_the_loop_logs_one_compile_per_function_and_a_flop_rate(tmp_path, caplog, packing):
    """Two steps of the micro config without a mesh (as benchmarks/rl_step.py runs it):
    the update, the DS round and the sampler compile once, in step 1 only (the initial
    state used to be uncommitted, and step 2 compiled all three again), with no
    recompile warning; the step logs a positive FLOP rate and MFU: over the padded batch
    (the same every step) or, packed, over the step's real sequences."""
    from test_train_smoke import HashScorer, micro_config

    from da3po_jax.config import resolve_settings
    from da3po_jax.rollout import PromptEncoder
    from da3po_jax.run.build import build_trainer
    from da3po_jax.run.context import RunContext
    from da3po_jax.run.inputs import load_datasets, policy_model, prompt_renderer, tokenizer_for

    # one prompt bucket: each round of every step has the same shapes; a response length
    # no other test uses, so this process has compiled none of these programs yet
    overrides = {
        "train.eval_every": 0,
        "rollout.prompt_buckets": (64,),
        "rollout.max_new_tokens": 7 if packing else 9,
        "rl.packing": packing,
    }
    cfg = resolve_settings(micro_config("dapo", **overrides))
    workdir = str(tmp_path)
    tokenizer = tokenizer_for(cfg, workdir)
    encoder = PromptEncoder(tokenizer, prompt_renderer(cfg, tokenizer), cfg.rollout.buckets)
    data = load_datasets(cfg.data, cfg.seed)
    ctx = RunContext(cfg, workdir, tokenizer, encoder, data, HashScorer())
    model = policy_model(cfg.model, tokenizer, seed=cfg.seed)
    model_cfg = model.config
    trainer = build_trainer(ctx, model)
    try:
        with caplog.at_level(logging.WARNING, logger="da3po_jax.runtime.perf"):
            first, second = trainer.step(), trainer.step()
    finally:
        trainer.close()
    for name in ("update", "ds_round", "sampler"):
        assert first[f"compile/{name}"] == second[f"compile/{name}"] == 1.0, name
    assert not [r for r in caplog.records if "compiled again" in r.getMessage()]
    for m in (first, second):
        assert m["perf/update_tflops_per_s"] > 0 and 0 < m["perf/update_mfu"] < 1
    flops = second["perf/update_tflops_per_s"] * 1e12 * second["time/update"]
    if packing:  # 3 passes' worth of every real sequence of step 2
        lens = trainer.update.last_lengths
        assert 0 < len(lens) and (lens < 64 + 7).all()
        want = 3 * perf.sequence_flops(model_cfg, lens)
        assert flops == pytest.approx(want, rel=1e-6)
        return
    # the FLOP count is the same for both steps, so the rates scale with 1 / time
    ratio = first["perf/update_tflops_per_s"] / second["perf/update_tflops_per_s"]
    assert ratio == pytest.approx(second["time/update"] / first["time/update"], rel=1e-6)
