"""Model configuration: one frozen dataclass for every supported decoder family.

The Hugging Face `config.json` is the source of truth for real checkpoints; `ModelConfig`
is the subset of it that changes the computation, read by `from_hf_dict` and written back
by `to_hf_dict` so that an exported folder loads in `transformers` unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax.numpy as jnp

from da3po_jax.models.families import family

# Self-attention implementations (models/attention.py; "auto" picks one by backend).
ATTENTION_CHOICES = ("auto", "naive", "blockwise", "cudnn", "splash")
# Decode attention of the continuous engine's slots ("auto": "ragged" on TPU).
DECODE_ATTENTION_CHOICES = ("auto", "blockwise", "paged", "ragged")

REMAT_POLICY_CHOICES = ("nothing", "dots")
# Fields that say how the model runs, not what it is (never read from or written to a HF
# config.json): set from the run's `config.model` section.
RUNTIME_FIELDS = (
    "param_dtype",
    "dtype",
    "logits_chunk",
    "remat",
    "remat_policy",
    "attention",
    "attention_block",
    "decode_attention",
    "scan_layers",
)

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
DTYPE_NAMES = tuple(_DTYPES)  # the values of param_dtype / dtype


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency-dependent RoPE scaling (`rope_type = "llama3"`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shapes and numerics of a Qwen2/2.5, Qwen3 or Llama-3 style decoder.

    Attributes:
      model_type: a family registered in `families.py: FAMILIES`: "qwen2" (q/k/v bias),
        "qwen3" (per-head q/k RMSNorm) or "llama".
      head_dim: explicit per-head width (Qwen3 decouples it from hidden/heads).
      attention_bias: bias on the q/k/v projections (Qwen2 always; others per config).
      o_bias: bias on the output projection (Llama/Qwen3 with `attention_bias`, never Qwen2).
      qk_norm: RMSNorm over head_dim on queries and keys before RoPE (Qwen3).
      param_dtype: storage dtype of the weights ("float32" or "bfloat16").
      dtype: compute dtype of matmuls; norms, softmax and log-probs are always float32.
      logits_chunk: sequence chunk for log-prob computation so that at most a
        [batch, chunk, vocab] float32 logits tensor exists at a time.
      remat: rematerialise each decoder layer in the backward pass (saves activations).
      attention: self-attention implementation of the training forward and the prefill
        ("auto", "naive", "blockwise", "cudnn", "splash"; models/attention.py).
      attention_block: query/key block of the blockwise kernels.
      decode_attention: the continuous engine's decode step over its slots: "paged" (pure
        JAX, only the live (slot, block) pairs), "blockwise" (pure JAX, every slot up to
        the longest), "ragged" (the Pallas TPU kernel) or "auto" ("ragged" on TPU, else
        "paged"); `models/decode_attention.py`.
      scan_layers: store the layers stacked (a leading layer axis) and run them under
        `lax.scan`, so compile time does not grow with depth.
      remat_policy: what a rematerialised layer keeps ("nothing": recompute it all;
        "dots": keep the weight matmuls' outputs).
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    param_dtype: str = "float32"
    dtype: str = "float32"
    logits_chunk: int = 512
    remat: bool = False
    attention: str = "auto"
    decode_attention: str = "auto"
    attention_block: int = 512
    scan_layers: bool = False
    remat_policy: str = "nothing"

    def __post_init__(self):
        family(self.model_type)  # ValueError naming the supported families
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ValueError(f"{name}={getattr(self, name)!r}; expected one of {list(_DTYPES)}")
        if self.o_bias and not self.attention_bias:
            raise ValueError("o_bias requires attention_bias (no supported family has it alone)")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.attention not in ATTENTION_CHOICES:
            raise ValueError(
                f"attention={self.attention!r}; expected one of {list(ATTENTION_CHOICES)}"
            )
        if self.decode_attention not in DECODE_ATTENTION_CHOICES:
            raise ValueError(
                f"decode_attention={self.decode_attention!r}; expected one of "
                f"{list(DECODE_ATTENTION_CHOICES)}"
            )
        if self.remat_policy not in REMAT_POLICY_CHOICES:
            raise ValueError(
                f"remat_policy={self.remat_policy!r}; expected one of {list(REMAT_POLICY_CHOICES)}"
            )
        if self.attention_block < 1:
            raise ValueError(f"attention_block={self.attention_block} must be >= 1")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")

    @property
    def jnp_param_dtype(self):
        return _DTYPES[self.param_dtype]

    @property
    def jnp_dtype(self):
        return _DTYPES[self.dtype]

    def replace(self, **kwargs: Any) -> ModelConfig:
        return dataclasses.replace(self, **kwargs)

    def num_params(self) -> int:
        """Parameter count (embedding counted once when tied)."""
        h, d = self.hidden_size, self.head_dim
        q, kv = self.num_heads * d, self.num_kv_heads * d
        attn = h * q + 2 * h * kv + q * h
        if self.attention_bias:
            attn += q + 2 * kv
        if self.o_bias:
            attn += h
        if self.qk_norm:
            attn += 2 * d
        layer = attn + 3 * h * self.intermediate_size + 2 * h
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + embed + h

    # ----------------------------------------------------------------- HF config I/O
    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], **overrides: Any) -> ModelConfig:
        """Builds a config from a Hugging Face `config.json` dictionary."""
        model_type = hf.get("model_type")
        try:
            fam = family(model_type)
        except ValueError as e:
            raise ValueError(f"{e} (config.json)") from None
        try:
            heads = _positive_int(hf, "num_attention_heads")
            hidden = _positive_int(hf, "hidden_size")
            fields = dict(
                model_type=model_type,
                vocab_size=_positive_int(hf, "vocab_size"),
                hidden_size=hidden,
                intermediate_size=_positive_int(hf, "intermediate_size"),
                num_layers=_positive_int(hf, "num_hidden_layers"),
                num_heads=heads,
                num_kv_heads=_positive_int(hf, "num_key_value_heads", optional=True) or heads,
                head_dim=_positive_int(hf, "head_dim", optional=True) or hidden // heads,
            )
        except KeyError as e:
            raise ValueError(f"config.json is missing the field {e.args[0]!r}") from None
        for key in ("rms_norm_eps", "rope_theta", "max_position_embeddings"):
            value = hf.get(key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
            ):
                raise ValueError(
                    f"config.json field {key!r} must be a positive number, got {value!r}"
                )
        for key in ("bos_token_id", "eos_token_id"):
            value = hf.get(key)
            ids = value if isinstance(value, list) else [value]
            if value is not None and not all(_is_int(i) and i >= 0 for i in ids):
                raise ValueError(
                    f"config.json field {key!r} must be a token id or a list of them, got {value!r}"
                )
        if hf.get("use_sliding_window"):
            raise ValueError("config.json sets use_sliding_window=true, which is not supported")
        theta, scaling = _read_rope(hf)
        fields.update(
            rope_theta=theta,
            rope_scaling=scaling,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            **fam.read(hf),
            max_position_embeddings=hf.get("max_position_embeddings", 32768),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=hf.get("eos_token_id"),
        )
        fields.update(overrides)
        return cls(**fields)

    @classmethod
    def from_hf_folder(cls, path: str, **overrides: Any) -> ModelConfig:
        """Reads `<path>/config.json`.

        Raises:
          FileNotFoundError: no config.json in `path`.
          ValueError: naming the file when it is not valid JSON, not an object, or has a
            missing / mistyped / unsupported field.
        """
        cfg_path = os.path.join(path, "config.json")
        if not os.path.isfile(cfg_path):
            raise FileNotFoundError(f"no config.json in model folder {path!r}")
        try:
            with open(cfg_path, encoding="utf-8") as f:
                hf = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"model config {cfg_path} is not valid JSON "
                f"(line {e.lineno} column {e.colno}: {e.msg})"
            ) from e
        except UnicodeDecodeError as e:
            raise ValueError(f"model config {cfg_path} is not UTF-8 text ({e})") from e
        if not isinstance(hf, dict):
            raise ValueError(
                f"model config {cfg_path} holds a JSON {type(hf).__name__}, expected an object"
            )
        try:
            return cls.from_hf_dict(hf, **overrides)
        except ValueError as e:
            raise ValueError(f"model config {cfg_path}: {e}") from e

    def to_hf_dict(self) -> dict[str, Any]:
        """The `config.json` dictionary that `transformers` (v4 and v5) reads back."""
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            rope.update(rope_type="llama3", **dataclasses.asdict(self.rope_scaling))
        hf: dict[str, Any] = {
            "architectures": [family(self.model_type).architecture],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": rope,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "torch_dtype": self.param_dtype,
            "dtype": self.param_dtype,
            "use_cache": True,
        }
        if self.rope_scaling is not None:
            hf["rope_scaling"] = dict(rope)
        hf.update(family(self.model_type).write(self))
        for key in ("bos_token_id", "eos_token_id"):
            if getattr(self, key) is not None:
                hf[key] = getattr(self, key)
        return hf


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _positive_int(hf: dict[str, Any], key: str, optional: bool = False) -> int | None:
    """`hf[key]` checked to be a positive integer (KeyError when absent and required; None
    when absent or null and `optional`). Integral floats (`64.0`) are accepted."""
    value = hf.get(key) if optional else hf[key]
    if value is None and optional:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not _is_int(value) or value < 1:
        raise ValueError(f"config.json field {key!r} must be a positive integer, got {value!r}")
    return value


def _read_rope(hf: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    """Reads theta and scaling from a top-level `rope_theta`/`rope_scaling` (transformers 4)
    or from `rope_parameters` (transformers 5); the latter wins when both are present."""
    params: dict[str, Any] = {}
    for key in ("rope_scaling", "rope_parameters"):
        value = hf.get(key) or {}
        if not isinstance(value, dict):
            raise ValueError(f"config.json field {key!r} must be an object, got {value!r}")
        params.update(value)
    try:
        theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    except (TypeError, ValueError):
        raise ValueError(
            f"config.json rope_theta must be a number, got "
            f"{params.get('rope_theta', hf.get('rope_theta'))!r}"
        ) from None
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type in (None, "default"):
        return theta, None
    if rope_type != "llama3":
        raise ValueError(f"unsupported rope_type {rope_type!r}; supported: 'default', 'llama3'")
    try:
        scaling = RopeScaling(
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]),
        )
    except KeyError as e:
        raise ValueError(f"llama3 rope scaling is missing {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise ValueError(f"llama3 rope scaling has a non-numeric parameter ({e})") from None
    return theta, scaling
