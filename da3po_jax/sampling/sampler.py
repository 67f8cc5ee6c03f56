"""Jitted KV-cached generation: one prefill per prompt, G samples per prompt, early exit.

`generate_with_cache` is one jitted function over fixed shapes:

1. Prefill: the P left-padded prompts [P, Tp] run once through the model, writing their
   keys/values into a small [P, Tp] cache; only the last position's logits are computed.
2. Share: each prompt's keys/values are copied into rows p*G .. p*G+G-1 of the big
   [P*G, Tp + N - 1] cache (rounded up: `cache_length`), which the caller donates, so its
   buffer is reused across calls and updated in place (no copy per step).
3. Decode: a `lax.while_loop` feeds the last sampled token of every row (one T=1 forward),
   samples the next one, and stops as soon as every row has emitted a stop id or after
   max_new_tokens tokens.

Randomness is keyed by (prompt, sample index, token position), never by batch row or call:
prompt p has its own key (`prompt_keys`), sample g of it the key fold_in(key_p, g)
(`sample_keys`) and the draw of its token t the key fold_in(that, t). A prompt's samples
are therefore the same whichever batch, row or engine generates them (the continuous
engine, `sampling/continuous.py`, uses the same keys).

The batch axis leads everywhere (prompts, cache, outputs) and no device is named, so the
same function runs with the batch sharded over a mesh's data axes and the weights laid
out by the sharding rules; `new_cache` places the cache like the prompts.

Which log-prob the trainer uses as logp_old: `SampleOutput.logp`, the log-prob under the
trained policy softmax(logits / T') with no truncation, T' = `GenerateConfig.
policy_temperature` (`loss.train_temperature` resolved: by default the sampling
temperature, as verl and TRL; 1 = the untempered policy). The training forward computes
log pi_theta at the same T', and the PPO ratio pi_theta / pi_old must compare the same
distribution on both sides; when the sampling temperature is T' and there is no
top-k/top-p, `logp == sample_logp` and rollouts are exactly on-policy. Otherwise (top-k,
top-p, or T' = 1 with a sampling temperature != 1) the tokens come from the behaviour
distribution mu (`sample_logp`) instead of pi_old, so the update is off-policy
by the ratio pi_old / mu. The update corrects for it with truncated importance sampling,
weights min(exp(logp - sample_logp), `rollout.tis_cap`) (`rl/loss.py: tis_weights`);
tokens outside mu's support never appear at all, so nothing corrects for those.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx, struct
from jax.sharding import NamedSharding, PartitionSpec

from da3po_jax.models.config import ModelConfig
from da3po_jax.models.transformer import KVCache, Transformer, positions_from_mask
from da3po_jax.parallel.mesh import BATCH_AXES
from da3po_jax.parallel.rules import spec_for
from da3po_jax.sampling.distribution import Draw, SamplingParams, draw

_TRACES = [0]  # incremented each time `generate_with_cache` is traced (= compiled)


def trace_count() -> int:
    """How many times the generate function has been traced (one per compile)."""
    return _TRACES[0]


@dataclasses.dataclass(frozen=True)
class GenerateConfig:
    """Static settings of one generate call (hashable; a new value compiles anew).

    Attributes:
      num_samples: G, samples per prompt.
      max_new_tokens: N, the cap on response length (tokens, stop id included).
      temperature: 0 = greedy.
      top_k: 0 = off.
      top_p: 1.0 = off.
      policy_temperature: the temperature of the trained policy whose log-probs `logp`
        records (`loss.train_temperature` resolved; 1 for generation that trains nothing).
      stop_ids: token ids that end a response (the stop token is part of the response).
      pad_id: written after a response ends.
      gather_weights: under a mesh, the call reads its own copy of the weights, gathered
        over the batch axes (`decode_weights`); False: the FSDP-sharded weights, gathered
        by XLA as each layer needs them (for a model whose gathered weights do not fit).
    """

    num_samples: int = 1
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    policy_temperature: float = 1.0
    stop_ids: tuple[int, ...] = ()
    pad_id: int = 0
    gather_weights: bool = True

    def __post_init__(self):
        if self.num_samples < 1 or self.max_new_tokens < 1:
            raise ValueError(
                f"num_samples={self.num_samples} and max_new_tokens={self.max_new_tokens} "
                "must be >= 1"
            )
        object.__setattr__(self, "stop_ids", tuple(int(i) for i in self.stop_ids))
        _ = self.sampling  # validates them

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.policy_temperature)

    def replace(self, **kwargs: Any) -> GenerateConfig:
        return dataclasses.replace(self, **kwargs)


@struct.dataclass
class SampleOutput:
    """Responses of P prompts x G samples, N = max_new_tokens.

    Attributes:
      tokens: [P, G, N] int32 response tokens; pad_id after the response ends.
      logp: [P, G, N] float32 log pi(token) under the policy at `policy_temperature` (the
        trainer's logp_old, see the module docstring); 0 where `mask` is False.
      sample_logp: [P, G, N] float32 log mu(token) under the sampling distribution used
        (temperature, top-k, top-p); 0 for greedy and where `mask` is False.
      mask: [P, G, N] bool, True on response tokens (the stop token included).
      lengths: [P, G] int32 response lengths (= mask.sum(-1)).
      truncated: [P, G] bool, True where no stop id was emitted within N tokens.
      num_steps: [] int32 decode forward passes run after the prefill (N - 1 at most;
        fewer when every row stopped early).
    """

    tokens: jax.Array
    logp: jax.Array
    sample_logp: jax.Array
    mask: jax.Array
    lengths: jax.Array
    truncated: jax.Array
    num_steps: jax.Array


@struct.dataclass
class _Loop:
    """Decode-loop carry; R = P * G rows, N = max_new_tokens."""

    step: jax.Array  # [] int32, index of the next token to sample
    keys: jax.Array  # [R] sample keys (`sample_keys`)
    cache: KVCache  # [R, Tp + N - 1] slots
    last: jax.Array  # [R] int32, token sampled at step - 1
    done: jax.Array  # [R] bool, a stop id was emitted
    lengths: jax.Array  # [R] int32
    tokens: jax.Array  # [R, N] int32
    logp: jax.Array  # [R, N] float32
    sample_logp: jax.Array  # [R, N] float32


def _typed(rng: jax.Array) -> jax.Array:
    """Typed PRNG keys (raw uint32 keys, [..., 2], are wrapped)."""
    if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        return rng
    return jax.random.wrap_key_data(rng)


def prompt_keys(rng: jax.Array, num_prompts: int, start: int = 0) -> jax.Array:
    """One key per prompt, [P]: `rng` is either one key (prompt p of a stream gets
    fold_in(rng, start + p)) or already one key per prompt."""
    rng = _typed(rng)
    if rng.ndim == 0:
        index = start + jnp.arange(num_prompts)
        return jax.vmap(lambda i: jax.random.fold_in(rng, i))(index)
    if rng.shape != (num_prompts,):
        raise ValueError(f"{rng.shape[0]} prompt keys for {num_prompts} prompts")
    return rng


def sample_keys(keys: jax.Array, num_samples: int) -> jax.Array:
    """[P] prompt keys -> [P * G] sample keys, row p * G + g = fold_in(key_p, g)."""
    per = jax.vmap(lambda k: jax.vmap(lambda g: jax.random.fold_in(k, g))(jnp.arange(num_samples)))
    return per(keys).reshape(-1)


def token_keys(keys: jax.Array, step: jax.Array) -> jax.Array:
    """The draw keys of token position `step` ([] or one per row) of rows with sample keys
    `keys` [R]."""
    step = jnp.broadcast_to(step, keys.shape)
    return jax.vmap(jax.random.fold_in)(keys, step)


CACHE_MULTIPLE = 128


def cache_length(prompt_len: int, max_new_tokens: int) -> int:
    """KV slots a call needs, the prompt plus every response token but the last, rounded up
    to a multiple of `CACHE_MULTIPLE`: TPU's default layout of a cache whose length is not
    a multiple of its tile puts the KV heads minor instead, and the decode step then copies
    the whole donated cache into the layout it reads (the spare slots are never attended)."""
    need = prompt_len + max_new_tokens - 1
    return -(-need // CACHE_MULTIPLE) * CACHE_MULTIPLE


def new_cache(
    model_config: ModelConfig, prompt_tokens: jax.Array, config: GenerateConfig
) -> KVCache:
    """A zeroed cache for `prompt_tokens` [P, Tp], placed like them: under a mesh the batch
    axis is split as the prompts' is, and KV heads over `tensor` where they divide.

    The allocation is one jitted program per (model config, rows, slots, placement)
    (`_cache_allocator`): the static engine makes its cache anew every RL step (`Sampler`
    frees it for the update), and a fresh `jax.jit` of a fresh closure never hits jit's
    cache, so it compiled again every step."""
    rows, slots = _cache_dims(prompt_tokens.shape, config)
    return _cache_allocator(model_config, rows, slots, getattr(prompt_tokens, "sharding", None))()


def cache_initializer(
    model_config: ModelConfig, prompt_shape: tuple[int, int], config: GenerateConfig
):
    """The function that builds the zeroed cache of [P, Tp] prompts (P x G rows)."""
    return functools.partial(KVCache.init, model_config, *_cache_dims(prompt_shape, config))


def _cache_dims(prompt_shape: tuple[int, int], config: GenerateConfig) -> tuple[int, int]:
    """(rows, slots) of the cache of [P, Tp] prompts: P x G rows of `cache_length` slots."""
    p, tp = prompt_shape
    return p * config.num_samples, cache_length(tp, config.max_new_tokens)


@functools.lru_cache(maxsize=16)
def _cache_allocator(model_config: ModelConfig, rows: int, slots: int, sharding: Any):
    """The jitted allocation of a zeroed [rows, slots] cache placed after the prompts'
    `sharding` (cached on its hashable inputs: equal shapes and placement compile once)."""
    init = functools.partial(KVCache.init, model_config, rows, slots)
    return jax.jit(init, out_shardings=_placed_like(model_config, init, sharding))


def cache_shardings(model_config: ModelConfig, init, prompt_tokens) -> Any:
    """The shardings of the cache `init()` builds for `prompt_tokens` (an array or a
    `jax.ShapeDtypeStruct`): rows split as the prompts' batch axis, KV heads over `tensor`
    where they divide; without a `NamedSharding`, the prompts' own sharding (or None)."""
    return _placed_like(model_config, init, getattr(prompt_tokens, "sharding", None))


def _placed_like(model_config: ModelConfig, init, sharding: Any) -> Any:
    """`cache_shardings` of prompts placed by `sharding`."""
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return sharding
    mesh = sharding.mesh
    batch_axes = sharding.spec[0] if len(sharding.spec) else None
    tensor = mesh.shape.get("tensor", 1)
    heads = "tensor" if tensor > 1 and model_config.num_kv_heads % tensor == 0 else None
    P = jax.sharding.PartitionSpec

    def spec(a):
        if a.ndim == 4:  # [rows, kv_heads, slots, head_dim]
            return P(batch_axes, heads)
        return P(batch_axes) if a.ndim else P()

    return jax.tree.map(lambda a: jax.sharding.NamedSharding(mesh, spec(a)), jax.eval_shape(init))


def _axes(entry) -> tuple[str, ...]:
    """The mesh axes of a spec entry (None, an axis, or a tuple of axes)."""
    return tuple(a for a in (entry if isinstance(entry, tuple) else (entry,)) if a is not None)


def _entry(axes: tuple[str, ...]):
    return None if not axes else axes if len(axes) > 1 else axes[0]


def _without_batch(entry):
    """A spec entry less the batch axes."""
    return _entry(tuple(a for a in _axes(entry) if a not in BATCH_AXES))


def gather_steps(spec: PartitionSpec, shape: tuple[int, ...], mesh) -> list[PartitionSpec]:
    """The shardings a weight of `spec` passes through on its way to `spec` less the batch
    axes: directly, or, when the batch axes split its last dimension, first moved to the
    dimension before it (an all-to-all of the shard) so that the all-gather joins a
    major dimension. On TPU an all-gather along the minor-most dimension comes out in
    another layout than the decode loop reads, and XLA keeps both copies."""
    spec = list(spec) + [None] * (len(shape) - len(spec))
    final = PartitionSpec(*[_without_batch(e) for e in spec])
    batch_last = tuple(a for a in _axes(spec[-1]) if a in BATCH_AXES) if spec else ()
    if len(shape) < 2 or not batch_last:
        return [final]
    moved = _axes(spec[-2]) + batch_last
    if shape[-2] % math.prod(mesh.shape[a] for a in moved):
        return [final]
    mid = spec[:-2] + [_entry(moved), _without_batch(spec[-1])]
    return [PartitionSpec(*mid), final]


def decode_weights(state: nnx.State, model_config: ModelConfig) -> nnx.State:
    """The weights a generate call reads: under an ambient mesh of more than one device
    (`parallel.mesh.kernel_mesh`), the matrices in the compute dtype and every weight
    gathered over the batch axes (data x fsdp), still split over `tensor`, for the whole
    call; `state` itself without one.

    Every decode step reads every weight, so FSDP-sharded weights would be all-gathered
    once per step and layer (the whole model over the interconnect per token); gathered
    once, a step reads each device's copy from its own memory (the roofline of
    `da3po_jax.compile.report` assumes so). It costs the compute-dtype model per device
    (split over `tensor`) while the call runs, which `da3po_jax.plan` counts. The values
    are those the model computes with (it casts each matrix to the compute dtype where
    it uses it; vectors, e.g. the norms' weights, keep their dtype)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return state

    def one(path, x):
        if x.ndim >= 2 and jnp.issubdtype(x.dtype, jnp.floating):
            x = x.astype(model_config.jnp_dtype)
        for spec in gather_steps(spec_for(path, x.shape, mesh), x.shape, mesh):
            x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
        return x

    # One value per weight for the whole call: without the barrier, the prefill and the
    # decode loop may each keep the weights in the layout they prefer (1.5B on v5e-8:
    # 1.2 GiB of such twins of `embed`, `attn/o` and `mlp/down`).
    return jax.lax.optimization_barrier(jax.tree_util.tree_map_with_path(one, state))


def decoding_model(graphdef: nnx.GraphDef, state: nnx.State, gen: GenerateConfig) -> Transformer:
    """The model a generate call decodes with: its weights through `decode_weights` when
    `gen.gather_weights`."""
    model = nnx.merge(graphdef, state)
    if not gen.gather_weights:
        return model
    return nnx.merge(graphdef, decode_weights(state, model.config))


def _prefill(model: Transformer, cache: KVCache, tokens, mask, num_samples: int):
    """Runs the prompts once and copies their keys/values to each prompt's G rows.

    Returns (last-position logits [R, V] float32, cache with index = Tp).
    """
    p, tp = tokens.shape
    small = KVCache.init(model.config, p, tp)
    h, small = model.hidden(tokens, positions_from_mask(mask), mask, small)
    logits = model.logits(h[:, -1])  # [P, V]: never the full [P, Tp, V]

    def share(x):  # [P, ...] -> [P * G, ...], row p * G + g holds prompt p
        x = jnp.broadcast_to(x[:, None], (p, num_samples, *x.shape[1:]))
        return x.reshape(p * num_samples, *x.shape[2:])

    def put(big, new):
        """`new` [P, ...] into rows p * G + g of `big` for every g, one sample at a time:
        the broadcast [P * G, ...] copy of a layer's keys or values is never formed (the
        TPU compile of the 7B sampler otherwise holds ~10 of them at once, 11 GB)."""
        grouped = big.reshape(p, num_samples, *big.shape[1:])
        for g in range(num_samples):
            at = (0, g) + (0,) * (big.ndim - 1)
            grouped = jax.lax.dynamic_update_slice(grouped, new[:, None], at)
        return grouped.reshape(big.shape)

    cache = KVCache(
        k=tuple(map(put, cache.k, small.k)),
        v=tuple(map(put, cache.v, small.v)),
        mask=jax.lax.dynamic_update_slice(cache.mask, share(mask), (0, 0)),
        index=jnp.asarray(tp, jnp.int32),
    )
    return share(logits), cache


def _record(loop: _Loop, d: Draw, config: GenerateConfig) -> _Loop:
    """Writes the draw of step `loop.step` for rows still running; advances the step."""
    active = ~loop.done
    token = jnp.where(active, d.token, config.pad_id)
    stop = jnp.zeros_like(active)
    for i in config.stop_ids:
        stop = stop | (token == i)

    def put(buf, x):
        return jax.lax.dynamic_update_slice(buf, x[:, None].astype(buf.dtype), (0, loop.step))

    return loop.replace(
        step=loop.step + 1,
        last=token,
        done=loop.done | (active & stop),
        lengths=loop.lengths + active.astype(jnp.int32),
        tokens=put(loop.tokens, token),
        logp=put(loop.logp, jnp.where(active, d.logp, 0.0)),
        sample_logp=put(loop.sample_logp, jnp.where(active, d.sample_logp, 0.0)),
    )


def _decode(model, loop: _Loop, prompt_len, config: GenerateConfig) -> _Loop:
    """The while loop: one T=1 forward and one draw per step until all rows are done."""
    n, rows = config.max_new_tokens, prompt_len.shape[0]
    on = jnp.ones((rows, 1), jnp.bool_)

    def cond(loop: _Loop):
        return (loop.step < n) & ~jnp.all(loop.done)

    def body(loop: _Loop):
        positions = (prompt_len + loop.step - 1)[:, None]
        logits, cache = model(loop.last[:, None], positions, on, loop.cache)
        d = draw(token_keys(loop.keys, loop.step), logits[:, 0], config.sampling)
        return _record(loop.replace(cache=cache), d, config)

    return jax.lax.while_loop(cond, body, loop)


@functools.partial(jax.jit, static_argnames=("graphdef", "config"), donate_argnames=("cache",))
def generate_with_cache(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    cache: KVCache,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    rng: jax.Array,
    *,
    config: GenerateConfig,
) -> tuple[SampleOutput, KVCache]:
    """Samples G responses for each of P left-padded prompts.

    Args:
      graphdef, state: `nnx.split(model)`.
      cache: a cache from `new_cache` (or returned by the previous call with the same
        shapes); donated: its buffers are reused and must not be read afterwards.
      prompt_tokens: [P, Tp] int32, left-padded (the last column is a real token).
      prompt_mask: [P, Tp] bool, True on real tokens.
      rng: one PRNG key, or one per prompt ([P]); sample g of prompt p draws token t with
        fold_in(fold_in(key_p, g), t) (see the module docstring).
      config: static settings.

    Returns:
      (SampleOutput, the cache to pass to the next call).
    """
    _TRACES[0] += 1
    model = decoding_model(graphdef, state, config)
    p, g, n = prompt_tokens.shape[0], config.num_samples, config.max_new_tokens
    prompt_mask = prompt_mask.astype(jnp.bool_)
    logits, cache = _prefill(model, cache, prompt_tokens, prompt_mask, g)
    rows = p * g
    prompt_len = jnp.repeat(jnp.sum(prompt_mask, axis=-1, dtype=jnp.int32), g)
    loop = _Loop(
        step=jnp.zeros((), jnp.int32),
        keys=sample_keys(prompt_keys(rng, p), g),
        cache=cache,
        last=jnp.zeros((rows,), jnp.int32),
        done=jnp.zeros((rows,), jnp.bool_),
        lengths=jnp.zeros((rows,), jnp.int32),
        tokens=jnp.full((rows, n), config.pad_id, jnp.int32),
        logp=jnp.zeros((rows, n), jnp.float32),
        sample_logp=jnp.zeros((rows, n), jnp.float32),
    )
    loop = _record(loop, draw(token_keys(loop.keys, 0), logits, config.sampling), config)
    loop = _decode(model, loop, prompt_len, config)
    mask = jnp.arange(n)[None, :] < loop.lengths[:, None]

    def per_prompt(x):
        return x.reshape(p, g, *x.shape[1:])

    out = SampleOutput(
        tokens=per_prompt(loop.tokens),
        logp=per_prompt(loop.logp),
        sample_logp=per_prompt(loop.sample_logp),
        mask=per_prompt(mask),
        lengths=per_prompt(loop.lengths),
        truncated=per_prompt(~loop.done),
        num_steps=loop.step - 1,
    )
    return out, loop.cache


def generate(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    rng: jax.Array,
    config: GenerateConfig,
) -> SampleOutput:
    """`generate_with_cache` with a fresh cache (one-off calls; `Sampler` reuses it)."""
    model_config = nnx.merge(graphdef, state).config
    cache = new_cache(model_config, prompt_tokens, config)
    out, _ = generate_with_cache(
        graphdef, state, cache, prompt_tokens, prompt_mask, rng, config=config
    )
    return out


def _delete(cache: KVCache) -> None:
    """Frees a cache's device buffers now (whoever else still holds a reference)."""
    for x in jax.tree.leaves(cache):
        if isinstance(x, jax.Array) and not x.is_deleted():
            x.delete()


