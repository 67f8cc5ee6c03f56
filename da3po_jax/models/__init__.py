"""Policy models: one Flax NNX decoder for Qwen2/2.5, Qwen3 and Llama-3, HF I/O, tokenizer."""

from da3po_jax.models.config import ModelConfig, RopeScaling
from da3po_jax.models.families import FAMILIES, ModelFamily, register_family
from da3po_jax.models.hf_io import load_model, param_table, save_model
from da3po_jax.models.presets import PRESETS, abstract_model, get_preset, init_model
from da3po_jax.models.transformer import KVCache, SlotCache, Transformer, positions_from_mask

__all__ = [
    "FAMILIES",
    "KVCache",
    "SlotCache",
    "ModelConfig",
    "ModelFamily",
    "PRESETS",
    "RopeScaling",
    "Transformer",
    "abstract_model",
    "get_preset",
    "init_model",
    "load_model",
    "param_table",
    "positions_from_mask",
    "register_family",
    "save_model",
]
