"""The device side of continuous batching: S decode slots (`Slots`) and the jitted
functions of fixed shapes that act on them, each donating the slots (updated in place).

- `admit_groups`: prefills A right-padded prompts **once** (their keys/values are the
  same for every sample) and copies each prompt's keys/values into the G slots its samples
  take, then draws every sample's first token from the prompt's last logits. Padding
  admissions target slot index S (every write is dropped).
- `decode_steps`: up to K decode steps of every running slot (one token each): the token is
  fed at its own position, its keys/values written at the slot's own length, attention
  runs over that slot's live keys only (`models/decode_attention.py`: by default the
  live (slot, block) pairs only), and the loop exits early once no slot runs.
- `read_rows`: the output rows of H slots, for the host to collect.
- `refill_slots`: the keys/values of H live slots computed anew (prompt + the tokens
  generated so far, one prefill) under the given weights: partial rollouts with
  `rollout.partial_kv = "recompute"` after the weights changed.

The host loop that drives them is `continuous.SlotDecoder`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from da3po_jax.models.config import ModelConfig
from da3po_jax.models.transformer import KVCache, SlotCache
from da3po_jax.parallel import BATCH_AXES
from da3po_jax.sampling.distribution import draw
from da3po_jax.sampling.sampler import GenerateConfig, decoding_model, sample_keys, token_keys

_TRACES = collections.Counter()  # traces (= compiles) of the jitted functions, by name


def trace_counts() -> dict[str, int]:
    """How many times each jitted function of this module has been traced."""
    return dict(_TRACES)


@dataclasses.dataclass(frozen=True)
class SlotConfig:
    """Shapes of a slot decoder (static: a new value compiles anew).

    Attributes:
      slots: S, rows decoded together.
      prompt_len: Tp, the longest prompt (tokens) it admits.
      steps_per_call: K, decode steps per jitted call (host bookkeeping between calls).
      block: keys per attention block (the cache length is a multiple of it).
      admit_prompts: A, prompts prefilled per admission call (default S // G).
      read_rows: H, finished rows read back per call (default max(G, S // 8)).
    """

    slots: int
    prompt_len: int
    steps_per_call: int = 16
    block: int = 128
    admit_prompts: int = 0
    read_rows: int = 0

    def __post_init__(self):
        for name in ("slots", "prompt_len", "steps_per_call", "block"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")

    def resolved(self, group_size: int) -> SlotConfig:
        if self.slots < group_size:
            raise ValueError(f"slots={self.slots} cannot hold one group of {group_size} samples")
        a = self.admit_prompts or max(1, self.slots // group_size)
        h = self.read_rows or min(self.slots, max(group_size, self.slots // 8))
        return dataclasses.replace(self, admit_prompts=a, read_rows=h)


@struct.dataclass
class Slots:
    """Device state of S slots; N = max_new_tokens.

    Attributes:
      cache: the slots' keys/values.
      keys: [S] sample keys (`sampler.sample_keys`) of the rows they hold.
      length: [S] int32 keys written (prompt + tokens fed so far).
      step: [S] int32 tokens generated (the index of the next one).
      last: [S] int32 the token to feed next.
      running: [S] bool, still generating.
      stopped: [S] bool, emitted a stop id.
      tokens, logp, sample_logp: [S, N] the rows' outputs (pad / 0 past `step`).
    """

    cache: SlotCache
    keys: jax.Array
    length: jax.Array
    step: jax.Array
    last: jax.Array
    running: jax.Array
    stopped: jax.Array
    tokens: jax.Array
    logp: jax.Array
    sample_logp: jax.Array


def _slot_shardings(mesh: Mesh, model_config: ModelConfig, like: Slots):
    """Slots split over the mesh's batch axes; KV heads over `tensor` where they divide."""
    tensor = mesh.shape.get("tensor", 1)
    heads = "tensor" if tensor > 1 and model_config.num_kv_heads % tensor == 0 else None

    def spec(x):
        if x.ndim == 4:
            return NamedSharding(mesh, PartitionSpec(BATCH_AXES, None, heads))
        return NamedSharding(mesh, PartitionSpec(BATCH_AXES))

    return jax.tree.map(spec, like)


def init_slots(
    model_config: ModelConfig,
    gen: GenerateConfig,
    slot_config: SlotConfig,
    mesh: Mesh | None = None,
):
    """Empty slots (none running) for prompts up to `slot_config.prompt_len` tokens."""
    return _slot_initializer(model_config, gen, slot_config, mesh, False)()


def init_slot_cache(
    model_config: ModelConfig,
    gen: GenerateConfig,
    slot_config: SlotConfig,
    mesh: Mesh | None = None,
) -> SlotCache:
    """Only the keys/values of `init_slots` (placed alike): a cache freed by
    `SlotDecoder.drop_cache`, allocated again."""
    return _slot_initializer(model_config, gen, slot_config, mesh, True)()


@functools.lru_cache(maxsize=16)
def _slot_initializer(
    model_config: ModelConfig,
    gen: GenerateConfig,
    slot_config: SlotConfig,
    mesh: Mesh | None,
    cache_only: bool,
):
    """The jitted allocation of `init_slots` / `init_slot_cache` (cached: the same shapes
    compile once)."""
    init = _empty_slots(model_config, gen, slot_config)
    shardings = (
        _slot_shardings(mesh, model_config, jax.eval_shape(init)) if mesh is not None else None
    )
    if cache_only:
        return jax.jit(lambda: init().cache, out_shardings=shardings and shardings.cache)
    return jax.jit(init, out_shardings=shardings)


def slot_shapes(
    model_config: ModelConfig, gen: GenerateConfig, slot_config: SlotConfig, mesh: Mesh
) -> Slots:
    """The slots `init_slots` places on `mesh`, as sharded `jax.ShapeDtypeStruct`s."""
    like = jax.eval_shape(_empty_slots(model_config, gen, slot_config))
    return jax.tree.map(
        lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
        like,
        _slot_shardings(mesh, model_config, like),
    )


def _empty_slots(model_config: ModelConfig, gen: GenerateConfig, slot_config: SlotConfig):
    s, n = slot_config.slots, gen.max_new_tokens

    def init():
        return Slots(
            cache=SlotCache.init(
                model_config, s, slot_config.prompt_len + n - 1, slot_config.block
            ),
            keys=jax.random.split(jax.random.key(0), s),
            length=jnp.zeros((s,), jnp.int32),
            step=jnp.zeros((s,), jnp.int32),
            last=jnp.zeros((s,), jnp.int32),
            running=jnp.zeros((s,), jnp.bool_),
            stopped=jnp.zeros((s,), jnp.bool_),
            tokens=jnp.full((s, n), gen.pad_id, jnp.int32),
            logp=jnp.zeros((s, n), jnp.float32),
            sample_logp=jnp.zeros((s, n), jnp.float32),
        )

    return init


def _is_stop(token: jax.Array, gen: GenerateConfig) -> jax.Array:
    stop = jnp.zeros(token.shape, jnp.bool_)
    for i in gen.stop_ids:
        stop = stop | (token == i)
    return stop


@functools.partial(jax.jit, static_argnames=("graphdef", "gen"), donate_argnames=("slots",))
def admit_groups(graphdef, state, slots: Slots, tokens, lengths, slot_ids, keys, *, gen):
    """Prefills A prompts once and starts their G samples in the slots `slot_ids`.

    Args:
      tokens: [A, Tb] int32 prompts, right-padded (Tb <= the slots' prompt length).
      lengths: [A] int32 prompt lengths (>= 1).
      slot_ids: [A, G] int32 slots of each prompt's samples; S for padding rows.
      keys: [A] prompt keys.
    """
    _TRACES["admit_groups"] += 1
    model = decoding_model(graphdef, state, gen)
    a, tb = tokens.shape
    g = gen.num_samples
    mask = jnp.arange(tb)[None, :] < lengths[:, None]
    positions = jnp.broadcast_to(jnp.arange(tb, dtype=jnp.int32), (a, tb))
    h, small = model.hidden(tokens, positions, mask, KVCache.init(model.config, a, tb))
    last_h = jnp.take_along_axis(h, (lengths - 1)[:, None, None], axis=1)[:, 0]
    logits = jnp.repeat(model.logits(last_h), g, axis=0)  # [A * G, V]
    rows = slot_ids.reshape(-1)
    skeys = sample_keys(keys, g)
    d = draw(token_keys(skeys, 0), logits, gen.sampling)
    stop = _is_stop(d.token, gen)

    def put(big, new):  # rows of the slots' arrays <- values per sample
        return big.at[rows].set(new.astype(big.dtype), mode="drop")

    def put_kv(big, new):  # [S, L, ...] columns [0, Tb) <- each prompt's keys, G times
        new = jnp.swapaxes(new, 1, 2)  # the prefill's [A, kv_heads, Tb, D] as [A, Tb, kv_heads, D]
        return big.at[rows, :tb].set(jnp.repeat(new, g, axis=0).astype(big.dtype), mode="drop")

    n = gen.max_new_tokens
    first = lambda x, fill: jnp.full((rows.size, n), fill, x.dtype).at[:, 0].set(x)  # noqa: E731
    cache = slots.cache.replace(
        k=tuple(map(put_kv, slots.cache.k, small.k)), v=tuple(map(put_kv, slots.cache.v, small.v))
    )
    return Slots(
        cache=cache,
        keys=slots.keys.at[rows].set(skeys, mode="drop"),
        length=put(slots.length, jnp.repeat(lengths, g)),
        step=put(slots.step, jnp.ones_like(rows)),
        last=put(slots.last, d.token),
        running=put(slots.running, ~stop & (n > 1)),
        stopped=put(slots.stopped, stop),
        tokens=put(slots.tokens, first(d.token, gen.pad_id)),
        logp=put(slots.logp, first(d.logp, 0.0)),
        sample_logp=put(slots.sample_logp, first(d.sample_logp, 0.0)),
    )


@functools.partial(
    jax.jit, static_argnames=("graphdef", "gen", "steps"), donate_argnames=("slots",)
)
def decode_steps(graphdef, state, slots: Slots, *, gen: GenerateConfig, steps: int):
    """Up to `steps` decode steps of the running slots; returns (slots, steps run)."""
    _TRACES["decode_steps"] += 1
    model = decoding_model(graphdef, state, gen)
    s, n = slots.tokens.shape
    cap, rows = slots.cache.max_len, jnp.arange(s)

    def cond(carry):
        i, sl = carry
        return (i < steps) & jnp.any(sl.running)

    def body(carry):
        i, sl = carry
        run = sl.running
        write = jnp.where(run, sl.length, cap)  # cap: dropped
        logits, cache = model.decode_slots(
            sl.last, sl.length, sl.cache, write, jnp.where(run, sl.length + 1, 0)
        )
        d = draw(token_keys(sl.keys, sl.step), logits, gen.sampling)
        col = jnp.where(run, sl.step, n)  # n: dropped

        def rec(buf, x):
            return buf.at[rows, col].set(x.astype(buf.dtype), mode="drop")

        stop = run & _is_stop(d.token, gen)
        step = sl.step + run
        sl = sl.replace(
            cache=cache,
            length=sl.length + run,
            step=step,
            last=jnp.where(run, d.token, sl.last),
            running=run & ~stop & (step < n),
            stopped=sl.stopped | stop,
            tokens=rec(sl.tokens, d.token),
            logp=rec(sl.logp, d.logp),
            sample_logp=rec(sl.sample_logp, d.sample_logp),
        )
        return i + 1, sl

    i, slots = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), slots))
    return slots, i


