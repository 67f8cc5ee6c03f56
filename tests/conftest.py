"""Shared fixtures: tiny random `transformers` models and a tiny tokenizer, built locally."""

from __future__ import annotations

import os

import numpy as np
import pytest


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """Frees every compiled program after each test file. A CPU executable holds a few
    memory mappings for its JIT code; a worker process that kept every file's programs
    alive reached the kernel's per-process limit (vm.max_map_count, 65530), and XLA
    crashed (SIGSEGV) compiling the next one."""
    yield
    import gc
    import sys

    if "jax" in sys.modules:
        sys.modules["jax"].clear_caches()
    gc.collect()


# The suite runs on CPU. With libtpu installed (the test extra, for tests/compile) JAX would
# otherwise probe for a TPU in every worker; on a TPU VM set JAX_PLATFORMS=tpu,cpu for the
# tests marked `tpu`.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TINY = dict(
    vocab_size=1000,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)

CORPUS = [
    f"Question: what is {a} + {b}? Answer: {a + b}. The sum of {a} and {b} is {a + b}."
    for a in range(40)
    for b in range(0, 40, 3)
] + ["Hello world, this is a tiny tokenizer for tests.", "Let x = 3 and y = 4; then x*y = 12."]


def _hf_config(family: str, **overrides):
    import transformers

    kwargs = dict(TINY, attn_implementation="eager")
    if family == "qwen2":
        cls = transformers.Qwen2Config
        kwargs.update(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    elif family == "qwen3":
        cls = transformers.Qwen3Config
        kwargs.update(head_dim=24, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    elif family == "llama":
        cls = transformers.LlamaConfig
        kwargs.update(
            rms_norm_eps=1e-5,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
    else:
        raise ValueError(family)
    kwargs.update(overrides)
    return cls(**kwargs)


def randomize_(model, seed: int = 0):
    """Gives every parameter, norms and biases included, non-trivial random values so a
    mis-mapped tensor cannot hide behind a default of ones or zeros."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(0.08 * noise)


def make_hf_model(path: str, family: str, seed: int = 0, save_kwargs=None, **overrides):
    """Builds, randomises and saves a tiny HF causal LM; returns the torch model (eval)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = _hf_config(family, **overrides)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
    randomize_(model, seed)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    model.save_pretrained(path, **(save_kwargs or {}))
    return model


def hf_logits(model, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """float32 logits of a HF model on a left-padded batch with explicit positions."""
    import torch

    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(tokens, dtype=torch.long),
            attention_mask=torch.tensor(mask.astype(np.int64)),
            position_ids=torch.tensor(positions, dtype=torch.long),
        )
    return out.logits.float().numpy()


def left_padded_batch(vocab: int, lengths=(9, 5, 2), seed: int = 0):
    """Random tokens [B, T] and mask [B, T] of a left-padded batch of unequal lengths."""
    rng = np.random.default_rng(seed)
    t = max(lengths)
    tokens = rng.integers(0, vocab, size=(len(lengths), t)).astype(np.int32)
    mask = np.zeros((len(lengths), t), np.bool_)
    for i, n in enumerate(lengths):
        mask[i, t - n :] = True
    tokens[~mask] = 0
    return tokens, mask


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    from da3po_jax.models.tokenizer import build_bpe_tokenizer

    path = str(tmp_path_factory.mktemp("tok"))
    return build_bpe_tokenizer(path, CORPUS, vocab_size=400)
