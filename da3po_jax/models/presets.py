"""Model shapes users care about, as code, for random-init benchmarks without downloads.

The numbers are those of the published `config.json` files. Loading a real checkpoint
always reads its own `config.json`; presets never stand in for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from da3po_jax.models.config import ModelConfig, RopeScaling
from da3po_jax.models.transformer import Transformer

_LLAMA32_ROPE = RopeScaling(
    factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)


def _qwen2(hidden, inter, layers, heads, kv, vocab=151936, tied=True, theta=1e6, max_pos=32768):
    return ModelConfig(
        model_type="qwen2",
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=hidden // heads,
        rope_theta=theta,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tied,
        attention_bias=True,
        max_position_embeddings=max_pos,
    )


def _qwen3(hidden, inter, layers, heads, kv, tied=True, max_pos=32768):
    return ModelConfig(
        model_type="qwen3",
        vocab_size=151936,
        hidden_size=hidden,
        intermediate_size=inter,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=128,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tied,
        qk_norm=True,
        max_position_embeddings=max_pos,
    )


def _llama32(hidden, layers, heads, head_dim):
    return ModelConfig(
        model_type="llama",
        vocab_size=128256,
        hidden_size=hidden,
        intermediate_size=8192,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=8,
        head_dim=head_dim,
        rope_theta=500000.0,
        rope_scaling=_LLAMA32_ROPE,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
    )


PRESETS: dict[str, ModelConfig] = {
    "qwen2.5-0.5b": _qwen2(896, 4864, 24, 14, 2),
    "qwen2.5-1.5b": _qwen2(1536, 8960, 28, 12, 2),
    "qwen2.5-7b": _qwen2(3584, 18944, 28, 28, 4, vocab=152064, tied=False),
    "qwen2.5-math-1.5b": _qwen2(1536, 8960, 28, 12, 2, theta=10000.0, max_pos=4096),
    "qwen2.5-math-7b": _qwen2(
        3584, 18944, 28, 28, 4, vocab=152064, tied=False, theta=10000.0, max_pos=4096
    ),
    # the post-trained models' config.json say 40960 positions
    "qwen3-0.6b": _qwen3(1024, 3072, 28, 16, 8, max_pos=40960),
    "qwen3-1.7b": _qwen3(2048, 6144, 28, 16, 8, max_pos=40960),
    # the -Base models' (the DA3PO paper's policies, configs/da3po_qwen3_*.py): 32768
    "qwen3-4b": _qwen3(2560, 9728, 36, 32, 8),
    "qwen3-8b": _qwen3(4096, 12288, 36, 32, 8, tied=False),
    "llama-3.2-1b": _llama32(2048, 16, 32, 64),
    "llama-3.2-3b": _llama32(3072, 28, 24, 128),
    # Tiny shapes for tests and the embedded CPU demo.
    "tiny-qwen2": ModelConfig(
        model_type="qwen2",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        attention_bias=True,
        max_position_embeddings=1024,
    ),
    # The embedded demo's policy (~0.9M parameters with a 512-token vocabulary).
    "tiny-math": ModelConfig(
        model_type="qwen2",
        vocab_size=512,
        hidden_size=128,
        intermediate_size=384,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        attention_bias=True,
        max_position_embeddings=1024,
    ),
}


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    """The preset `name` (case-insensitive), with `ModelConfig` fields overridden."""
    key = name.lower()
    if key not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; available: {sorted(PRESETS)}")
    return PRESETS[key].replace(**overrides)


def init_model(
    model_config: ModelConfig,
    seed: int = 0,
    sharding: jax.sharding.Sharding | Callable[[tuple, tuple], jax.sharding.Sharding] | None = None,
) -> Transformer:
    """A randomly initialised model; with `sharding`, parameters are born sharded.

    `sharding` is one `Sharding` for all parameters or a function of (NNX path, shape). The
    sharded path evaluates shapes first (`nnx.eval_shape`) and runs the initialiser under
    `jax.jit` with those output shardings, so no full parameter lands on one device.
    """
    if sharding is None:
        return Transformer(model_config, rngs=nnx.Rngs(seed))
    graphdef, abstract = abstract_model(model_config, seed)

    def leaf_sharding(path, var):
        value = var.get_value()
        return sharding(path, value.shape) if callable(sharding) else sharding

    out_shardings = nnx.map_state(leaf_sharding, abstract)

    @jax.jit
    def make():
        state = nnx.state(Transformer(model_config, rngs=nnx.Rngs(seed)))
        return jax.lax.with_sharding_constraint(state, out_shardings)

    return nnx.merge(graphdef, make())


def abstract_model(model_config: ModelConfig, seed: int = 0) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, parameters as `jax.ShapeDtypeStruct`s) of a model of `cfg`: its shapes
    from the real constructor (`nnx.eval_shape`), nothing allocated."""
    return nnx.split(nnx.eval_shape(lambda: Transformer(model_config, rngs=nnx.Rngs(seed))))