@jax.jit
def read_rows(slots: Slots, rows: jax.Array):
    """(tokens, logp, sample_logp) [H, N] of the slots `rows` [H]."""
    _TRACES["read_rows"] += 1
    return slots.tokens[rows], slots.logp[rows], slots.sample_logp[rows]


@functools.partial(
    jax.jit, static_argnames=("graphdef", "gen", "width"), donate_argnames=("slots",)
)
def refill_slots(graphdef, state, slots: Slots, rows, prompts, prompt_lengths, *, gen, width):
    """The keys/values of the slots `rows` [H] (S: padding, dropped) computed anew under
    `state`: each row's prompt (`prompts` [H, Tp] right-padded, `prompt_lengths` [H])
    followed by the tokens it has fed so far (all generated but the last, which the next
    decode step feeds), prefilled in one pass of `width` columns (>= the longest such row;
    columns past a row's length hold values no attention reads)."""
    _TRACES["refill_slots"] += 1
    model = decoding_model(graphdef, state, gen)
    s, n = slots.tokens.shape
    tp = prompts.shape[1]
    safe = jnp.minimum(rows, s - 1)
    generated, step = slots.tokens[safe], slots.step[safe]
    col = jnp.arange(width)[None, :]
    lp = prompt_lengths[:, None]
    from_prompt = jnp.take_along_axis(prompts, jnp.minimum(col, tp - 1), axis=1)
    from_generated = jnp.take_along_axis(generated, jnp.clip(col - lp, 0, n - 1), axis=1)
    seq = jnp.where(col < lp, from_prompt, from_generated)
    mask = col < lp + step[:, None] - 1
    positions = jnp.broadcast_to(col.astype(jnp.int32), seq.shape)
    _, fresh = model.hidden(seq, positions, mask, KVCache.init(model.config, rows.shape[0], width))

    def put_kv(big, new):  # [S, L, ...] columns [0, width) <- the row's keys/values
        new = jnp.swapaxes(new, 1, 2)  # [H, kv_heads, width, D] as [H, width, kv_heads, D]
        return big.at[rows, :width].set(new.astype(big.dtype), mode="drop")

    cache = slots.cache.replace(
        k=tuple(map(put_kv, slots.cache.k, fresh.k)), v=tuple(map(put_kv, slots.cache.v, fresh.v))
    )
    return slots.replace(cache=cache)
