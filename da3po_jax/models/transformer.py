"""One Flax NNX decoder for the Qwen2/2.5, Qwen3 and Llama-3 families.

The three families differ only in small switches (q/k/v bias, per-head q/k RMSNorm, RoPE
frequency scaling, tied embeddings), so one module covers them, chosen by `ModelConfig`.

Sequences are left-padded: `mask[b, t] = 1` marks real tokens and `positions[b, t]` holds
each token's RoPE position (`cumsum(mask) - 1` for a left-padded prompt). Attention runs
over *slots* (indices in the padded sequence or in the KV cache): a query in slot i sees
keys in slots j <= i whose mask is 1. The cached path writes the new keys/values at slots
`[cache.index, cache.index + T)`, so prefill (T = prompt length) and single-step decode
(T = 1) are the same code as the cache-less forward.

Weights are stored as `[in, out]` kernels with the head axis split out for attention
(`q: [hidden, heads, head_dim]`) so the sharding rules can split heads on the tensor axis.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx, struct

from da3po_jax.models.attention import attention, target_platform
from da3po_jax.models.config import ModelConfig
from da3po_jax.models.decode_attention import (  # noqa: F401  (decode_attention re-exported)
    DECODE,
    decode_attention,
    resolve_decode,
)
from da3po_jax.models.sharding import constrain

_NEG_INF = float(jnp.finfo(jnp.float32).min)


@struct.dataclass
class KVCache:
    """Preallocated keys/values of every layer for a fixed batch and length.

    One array per layer (not one stacked array) so that a donated cache is updated in
    place by `dynamic_update_slice` without copying the other layers. Heads before slots:
    the decode attention's layout on TPU (else XLA copies the whole cache into it).

    Attributes:
      k: per-layer keys, a tuple of [batch, kv_heads, max_len, head_dim] (compute dtype).
      v: per-layer values, same shapes as `k`.
      mask: [batch, max_len] bool, True where a slot holds a real (non-pad) token.
      index: [] int32, the next slot to write.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    mask: jax.Array
    index: jax.Array

    @classmethod
    def init(cls, model_config: ModelConfig, batch: int, max_len: int) -> KVCache:
        shape = (batch, model_config.num_kv_heads, max_len, model_config.head_dim)
        return cls(
            k=tuple(
                jnp.zeros(shape, model_config.jnp_dtype) for _ in range(model_config.num_layers)
            ),
            v=tuple(
                jnp.zeros(shape, model_config.jnp_dtype) for _ in range(model_config.num_layers)
            ),
            mask=jnp.zeros((batch, max_len), jnp.bool_),
            index=jnp.zeros((), jnp.int32),
        )

    @property
    def max_len(self) -> int:
        return self.mask.shape[1]


