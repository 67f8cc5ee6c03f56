"""bfloat16 end to end, and preset shapes against transformers' own parameter count."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import left_padded_batch, make_hf_model
from flax import nnx

from da3po_jax.models import (
    PRESETS,
    KVCache,
    get_preset,
    init_model,
    load_model,
    positions_from_mask,
    save_model,
)
from da3po_jax.models.safetensors_io import SafetensorsFile


def test_bf16_dtypes_end_to_end(tmp_path):
    path = str(tmp_path / "m")
    make_hf_model(path, "qwen2", seed=2, save_kwargs={})
    f32 = load_model(path)
    bf16 = load_model(path, param_dtype="bfloat16", dtype="bfloat16")
    params = jax.tree.leaves(nnx.state(bf16, nnx.Param))
    assert params and all(p.dtype == jnp.bfloat16 for p in params)

    tokens, mask = left_padded_batch(1000, lengths=(8, 5), seed=1)
    tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
    pos = positions_from_mask(mask)
    h, _ = bf16.hidden(tokens, pos, mask)
    assert h.dtype == jnp.bfloat16
    logits_bf16, _ = bf16(tokens, pos, mask)
    logits_f32, _ = f32(tokens, pos, mask)
    assert logits_bf16.dtype == jnp.float32  # logits and log-probs are always float32
    # bf16 has an 8-bit mantissa: agreement to a few percent of the logit scale.
    scale = np.abs(np.asarray(logits_f32)).max()
    err = np.abs(np.asarray(logits_bf16 - logits_f32))[np.asarray(mask)].max()
    assert err <= 0.05 * scale, (err, scale)
    cache = KVCache.init(bf16.config, 2, 10)
    assert cache.k[0].dtype == jnp.bfloat16
    _, cache = bf16(tokens, pos, mask, cache)
    assert cache.k[0].dtype == jnp.bfloat16 and int(cache.index) == 8
    lp, ent = bf16.token_logprobs(tokens, pos, mask, jnp.roll(tokens, -1, 1))
    assert lp.dtype == ent.dtype == jnp.float32 and np.isfinite(np.asarray(lp)).all()

    out = str(tmp_path / "bf16_export")
    save_model(bf16, out)
    st = SafetensorsFile(f"{out}/model.safetensors")
    assert {st._entries[k]["dtype"] for k in st.keys()} == {"BF16"}
    back = load_model(out)
    assert back.config.param_dtype == "float32"  # the caller chooses; values are the bf16 ones
    np.testing.assert_array_equal(
        np.asarray(back.embed[...]), np.asarray(bf16.embed[...]).astype(np.float32)
    )


@pytest.mark.parametrize("name", sorted(n for n in PRESETS if not n.startswith("tiny")))
def test_preset_parameter_count_matches_transformers(name):
    import torch
    import transformers

    cfg = get_preset(name)
    hf_cfg = transformers.AutoConfig.for_model(**cfg.to_hf_dict())
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    expected = sum(p.numel() for p in hf.parameters())  # tied weights counted once
    assert cfg.num_params() == expected
    abstract = nnx.eval_shape(lambda: init_model(cfg.replace(num_layers=1), 0))
    one_layer = sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    assert one_layer == cfg.replace(num_layers=1).num_params()


def test_known_published_sizes():
    """Sizes published on the model cards (total parameters)."""
    assert PRESETS["qwen2.5-0.5b"].num_params() == 494_032_768
    assert PRESETS["qwen2.5-7b"].num_params() == 7_615_616_512
    assert PRESETS["llama-3.2-1b"].num_params() == 1_235_814_400


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown model preset 'gpt2'"):
        get_preset("gpt2")
