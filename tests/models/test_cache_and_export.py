"""KV-cached decoding equals the full forward; export round-trips through transformers."""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import hf_logits, left_padded_batch, make_hf_model

from da3po_jax.models import (
    KVCache,
    get_preset,
    init_model,
    load_model,
    positions_from_mask,
    save_model,
)


@pytest.mark.parametrize(
    "preset_overrides",
    [{}, {"model_type": "qwen3", "qk_norm": True, "attention_bias": False, "head_dim": 24}],
)
def test_cached_decoding_matches_full_forward(preset_overrides):
    cfg = get_preset("tiny-qwen2", **preset_overrides)
    model = init_model(cfg, seed=3)
    tokens, mask = left_padded_batch(cfg.vocab_size, lengths=(12, 8, 5), seed=1)
    tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
    pos = positions_from_mask(mask)
    full, _ = model(tokens, pos, mask)

    prefill = 6  # the shortest row is still all padding in the prefill
    cache = KVCache.init(cfg, batch=3, max_len=16)  # longer than needed: spare slots unused
    first, cache = model(tokens[:, :prefill], pos[:, :prefill], mask[:, :prefill], cache)
    steps = [first]
    for t in range(prefill, tokens.shape[1]):
        out, cache = model(tokens[:, t : t + 1], pos[:, t : t + 1], mask[:, t : t + 1], cache)
        steps.append(out)
    cached = jnp.concatenate(steps, axis=1)
    assert int(cache.index) == tokens.shape[1]
    np.testing.assert_array_equal(np.asarray(cache.mask[:, :12]), np.asarray(mask))
    assert not np.asarray(cache.mask[:, 12:]).any()
    diff = np.abs(np.asarray(cached - full))[np.asarray(mask)]
    assert diff.max() <= 1e-5


def test_export_roundtrip_through_transformers(tmp_path, tokenizer_dir):
    import transformers

    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    make_hf_model(src, "qwen3", seed=7, tie_word_embeddings=False)
    model = load_model(src)
    save_model(model, out, tokenizer_dir=tokenizer_dir)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"):
        assert os.path.isfile(os.path.join(out, name)), name
    reloaded = (
        transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
        .float()
        .eval()
    )
    tokens, mask = left_padded_batch(1000, lengths=(7, 4), seed=2)
    ours, _ = model(jnp.asarray(tokens), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask))
    ref = hf_logits(reloaded, tokens, mask)
    assert np.abs(np.asarray(ours) - ref)[mask].max() <= 1e-4
    assert transformers.AutoTokenizer.from_pretrained(out).encode("Hello world")


def test_random_init_export_sharded_roundtrip(tmp_path):
    """A preset model exported in several shards loads back in transformers and in ours."""
    import transformers

    cfg = get_preset("tiny-qwen2", vocab_size=1000, tie_word_embeddings=False)
    model = init_model(cfg, seed=5)
    out = str(tmp_path / "export")
    save_model(model, out, max_shard_bytes=200_000)
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        files = set(json.load(f)["weight_map"].values())
    assert len(files) >= 2 and all(os.path.isfile(os.path.join(out, n)) for n in files)
    tokens, mask = left_padded_batch(1000, lengths=(6, 3), seed=4)
    ours, _ = model(jnp.asarray(tokens), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask))
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    assert np.abs(np.asarray(ours) - hf_logits(hf.float().eval(), tokens, mask))[mask].max() <= 1e-4
    again, _ = load_model(out)(
        jnp.asarray(tokens), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask)
    )
    np.testing.assert_array_equal(np.asarray(again), np.asarray(ours))


def test_export_refuses_to_overwrite(tmp_path):
    model = init_model(get_preset("tiny-qwen2"), seed=0)
    out = tmp_path / "existing"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="not empty"):
        save_model(model, str(out))
    assert (out / "keep.txt").read_text() == "precious"
    save_model(model, str(out), overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".export-")]
