"""Checkpoint loading: sharded index files, target shardings and every error message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import hf_logits, left_padded_batch, make_hf_model

from da3po_jax.models import ModelConfig, load_model, positions_from_mask
from da3po_jax.models.safetensors_io import SafetensorsFile, save_safetensors
from da3po_jax.models.tokenizer import Tokenizer


@pytest.fixture
def qwen2_dir(tmp_path):
    path = str(tmp_path / "qwen2")
    make_hf_model(path, "qwen2", seed=3)
    return path


def _rewrite(path: str, edit):
    """Rewrites model.safetensors in `path` with `edit(dict) -> dict` applied."""
    fname = os.path.join(path, "model.safetensors")
    st = SafetensorsFile(fname)
    tensors = {k: np.array(st.get(k)) for k in st.keys()}
    del st
    save_safetensors(fname, edit(tensors))


def test_sharded_index_with_two_shards(tmp_path):
    path = str(tmp_path / "sharded")
    hf = make_hf_model(
        path, "qwen2", seed=4, tie_word_embeddings=False, save_kwargs={"max_shard_size": "200KB"}
    )
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        assert len(set(json.load(f)["weight_map"].values())) >= 2
    assert not os.path.exists(os.path.join(path, "model.safetensors"))
    tokens, mask = left_padded_batch(1000, lengths=(5, 3))
    calls = []
    model = load_model(path, progress=lambda done, total: calls.append((done, total)))
    ours, _ = model(jnp.asarray(tokens), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask))
    assert np.abs(np.asarray(ours) - hf_logits(hf, tokens, mask))[mask].max() <= 1e-4
    assert calls[-1][0] == calls[-1][1] == len(calls)


def test_missing_tensor_is_named(qwen2_dir):
    _rewrite(
        qwen2_dir,
        lambda t: {k: v for k, v in t.items() if k != "model.layers.1.mlp.up_proj.weight"},
    )
    with pytest.raises(ValueError, match=r"missing tensors: \['model.layers.1.mlp.up_proj.wei"):
        load_model(qwen2_dir)


def test_unexpected_tensor_is_named(qwen2_dir):
    _rewrite(qwen2_dir, lambda t: {**t, "model.extra.weight": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match=r"unexpected tensors: \['model.extra.weight'\]"):
        load_model(qwen2_dir)


def test_wrong_shape_is_named(qwen2_dir):
    name = "model.layers.0.self_attn.k_proj.weight"
    _rewrite(qwen2_dir, lambda t: {**t, name: np.zeros((16, 64), np.float32)})
    with pytest.raises(ValueError, match=rf"{name}.*shape \(16, 64\), expected \(32, 64\)"):
        load_model(qwen2_dir)


def test_unknown_model_type_lists_supported(qwen2_dir):
    cfg_path = os.path.join(qwen2_dir, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["model_type"] = "gpt_neox"
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    with pytest.raises(
        ValueError, match=r"unknown model_type 'gpt_neox'.*\['llama', 'qwen2', 'qwen3']"
    ):
        load_model(qwen2_dir)


def test_missing_files_are_named(tmp_path, qwen2_dir):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(str(tmp_path))
    os.remove(os.path.join(qwen2_dir, "model.safetensors"))
    with pytest.raises(FileNotFoundError, match="no model.safetensors or model.safetensors.index"):
        load_model(qwen2_dir)
    with pytest.raises(FileNotFoundError, match="no tokenizer in"):
        Tokenizer.load(qwen2_dir)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Tokenizer.load(str(tmp_path / "nope"))


def test_transformers4_style_config_is_read():
    cfg = ModelConfig.from_hf_dict(
        {
            "model_type": "llama",
            "vocab_size": 10,
            "hidden_size": 8,
            "intermediate_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "rope_theta": 123.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        }
    )
    assert cfg.rope_theta == 123.0 and cfg.rope_scaling.factor == 8.0 and cfg.head_dim == 4
    with pytest.raises(ValueError, match="missing the field 'num_attention_heads'"):
        ModelConfig.from_hf_dict({"model_type": "qwen2"})
    with pytest.raises(ValueError, match="unsupported rope_type 'yarn'"):
        ModelConfig.from_hf_dict({**cfg.to_hf_dict(), "rope_parameters": {"rope_type": "yarn"}})


def test_loading_into_sharded_layout_places_only_local_slices(qwen2_dir):
    """With 4 CPU devices, each parameter arrives split as the target sharding says."""
    script = textwrap.dedent(f"""
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
        import jax, numpy as np
        from jax.sharding import NamedSharding, PartitionSpec as P
        from da3po_jax.models import load_model
        mesh = jax.make_mesh((4,), ("fsdp",))
        def rule(path, shape):
            return NamedSharding(mesh, P("fsdp") if shape[0] % 4 == 0 else P())
        m = load_model({qwen2_dir!r}, sharding=rule)
        ref = load_model({qwen2_dir!r})
        emb, gate = m.embed[...], m.layers[0].mlp.gate[...]
        assert [s.data.shape for s in emb.addressable_shards] == [(250, 64)] * 4
        assert [s.data.shape for s in gate.addressable_shards] == [(16, 128)] * 4
        assert len({{s.device for s in gate.addressable_shards}}) == 4
        np.testing.assert_array_equal(np.asarray(emb), np.asarray(ref.embed[...]))
        print("OK")
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]