@struct.dataclass
class SlotCache:
    """Keys/values of S independent sequences (decode slots), each at its own length.

    Slot s's keys occupy columns [0, length_s) of row s; the lengths live with the caller
    (the continuous engine), which also says where each step writes. Row s is a run of
    L / block pages of `block` tokens (see `decode_attention`).

    Attributes:
      k, v: per-layer [slots, L, kv_heads, head_dim] (compute dtype), L a multiple of block.
      block: keys per attention block (static).
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    block: int = struct.field(pytree_node=False, default=128)

    @classmethod
    def init(cls, model_config: ModelConfig, slots: int, max_len: int, block: int) -> SlotCache:
        """Zeros for `slots` sequences of up to `max_len` tokens (rounded up to blocks)."""
        cap = -(-max_len // block) * block
        shape = (slots, cap, model_config.num_kv_heads, model_config.head_dim)
        zeros = lambda: tuple(
            jnp.zeros(shape, model_config.jnp_dtype) for _ in range(model_config.num_layers)
        )  # noqa: E731
        return cls(k=zeros(), v=zeros(), block=block)

    @property
    def max_len(self) -> int:
        return self.k[0].shape[1]


def positions_from_mask(mask: jax.Array) -> jax.Array:
    """RoPE positions of a left-padded batch: 0, 1, ... over real tokens, 0 on padding."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def rope_inv_freq(model_config: ModelConfig) -> jax.Array:
    """Inverse RoPE frequencies, [head_dim // 2], with optional Llama-3 scaling."""
    exponents = jnp.arange(0, model_config.head_dim, 2, dtype=jnp.float32) / model_config.head_dim
    inv_freq = 1.0 / (model_config.rope_theta**exponents)
    s = model_config.rope_scaling
    if s is None:
        return inv_freq
    # Llama 3.1: keep high frequencies, divide low ones by `factor`, interpolate between.
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return jnp.where(is_medium, smoothed, scaled)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotates `x` [B, T, heads, D] by `positions` [B, T] (half-split layout, as HF)."""
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, D/2]
    cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def _param(rngs: nnx.Rngs, shape: tuple[int, ...], model_config: ModelConfig, init: str = "normal"):
    if init == "ones":
        value = jnp.ones(shape, model_config.jnp_param_dtype)
    elif init == "zeros":
        value = jnp.zeros(shape, model_config.jnp_param_dtype)
    else:  # HF's `initializer_range` default
        value = 0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)
        value = value.astype(model_config.jnp_param_dtype)
    return nnx.Param(value)


class RMSNorm(nnx.Module):
    """y = w * x / sqrt(mean(x^2) + eps), normalised in float32 as the HF reference."""

    def __init__(self, dim: int, model_config: ModelConfig, rngs: nnx.Rngs):
        self.weight = _param(rngs, (dim,), model_config, "ones")
        self.eps = model_config.rms_norm_eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (self.weight[...].astype(jnp.float32) * x32).astype(x.dtype)


class Attention(nnx.Module):
    """Grouped-query attention with RoPE, optional q/k/v bias and q/k RMSNorm."""

    def __init__(self, model_config: ModelConfig, rngs: nnx.Rngs):
        self.config = model_config
        h, nq, nkv, d = (
            model_config.hidden_size,
            model_config.num_heads,
            model_config.num_kv_heads,
            model_config.head_dim,
        )
        self.q = _param(rngs, (h, nq, d), model_config)
        self.k = _param(rngs, (h, nkv, d), model_config)
        self.v = _param(rngs, (h, nkv, d), model_config)
        self.o = _param(rngs, (nq, d, h), model_config)
        if model_config.attention_bias:
            self.q_bias = _param(rngs, (nq, d), model_config, "zeros")
            self.k_bias = _param(rngs, (nkv, d), model_config, "zeros")
            self.v_bias = _param(rngs, (nkv, d), model_config, "zeros")
        if model_config.o_bias:
            self.o_bias = _param(rngs, (h,), model_config, "zeros")
        if model_config.qk_norm:
            self.q_norm = RMSNorm(d, model_config, rngs)
            self.k_norm = RMSNorm(d, model_config, rngs)

    def _project(self, x: jax.Array, name: str) -> jax.Array:
        dt = self.config.jnp_dtype
        y = jnp.einsum("bth,hnd->btnd", x, getattr(self, name)[...].astype(dt))
        if self.config.attention_bias:
            y = y + getattr(self, f"{name}_bias")[...].astype(dt)
        return constrain(y)

    def _qkv(self, x, positions, inv_freq):
        """Projected, normed and rotated q [B, T, heads, D] and k, v [B, T, kv_heads, D]."""
        q, k, v = (self._project(x, n) for n in ("q", "k", "v"))
        if self.config.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq), v

    def _output(self, out: jax.Array) -> jax.Array:
        """[B, T, heads, D] attention output -> [B, T, hidden]."""
        model_config = self.config
        out = jnp.einsum("btnd,ndh->bth", out, self.o[...].astype(model_config.jnp_dtype))
        if model_config.o_bias:
            out = out + self.o_bias[...].astype(model_config.jnp_dtype)
        return constrain(out)

    def __call__(self, x, positions, inv_freq, segment_ids, cached):
        """Attention for one layer.

        Args:
          x: [B, T, hidden] inputs.
          positions: [B, T] RoPE positions.
          inv_freq: [head_dim // 2].
          segment_ids: [B, T] int32 sequence id of each slot, 0 on padding: a query sees
            the keys at or before its slot with its own (non-zero) id. One left-padded
            sequence per row has ids = mask; a packed row has 1, 2, ... (see
            models/attention.py).
          cached: None (no cache), or `(k, v, q_slots, k_slots, key_mask)` of a KV cache:
            this step's keys are written into k, v [B, kv_heads, S, D] at `q_slots[0]`
            and the queries attend over the cache's `key_mask` [B, S] keys in slots
            `k_slots` [S] at or before theirs. A cache exactly T long (a prefill) is
            filled from slot 0 and attends like the cache-less call.

        Returns:
          ([B, T, hidden] output, updated (k, v) or None).
        """
        model_config = self.config
        q, k, v = self._qkv(x, positions, inv_freq)
        b, t = x.shape[:2]
        groups = model_config.num_heads // model_config.num_kv_heads
        q = q.reshape(b, t, model_config.num_kv_heads, groups, model_config.head_dim)
        if cached is not None and cached[0].shape[2] > t:  # decode into a longer cache
            out, layer_cache = _cached_attention(q, k, v, *cached)
        else:
            block = model_config.attention_block
            out = attention(
                q, k, v, segment_ids, impl=model_config.attention, block_q=block, block_k=block
            )
            layer_cache = None
            if cached is not None:  # a prefill fills the whole cache
                layer_cache = (_heads_first(k, cached[0]), _heads_first(v, cached[1]))
        return self._output(out.reshape(b, t, model_config.num_heads, -1)), layer_cache

    def decode(self, x, positions, inv_freq, layer_cache, write, lengths, block):
        """One decode step of S independent slots (the continuous engine's layout).

        Args:
          x: [S, 1, hidden], one token per slot; positions: [S, 1] their RoPE positions.
          inv_freq: [head_dim // 2].
          layer_cache: (k, v) [S, L, kv_heads, D]; slot s's keys occupy columns
            [0, lengths[s]).
          write: [S] int32 column where each slot's new key/value goes (>= L: no write).
          lengths: [S] int32 keys each slot attends to after the write (0: none).
          block: keys per attention block (L is a multiple of it).

        Returns:
          ([S, 1, hidden] output, updated (k, v)).
        """
        model_config = self.config
        q, k, v = self._qkv(x, positions, inv_freq)
        rows = jnp.arange(x.shape[0])
        kc, vc = layer_cache
        kc = kc.at[rows, write].set(k[:, 0].astype(kc.dtype), mode="drop")
        vc = vc.at[rows, write].set(v[:, 0].astype(vc.dtype), mode="drop")
        groups = model_config.num_heads // model_config.num_kv_heads
        q = q.reshape(x.shape[0], model_config.num_kv_heads, groups, model_config.head_dim)
        attend = DECODE[resolve_decode(model_config.decode_attention, target_platform())]
        out = attend(q, kc, vc, lengths, block)  # [S, kv_heads, groups, D]
        out = out.reshape(x.shape[0], 1, model_config.num_heads, model_config.head_dim).astype(
            x.dtype
        )
        return self._output(out), (kc, vc)


def _heads_first(x: jax.Array, like: jax.Array) -> jax.Array:  # [B, T, Hk, D] -> [B, Hk, T, D]
    return jnp.swapaxes(x, 1, 2).astype(like.dtype)


def _cached_attention(q, k, v, k_cache, v_cache, q_slots, k_slots, key_mask):
    """Queries q [B, T, kv_heads, groups, D] over a KV cache [B, kv_heads, S, D] after
    writing this step's k, v [B, T, kv_heads, D] at slot `q_slots[0]`; a query sees the
    `key_mask` keys at or before its slot. Returns (out [B, T, kv_heads, groups, D],
    (k_cache, v_cache))."""
    start = (0, 0, q_slots[0], 0)
    k_cache = jax.lax.dynamic_update_slice(k_cache, _heads_first(k, k_cache), start)
    v_cache = jax.lax.dynamic_update_slice(v_cache, _heads_first(v, v_cache), start)
    scores = jnp.einsum("btkgd,bksd->bkgts", q, k_cache, preferred_element_type=jnp.float32)
    scores = scores / math.sqrt(q.shape[-1])
    allowed = (k_slots[None, :] <= q_slots[:, None])[None] & key_mask[:, None, :]  # [B,T,S]
    scores = jnp.where(allowed[:, None, None], scores, _NEG_INF)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_cache.dtype)
    return jnp.einsum("bkgts,bksd->btkgd", probs, v_cache), (k_cache, v_cache)


class MLP(nnx.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, model_config: ModelConfig, rngs: nnx.Rngs):
        self.dtype = model_config.jnp_dtype
        self.gate = _param(
            rngs, (model_config.hidden_size, model_config.intermediate_size), model_config
        )
        self.up = _param(
            rngs, (model_config.hidden_size, model_config.intermediate_size), model_config
        )
        self.down = _param(
            rngs, (model_config.intermediate_size, model_config.hidden_size), model_config
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        dt = self.dtype
        hidden = jax.nn.silu(x @ self.gate[...].astype(dt)) * (x @ self.up[...].astype(dt))
        return constrain(constrain(hidden) @ self.down[...].astype(dt))


class DecoderLayer(nnx.Module):
    def __init__(self, model_config: ModelConfig, rngs: nnx.Rngs):
        self.input_norm = RMSNorm(model_config.hidden_size, model_config, rngs)
        self.attn = Attention(model_config, rngs)
        self.post_attn_norm = RMSNorm(model_config.hidden_size, model_config, rngs)
        self.mlp = MLP(model_config, rngs)

    def __call__(self, x, positions, inv_freq, segment_ids, cached):
        out, layer_cache = self.attn(self.input_norm(x), positions, inv_freq, segment_ids, cached)
        return self._rest(x, out), layer_cache

    def decode(self, x, positions, inv_freq, layer_cache, *slots):
        """`Attention.decode` in the layer (slots, one token each)."""
        out, kv = self.attn.decode(self.input_norm(x), positions, inv_freq, layer_cache, *slots)
        return self._rest(x, out), kv

    def _rest(self, x, attn_out):
        x = x + attn_out
        return x + self.mlp(self.post_attn_norm(x))


# `model.remat_policy` -> what a rematerialised layer keeps from its forward pass.
REMAT_POLICIES = {
    "nothing": jax.checkpoint_policies.nothing_saveable,  # recompute the whole layer
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # keep weight matmuls
}


def _remat(model_config: ModelConfig):
    """`DecoderLayer.__call__` rematerialised in the backward pass under
    `cfg.remat_policy`, as a pure function of the layer's state (`jax.checkpoint`, not
    `nnx.remat`, which writes the state back and fails when the model was merged inside
    `lax.scan` / `lax.cond`, as in the packed update)."""
    policy = REMAT_POLICIES[model_config.remat_policy]

    def call(layer, x, *args):
        graphdef, state = nnx.split(layer)
        run = lambda st, x: nnx.merge(graphdef, st)(x, *args)  # noqa: E731
        return jax.checkpoint(run, policy=policy)(state, x)

    return call


def _stacked(layers: list[DecoderLayer]) -> DecoderLayer:
    """One layer module whose parameters carry a leading layer axis: `layers`' weights
    stacked, so a scanned model starts from the same values as the unscanned one."""
    graphdef, _ = nnx.split(layers[0])
    states = [nnx.state(layer) for layer in layers]
    return nnx.merge(graphdef, jax.tree.map(lambda *xs: jnp.stack(xs), *states))


class Transformer(nnx.Module):
    """Decoder-only causal LM.

    Calls:
      `hidden(tokens, positions, mask, cache=None, segment_ids=None) -> (h, cache)`
      `__call__(...)`: float32 logits [B, T, vocab] (materialises them all; for sampling
        and tests).
      `token_logprobs(tokens, positions, mask, targets)`: float32 log p(targets) [B, T]
        (and per-token entropy) computed chunk by chunk over the sequence, so at most one
        [B, logits_chunk, vocab] float32 logits block exists, also in the backward pass.

    With `cfg.scan_layers` the layers are one `DecoderLayer` whose parameters have a
    leading [num_layers] axis (paths `layers/attn/q` instead of `layers/3/attn/q`), run
    under `lax.scan` without a cache.
    """

    def __init__(self, model_config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = model_config
        self.embed = _param(rngs, (model_config.vocab_size, model_config.hidden_size), model_config)
        layers = [DecoderLayer(model_config, rngs) for _ in range(model_config.num_layers)]
        self.layers = _stacked(layers) if model_config.scan_layers else nnx.List(layers)
        self.final_norm = RMSNorm(model_config.hidden_size, model_config, rngs)
        if not model_config.tie_word_embeddings:
            self.lm_head = _param(
                rngs, (model_config.hidden_size, model_config.vocab_size), model_config
            )

    def hidden(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        cache: KVCache | None = None,
        segment_ids: jax.Array | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """Final-norm hidden states [B, T, hidden]; writes keys/values into `cache` if given.

        `segment_ids` [B, T] (int, 0 on padding) packs several sequences into one row:
        attention never crosses ids and `positions` restart per sequence. Default: one
        sequence per row, ids = `mask`.
        """
        model_config = self.config
        t = tokens.shape[1]
        mask = mask.astype(jnp.bool_)
        if segment_ids is None:
            segment_ids = mask.astype(jnp.int32)
        x = constrain(jnp.take(self.embed[...], tokens, axis=0).astype(model_config.jnp_dtype))
        inv_freq = rope_inv_freq(model_config)
        if cache is not None:
            q_slots = cache.index + jnp.arange(t, dtype=jnp.int32)
            k_slots = jnp.arange(cache.max_len, dtype=jnp.int32)
            key_mask = jax.lax.dynamic_update_slice(cache.mask, mask, (0, cache.index))
        if cache is None and model_config.scan_layers:
            return self.final_norm(self._scan(x, positions, inv_freq, segment_ids)), None
        # Remat only matters under a backward pass, so never with a KV cache (the sampler's
        # prefill and decode).
        call = (
            _remat(model_config) if model_config.remat and cache is None else DecoderLayer.__call__
        )
        new_k, new_v = [], []
        for i, layer in enumerate(self.layer_list()):
            cached = None
            if cache is not None:
                cached = (cache.k[i], cache.v[i], q_slots, k_slots, key_mask)
            x, layer_cache = call(layer, x, positions, inv_freq, segment_ids, cached)
            if layer_cache is not None:
                new_k.append(layer_cache[0])
                new_v.append(layer_cache[1])
        if cache is not None:
            cache = KVCache(k=tuple(new_k), v=tuple(new_v), mask=key_mask, index=cache.index + t)
        return self.final_norm(x), cache

    def layer_list(self) -> list[DecoderLayer]:
        """The decoder layers in order; with `scan_layers`, views of the stacked parameters'
        slices (the cached prefill and decode paths run layer by layer)."""
        if not self.config.scan_layers:
            return list(self.layers)
        graphdef, state = nnx.split(self.layers)
        return [
            nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], state))
            for i in range(self.config.num_layers)
        ]

    def _scan(self, x, positions, inv_freq, segment_ids) -> jax.Array:
        """The stacked layers under one `lax.scan` (compiled once whatever the depth), each
        step rematerialised in the backward pass when `cfg.remat` (`cfg.remat_policy`)."""
        graphdef, state = nnx.split(self.layers)

        def step(x, layer_state):
            layer = nnx.merge(graphdef, layer_state)
            return layer(x, positions, inv_freq, segment_ids, None)[0], None

        if self.config.remat:
            step = jax.checkpoint(step, policy=REMAT_POLICIES[self.config.remat_policy])
        return jax.lax.scan(step, x, state)[0]

    def decode_slots(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        cache: SlotCache,
        write: jax.Array,
        lengths: jax.Array,
    ) -> tuple[jax.Array, SlotCache]:
        """One decode step of S slots: float32 logits [S, vocab] of tokens [S] fed at
        `positions` [S], their keys/values written at column `write` [S] of each slot
        (>= L: not written), each slot attending to its first `lengths` [S] keys."""
        model_config = self.config
        x = constrain(jnp.take(self.embed[...], tokens, axis=0).astype(model_config.jnp_dtype))[
            :, None
        ]
        inv_freq = rope_inv_freq(model_config)
        new_k, new_v = [], []
        for i, layer in enumerate(self.layer_list()):
            x, (k, v) = layer.decode(
                x,
                positions[:, None],
                inv_freq,
                (cache.k[i], cache.v[i]),
                write,
                lengths,
                cache.block,
            )
            new_k.append(k)
            new_v.append(v)
        h = self.final_norm(x)[:, 0]
        return self.logits(h), cache.replace(k=tuple(new_k), v=tuple(new_v))

    def _unembed(self) -> jax.Array:
        """Output projection as [hidden, vocab] in the compute dtype."""
        w = self.embed[...].T if self.config.tie_word_embeddings else self.lm_head[...]
        return w.astype(self.config.jnp_dtype)

    def logits(self, h: jax.Array) -> jax.Array:
        """float32 logits of hidden states h [..., hidden]."""
        return constrain(jnp.dot(h, self._unembed(), preferred_element_type=jnp.float32))

    def __call__(self, tokens, positions, mask, cache=None):
        """(float32 logits [B, T, vocab], cache)."""
        h, cache = self.hidden(tokens, positions, mask, cache)
        return self.logits(h), cache

    def token_logprobs(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        targets: jax.Array,
        temperature: float = 1.0,
        segment_ids: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        """log softmax(logits / temperature)[targets] and entropy, both float32 [B, T].

        `targets[b, t]` is the token whose probability is read off position t (usually
        `tokens[b, t + 1]`). Positions are processed in chunks of `cfg.logits_chunk`; each
        chunk is rematerialised in the backward pass, so peak logits memory is one chunk.
        `segment_ids`: packed rows, as in `hidden`.
        """
        h, _ = self.hidden(tokens, positions, mask, segment_ids=segment_ids)
        return chunked_logprobs(h, self._unembed(), targets, self.config.logits_chunk, temperature)


def chunked_logprobs(
    h: jax.Array, w: jax.Array, targets: jax.Array, chunk: int, temperature: float = 1.0
) -> tuple[jax.Array, jax.Array]:
    """Per-token log-probs and entropies of `h @ w` without the full [B, T, V] logits.

    Args:
      h: [B, T, hidden]; w: [hidden, vocab]; targets: [B, T] int.
      chunk: positions per block; T is padded up to a multiple of it.

    Returns:
      (log p(targets) [B, T], entropy [B, T]), float32.
    """
    b, t, _ = h.shape
    chunk = max(1, min(chunk, t))
    n = -(-t // chunk)
    pad = n * chunk - t
    h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    hs = h.reshape(b, n, chunk, -1).swapaxes(0, 1)
    ts = targets.reshape(b, n, chunk).swapaxes(0, 1)

    @jax.checkpoint
    def block(hc, tc):
        logits = constrain(jnp.dot(hc, w, preferred_element_type=jnp.float32)) / temperature
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0]
        probs = jnp.exp(logits - lse[..., None])
        entropy = lse - jnp.sum(probs * logits, axis=-1)
        return picked - lse, entropy

    logp, ent = jax.lax.map(lambda xs: block(*xs), (hs, ts))
    logp = logp.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]
    ent = ent.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]
    return logp, ent
