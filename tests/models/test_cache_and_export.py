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


def test_remat_changes_neither_samples_nor_gradients():
    """`model.remat` (every real recipe sets it) only trades compute for memory in the
    backward pass; the sampler's jitted decode loop once failed under it with a flax
    TraceContextError (nnx.remat writing layer state back across trace levels)."""
    import jax
    from flax import nnx

    from da3po_jax.sampling import GenerateConfig, generate

    tokens, mask = (jnp.asarray(a) for a in left_padded_batch(512, lengths=(7, 4), seed=2))
    config = GenerateConfig(num_samples=2, max_new_tokens=5, temperature=1.0)
    results = []
    for remat in (False, True):
        graphdef, state = nnx.split(init_model(get_preset("tiny-qwen2", remat=remat), seed=5))
        out = generate(graphdef, state, tokens, mask, jax.random.key(0), config)

        def loss(state, graphdef=graphdef):
            model = nnx.merge(graphdef, state)
            targets = jnp.roll(tokens, -1, axis=1)
            logp, _ = model.token_logprobs(tokens, positions_from_mask(mask), mask, targets)
            return -(logp * mask).sum()

        grads = jax.jit(jax.grad(loss))(state)
        results.append((np.asarray(out.tokens), np.asarray(out.logp), jax.tree.leaves(grads)))
    (tok0, logp0, grads0), (tok1, logp1, grads1) = results
    np.testing.assert_array_equal(tok0, tok1)
    np.testing.assert_allclose(logp0, logp1, atol=1e-5)
    for g0, g1 in zip(grads0, grads1, strict=True):
        np.testing.assert_allclose(np.asarray(g0), np.asarray(g1), atol=1e-5)
