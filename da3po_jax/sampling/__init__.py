"""Jitted KV-cached sampler: one prefill per prompt, G samples each, early-exit decode."""

from da3po_jax.sampling.distribution import SamplingParams, draw, sampling_logits
from da3po_jax.sampling.sampler import (
    GenerateConfig,
    SampleOutput,
    Sampler,
    generate,
    generate_with_cache,
    new_cache,
    prompt_keys,
    trace_count,
)

__all__ = [
    "GenerateConfig",
    "SampleOutput",
    "Sampler",
    "SamplingParams",
    "draw",
    "generate",
    "generate_with_cache",
    "new_cache",
    "prompt_keys",
    "sampling_logits",
    "trace_count",
]
