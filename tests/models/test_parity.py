"""Logits parity with `transformers` (torch, float32) on tiny random checkpoints."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import hf_logits, left_padded_batch, make_hf_model

from da3po_jax.models import load_model, positions_from_mask

pytestmark = pytest.mark.parity

ROPE_5E5 = {"rope_type": "default", "rope_theta": 5e5}
CASES = {
    "qwen2-tied": ("qwen2", dict(tie_word_embeddings=True)),
    "qwen2-untied": ("qwen2", dict(tie_word_embeddings=False)),
    "qwen3-theta1e6": ("qwen3", dict(tie_word_embeddings=True)),
    "qwen3-theta5e5-untied": (
        "qwen3",
        dict(
            tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 5e5}
        ),
    ),
    "llama3-scaled-rope": ("llama", dict(tie_word_embeddings=False)),
    "llama3-tied": ("llama", dict(tie_word_embeddings=True, attention_bias=True)),
}


def _ours(path, tokens, mask, **overrides):
    model = load_model(path, **overrides)
    mask_j = jnp.asarray(mask)
    logits, _ = model(jnp.asarray(tokens), positions_from_mask(mask_j), mask_j)
    return model, np.asarray(logits)


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(tmp_path, case):
    family, overrides = CASES[case]
    hf = make_hf_model(str(tmp_path), family, seed=1, **overrides)
    tokens, mask = left_padded_batch(1000, lengths=(11, 6, 3))
    # Positions beyond the original context exercise all three llama3 frequency bands.
    ref = hf_logits(hf, tokens, mask)
    model, ours = _ours(str(tmp_path), tokens, mask)
    assert model.config.model_type == family
    assert np.abs(ref).max() > 1.0  # weights are large enough for the check to bite
    diff = np.abs(ours - ref)[mask]
    assert diff.max() <= 1e-4, f"max |logits diff| = {diff.max():.3g}"
    _, scanned = _ours(str(tmp_path), tokens, mask, scan_layers=True)  # the stacked layout
    diff = np.abs(scanned - ref)[mask]
    assert diff.max() <= 1e-4, f"scanned: max |logits diff| = {diff.max():.3g}"


def test_config_reads_rope_and_head_dim(tmp_path):
    make_hf_model(
        str(tmp_path), "qwen3", rope_parameters={"rope_type": "default", "rope_theta": 5e5}
    )
    model = load_model(str(tmp_path))
    assert model.config.rope_theta == 5e5
    assert model.config.head_dim == 24 != model.config.hidden_size // model.config.num_heads
    assert model.config.qk_norm and not model.config.attention_bias


def test_llama3_long_positions_match(tmp_path):
    """Positions past original_max_position_embeddings (64) use the scaled frequencies."""
    hf = make_hf_model(str(tmp_path), "llama", seed=2)
    tokens, mask = left_padded_batch(1000, lengths=(150, 97), seed=3)
    ref = hf_logits(hf, tokens, mask)
    _, ours = _ours(str(tmp_path), tokens, mask)
    assert np.abs(ours - ref)[mask].max() <= 1e-4


def test_token_logprobs_match_log_softmax(tmp_path):
    hf = make_hf_model(str(tmp_path), "qwen2", seed=4)
    tokens, mask = left_padded_batch(1000, lengths=(12, 7, 4), seed=5)
    ref = hf_logits(hf, tokens, mask)
    ref = (
        ref
        - np.log(np.exp(ref - ref.max(-1, keepdims=True)).sum(-1, keepdims=True))
        - ref.max(-1, keepdims=True)
    )
    targets = np.roll(tokens, -1, axis=1)
    ref_lp = np.take_along_axis(ref, targets[..., None], -1)[..., 0]
    p = np.exp(ref)
    ref_ent = -(p * ref).sum(-1)
    model = load_model(str(tmp_path), logits_chunk=5)  # 12 positions -> 3 chunks, padded
    mask_j = jnp.asarray(mask)
    lp, ent = model.token_logprobs(
        jnp.asarray(tokens), positions_from_mask(mask_j), mask_j, jnp.asarray(targets)
    )
    assert np.abs(np.asarray(lp) - ref_lp)[mask].max() <= 1e-4
    assert np.abs(np.asarray(ent) - ref_ent)[mask].max() <= 1e-4
