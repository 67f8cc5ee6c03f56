"""Performance accounting for the trainer: compile counts, model FLOPs, peak FLOP/s, MFU.

Two failure modes are invisible in loss curves but cost most of a run's time: a jitted
function that compiles again every few steps (a new prompt-length bucket, a new static
argument) and an update that runs far below the chip's peak. `CompileCounts` makes the
first visible as `compile/<name>` metrics plus a warning; `forward_flops`, `update_flops`,
`peak_flops` and `mfu_metrics` turn a timed update into achieved FLOP/s and MFU.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from da3po_jax.models.config import ModelConfig

logger = logging.getLogger(__name__)


def _cache_size_of(fn: Any) -> Callable[[], int] | None:
    """`fn`'s compiled-program counter, or None when `fn` is not a jitted callable.

    `jax.jit` returns a `PjitFunction` whose `_cache_size()` is the number of entries in
    its executable cache (one per input signature: shapes, dtypes, shardings, static
    arguments). `flax.nnx.jit` wraps one as `.jitted_fn`.
    """
    for candidate in (fn, getattr(fn, "jitted_fn", None)):
        size = getattr(candidate, "_cache_size", None)
        if callable(size):
            return size
    return None


class CompileCounts:
    """Counts compiled programs of named jitted functions and warns on steady-state recompiles.

    Two kinds of counters can be watched:

    * `watch(name, fn)` with a `jax.jit` (or `nnx.jit`) function reads `fn._cache_size()`,
      the number of compiled programs currently held in that function's in-memory cache.
      It is exact and per function, but drops if the cache is cleared
      (`jax.clear_caches()`); a drop resets the baseline and never warns.
    * `watch(name, count=callable)` reads any counter, e.g. `sampling.trace_count` for the
      sampler's module-level `generate_with_cache`. Such counters are usually *trace*
      counts: they grow on every Python re-trace, also when XLA then finds the program in
      its compilation cache, so they can exceed the number of distinct programs; they
      never shrink.

    A function's cache is shared by every `jax.jit` wrapper of it in the process (two
    trainers in one process, e.g. tests, reuse each other's programs), so the counts
    reported are those added since `watch`: the programs this run compiled.

    Attributes:
      settle: how many `check` calls are the warm-up, during which growth is expected (the
        first step compiles everything) and not warned about.
    """

    def __init__(self, settle: int = 1):
        if settle < 0:
            raise ValueError(f"settle={settle} must be >= 0")
        self.settle = settle
        self._counters: dict[str, Callable[[], int]] = {}
        self._base: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._checks = 0

    def watch(self, name: str, fn: Any = None, *, count: Callable[[], int] | None = None) -> None:
        """Registers a jitted function `fn`, or a zero-argument `count` callable.

        Raises:
          TypeError: `fn` is not a jitted callable (plain functions have no compile cache
            to read), or not exactly one of `fn` / `count` is given.
          ValueError: `name` is already watched.
        """
        if (fn is None) == (count is None):
            raise TypeError("CompileCounts.watch takes exactly one of fn= or count=")
        if name in self._counters:
            raise ValueError(f"{name!r} is already watched")
        if count is None:
            count = _cache_size_of(fn)
            if count is None:
                raise TypeError(
                    f"cannot watch {name!r}: {fn!r} is not a jax.jit-wrapped function (it has "
                    "no _cache_size()); pass a jitted function, or count=<callable returning "
                    "a compile/trace count>"
                )
        elif not callable(count):
            raise TypeError(f"count= for {name!r} must be a callable returning an int")
        self._counters[name] = count
        self._base[name] = float(count())
        self._last[name] = 0.0

    def snapshot(self) -> dict[str, float]:
        """`{"compile/<name>": count}` for every watched function (programs added since
        `watch`), as floats for the logger."""
        snap = {}
        for name, count in self._counters.items():
            raw = float(count())
            if raw < self._base[name]:  # the cache was cleared: count from empty
                self._base[name] = 0.0
            snap[f"compile/{name}"] = raw - self._base[name]
        return snap

    def check(self, step: int) -> dict[str, float]:
        """The snapshot; warns once per function whose count grew since the previous check.

        The first `settle` calls only record the counts: growth there is the expected
        first compile. Afterwards a growing count means a compile inside the training loop,
        which stalls every device for seconds to minutes, so it is worth a warning.
        """
        snap = self.snapshot()
        steady = self._checks >= self.settle
        for name in self._counters:
            old, new = self._last[name], snap[f"compile/{name}"]
            if steady and new > old:
                logger.warning(
                    "jitted function %r compiled again at step %d (%d -> %d programs): a new "
                    "input shape or static argument made it recompile (e.g. a new "
                    "prompt-length bucket); steady-state recompiles stall training",
                    name,
                    step,
                    old,
                    new,
                )
            self._last[name] = new
        self._checks += 1
        return snap


def forward_flops(
    model_config: ModelConfig, rows: int, seq_len: int, *, logits_positions: int | None = None
) -> float:
    """Model FLOPs of one dense forward of `rows` sequences of `seq_len` tokens.

    Counts 2 FLOPs per multiply-add of every matmul, as computed by
    `Transformer.token_logprobs`: the q/k/v/o projections (k and v with `num_kv_heads`),
    the SwiGLU MLP (gate, up, down), attention scores and weighted values over the full
    T x T square per head (the kernel masks but does not skip the upper triangle, so
    nothing is halved for causality), and the LM head. The LM head runs on positions
    padded up to a multiple of `model_config.logits_chunk` (`chunked_logprobs`), so those padded
    positions are counted too; the embedding lookup is a gather and free. Norms, RoPE,
    softmax and biases are elementwise and left out, as in the usual MFU convention.
    `logits_positions` counts the LM head at that many positions instead (e.g. 1 for a
    prefill that only needs the last token's logits).
    """
    t = seq_len
    h, d, inter = model_config.hidden_size, model_config.head_dim, model_config.intermediate_size
    q, kv = model_config.num_heads * d, model_config.num_kv_heads * d
    projections = 2 * t * h * (2 * q + 2 * kv)  # q, o: h x q; k, v: h x kv
    mlp = 2 * t * 3 * h * inter
    attention = model_config.num_heads * 2 * 2 * t * t * d  # q k^T and p v
    chunk = max(1, min(model_config.logits_chunk, t))
    positions = math.ceil(t / chunk) * chunk if logits_positions is None else logits_positions
    head = 2 * positions * h * model_config.vocab_size
    per_row = model_config.num_layers * (projections + mlp + attention) + head
    return float(rows * per_row)


def sequence_flops(model_config: ModelConfig, lengths) -> float:
    """Model FLOPs of one forward over each of `lengths` (real-token counts) on its own,
    attention over each sequence's own T x T square and the LM head at its T positions:
    the work of a packed update, whatever the padding."""
    return float(
        sum(forward_flops(model_config, 1, int(t), logits_positions=int(t)) for t in lengths)
    )


def update_flops(
    model_config: ModelConfig,
    rows: int,
    seq_len: int,
    *,
    num_iterations: int,
    extra_forwards: int = 0,
    extra_flops: float = 0.0,
) -> float:
    """Model FLOPs of one RL update over `rows` sequences of `seq_len` tokens.

    Each of the `num_iterations` passes runs forward and backward over every row; the
    backward costs about twice the forward (gradients w.r.t. activations and weights),
    hence 3x. `extra_forwards` counts forward-only passes of the same config (recomputed
    old log-probs, the reference model, a same-shape teacher); `extra_flops` adds FLOPs
    of differently shaped models (e.g. `forward_flops(teacher_model_config, rows, seq_len)`).

    Note: with `model_config.remat` (and always for the chunked logits) the backward recomputes
    forward activations. That is hardware work, not model work: like the usual MFU
    definition, this reports model FLOPs, so remat lowers MFU instead of inflating it.
    """
    forward = forward_flops(model_config, rows, seq_len)
    return num_iterations * 3 * forward + extra_forwards * forward + float(extra_flops)


# Matmul side per backend: large enough to reach the matmul peak, small enough to be cheap
# (1024 f32 on a 2-core CPU: ~10 ms a run, within a few % of 2048's rate; 8192 on an
# accelerator: a few ms a run).
_PEAK_N = {"cpu": 1024}
_PEAK_N_ACCELERATOR = 4096  # 0.14 TFLOP per dot: long enough to time, small next to a model


def peak_flops(dtype: str = "float32") -> float:
    """Measured peak matmul FLOP/s of one default device, cached per process and dtype.

    Datasheet peaks differ per chip, clock and precision mode (e.g. TF32 for float32 on
    GPUs) and do not exist for CPUs, so MFU is taken against what a large square
    `jnp.dot` in `dtype` achieves here: the best of a few timed runs after a warm-up
    (which also compiles). Costs ~0.2 s on a small CPU and briefly holds 3 n x n arrays
    (192 MiB at n = 4096 float32) on an accelerator.
    """
    return _peak_flops(jnp.dtype(dtype).name)  # "float32", jnp.float32 -> one cache entry


@functools.cache
def _peak_flops(dtype: str) -> float:
    device = jax.devices()[0]
    n = _PEAK_N.get(device.platform, _PEAK_N_ACCELERATOR)
    dot = jax.jit(jnp.dot)
    a = jax.device_put(jnp.ones((n, n), dtype), device)
    b = jax.device_put(jnp.full((n, n), 0.5, dtype), device)
    dot(a, b).block_until_ready()  # compile + warm-up
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        dot(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    del a, b
    return 2.0 * n**3 / best


def mfu_metrics(
    flops: float, seconds: float, peak: float, *, num_devices: int = 1
) -> dict[str, float]:
    """Achieved TFLOP/s and model FLOP utilisation of an update.

    Args:
      flops: model FLOPs of the update (`update_flops`), summed over all devices.
      seconds: wall time of the update (after `block_until_ready`).
      peak: peak FLOP/s of one device (`peak_flops`).
      num_devices: devices the update ran on; MFU divides by their combined peak.

    Returns:
      `{"perf/update_tflops_per_s", "perf/update_mfu"}`; 0.0 when `seconds` or `peak`
      is not positive (e.g. an untimed step), so a bad timer never logs inf/NaN.
    """
    if seconds <= 0 or not math.isfinite(seconds):
        return {"perf/update_tflops_per_s": 0.0, "perf/update_mfu": 0.0}
    rate = flops / seconds
    total_peak = peak * num_devices
    mfu = rate / total_peak if total_peak > 0 and math.isfinite(total_peak) else 0.0
    return {"perf/update_tflops_per_s": rate / 1e12, "perf/update_mfu": mfu}
