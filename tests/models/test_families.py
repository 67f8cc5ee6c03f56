"""The decoder families registry (`models/families.py: FAMILIES`): each registered family
reads the `config.json` that `transformers` writes for it and writes one that
`transformers` reads back to the same structure; a new family is one registration, and an
unknown `model_type` is refused with the registered names."""

from __future__ import annotations

import pytest
from conftest import _hf_config

from da3po_jax.models import FAMILIES, ModelConfig, ModelFamily, register_family
from da3po_jax.models.families import family, unregister_family

# what each family's structural switches are for the tiny configs of the parity tests
EXPECTED = {
    "qwen2": {"attention_bias": True, "o_bias": False, "qk_norm": False},
    "qwen3": {"attention_bias": False, "o_bias": False, "qk_norm": True},
    "llama": {"attention_bias": False, "o_bias": False, "qk_norm": False},
}


def test_the_supported_families_are_registered():
    assert list(FAMILIES) == ["qwen2", "qwen3", "llama"]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_family_reads_and_writes_what_transformers_does(name):
    import transformers

    hf = _hf_config(name).to_dict()
    cfg = ModelConfig.from_hf_dict(hf)
    assert {k: getattr(cfg, k) for k in EXPECTED[name]} == EXPECTED[name]
    written = cfg.to_hf_dict()
    assert written["architectures"] == [family(name).architecture]
    assert getattr(transformers, family(name).architecture).config_class.model_type == name
    rest = {k: v for k, v in written.items() if k != "model_type"}
    back = transformers.AutoConfig.for_model(name, **rest)
    assert ModelConfig.from_hf_dict(back.to_dict()) == cfg


def test_llama_with_attention_bias_has_it_on_every_projection():
    cfg = ModelConfig.from_hf_dict(_hf_config("llama", attention_bias=True).to_dict())
    assert cfg.attention_bias and cfg.o_bias and cfg.to_hf_dict()["attention_bias"] is True


@pytest.mark.parametrize(
    "name, edit, message",
    [
        ("llama", {"mlp_bias": True}, "mlp_bias=true"),
        ("qwen2", {"use_sliding_window": True}, "use_sliding_window=true"),
        ("qwen3", {"use_sliding_window": True}, "use_sliding_window=true"),
    ],
)
def test_options_a_family_cannot_compute_are_refused(name, edit, message):
    hf = {**_hf_config(name).to_dict(), **edit}
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf_dict(hf)


def test_a_new_family_is_one_registration():
    """A Mistral-like family (Llama's layout, its own architecture name): read, built,
    exported under its names; refused again once unregistered."""
    hf = {**_hf_config("llama").to_dict(), "model_type": "tinyfam"}
    known = r"unknown model_type 'tinyfam'.*'llama', 'qwen2', 'qwen3'"
    with pytest.raises(ValueError, match=known):
        ModelConfig.from_hf_dict(hf)
    register_family(
        ModelFamily(
            "tinyfam",
            "TinyFamForCausalLM",
            read=lambda hf: {"attention_bias": False, "o_bias": False, "qk_norm": False},
            write=lambda cfg: {"tinyfam_version": 1},
        )
    )
    try:
        with pytest.raises(ValueError, match="already registered"):
            register_family(ModelFamily("tinyfam", "X", read=dict, write=dict))
        cfg = ModelConfig.from_hf_dict(hf)
        assert cfg.model_type == "tinyfam" and cfg.num_params() > 0
        out = cfg.to_hf_dict()
        assert out["architectures"] == ["TinyFamForCausalLM"] and out["tinyfam_version"] == 1
    finally:
        unregister_family("tinyfam")
    assert "tinyfam" not in FAMILIES
    with pytest.raises(ValueError, match="unknown model_type 'tinyfam'"):
        ModelConfig(**{**cfg.__dict__})
