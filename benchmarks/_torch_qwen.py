"""The `transformers` side of `forward.py --suite=torch`: a randomly initialised Qwen2
causal LM of a `ModelConfig`'s shapes and one timed training forward+backward.

Imported lazily (only that suite needs torch); nothing is downloaded.
"""

from __future__ import annotations

import time

import torch
import transformers


def build(cfg, threads: int) -> torch.nn.Module:
    """A float32 `Qwen2ForCausalLM` of `cfg`'s shapes (random init, SDPA attention), in
    train mode, running on `threads` intra-op threads."""
    torch.set_num_threads(threads)
    hf = transformers.Qwen2Config(**{**cfg.to_hf_dict(), "use_cache": False})
    model = transformers.AutoModelForCausalLM.from_config(
        hf, attn_implementation="sdpa", dtype=torch.float32
    )
    return model.to(torch.float32).train()


def inputs(tokens) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, next-token targets) of a [B, T] integer array, as in the JAX loss:
    targets = tokens rolled left by one, every position counted."""
    ids = torch.as_tensor(tokens.copy(), dtype=torch.long)
    return ids, torch.roll(ids, -1, dims=1)


def train_step(model: torch.nn.Module, ids: torch.Tensor, targets: torch.Tensor) -> float:
    """Wall seconds of forward + mean cross-entropy over all positions + backward (into
    fresh gradient buffers, which are dropped again afterwards)."""
    start = time.perf_counter()
    logits = model(input_ids=ids, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1)
    )
    loss.backward()
    seconds = time.perf_counter() - start
    del logits, loss
    model.zero_grad(set_to_none=True)  # free the gradients before the other side runs
    return seconds


def versions() -> dict[str, str]:
    return {"torch": torch.__version__, "transformers": transformers.__version__}