class Sampler:
    """Keeps the donated KV cache of the latest (P, Tp, G, N) shapes and calls the jitted
    generate.

    Steady state (same bucket): no allocation of the cache and no recompilation; the
    cache goes in donated and comes back as an output, ready for the next call. At most
    `max_caches` caches are held (default 1, what `da3po_jax.plan` counts): a call with new
    shapes first frees the least recently used one, and `clear` frees them all; the owner
    calls it when generation is over (the trainer before each update, `evaluate` at its
    end), so no cache is alive outside generation.

    Attributes:
      graphdef: the model's static graph (`nnx.split(model)[0]`).
      model_config: the model config.
      config: default `GenerateConfig` (a call may pass another).
      max_caches: caches kept between calls (>= 1).
    """

    def __init__(
        self,
        graphdef: nnx.GraphDef,
        model_config: ModelConfig,
        config: GenerateConfig,
        max_caches: int = 1,
    ):
        if max_caches < 1:
            raise ValueError(f"max_caches={max_caches} must be >= 1")
        self.graphdef = graphdef
        self.model_config = model_config
        self.config = config
        self.max_caches = max_caches
        self._caches: dict[tuple[int, ...], KVCache] = {}

    def generate(
        self,
        state: nnx.State,
        prompt_tokens: jax.Array,
        prompt_mask: jax.Array,
        seed: int | jax.Array,
        config: GenerateConfig | None = None,
    ) -> SampleOutput:
        """Samples for [P, Tp] left-padded prompts; `seed` is an int, a PRNG key or one key
        per prompt."""
        config = config or self.config
        rng = seed if isinstance(seed, jax.Array) else jax.random.key(int(seed))
        p, tp = prompt_tokens.shape
        key = (p, tp, config.num_samples, config.max_new_tokens)
        cache = self._caches.pop(key, None)
        if cache is None:
            while len(self._caches) >= self.max_caches:  # free before allocating anew
                _delete(self._caches.pop(next(iter(self._caches))))
            cache = new_cache(self.model_config, prompt_tokens, config)
        out, self._caches[key] = generate_with_cache(
            self.graphdef, state, cache, prompt_tokens, prompt_mask, rng, config=config
        )
        return out

    @property
    def cache_nbytes(self) -> int:
        """Bytes of the KV caches held now (global arrays: all shards)."""
        return sum(x.nbytes for c in self._caches.values() for x in jax.tree.leaves(c))

    def clear(self) -> None:
        """Frees the held KV caches now (their device buffers are deleted, not just
        dropped), e.g. before a memory-hungry train step; the next call allocates anew."""
        while self._caches:
            _delete(self._caches.popitem()[1])
