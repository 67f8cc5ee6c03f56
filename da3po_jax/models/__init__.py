"""Policy models: one Flax NNX decoder for Qwen2/2.5, Qwen3 and Llama-3, HF I/O, tokenizer."""

from da3po_jax.models.config import SUPPORTED_MODEL_TYPES, ModelConfig, RopeScaling
from da3po_jax.models.hf_io import load_model, param_table, save_model
from da3po_jax.models.presets import PRESETS, abstract_model, get_preset, init_model
from da3po_jax.models.transformer import KVCache, SlotCache, Transformer, positions_from_mask

__all__ = [
    "KVCache",
    "SlotCache",
    "ModelConfig",
    "PRESETS",
    "RopeScaling",
    "SUPPORTED_MODEL_TYPES",
    "Transformer",
    "abstract_model",
    "get_preset",
    "init_model",
    "load_model",
    "param_table",
    "positions_from_mask",
    "save_model",
]
