"""Continuous batching: S decode slots kept busy by admitting new groups as rows finish.

The device holds `Slots`: one `SlotCache` row per slot plus per-slot state (its sample
key, KV length, tokens generated, running / stopped flags and its output buffers). Three
jitted functions of fixed shapes act on it, each donating it (updated in place):

- `admit_groups`: prefills A right-padded prompts **once** (their keys/values are the
  same for every sample) and copies each prompt's keys/values into the G slots its samples
  take, then draws every sample's first token from the prompt's last logits. Padding
  admissions target slot index S (every write is dropped).
- `decode_steps`: up to K decode steps of every running slot (one token each): the token is
  fed at its own position, its keys/values written at the slot's own length, attention
  runs over that slot's live keys only (`decode_attention`, bounded by the longest live
  slot), and the loop exits early once no slot runs.
- `read_rows`: the output rows of H slots, for the host to collect.

`SlotDecoder` is the host loop: it queues prompts, admits a group whenever G slots are
free, runs decode calls, and hands back every group whose G rows have all finished. The
slots of a finished row are free again at once, whatever its group's other rows do.

Randomness is the static sampler's (`sampler.py`): sample g of a prompt with key k draws
token t with fold_in(fold_in(k, g), t), so both engines give the same tokens for the same
keys (exactly for greedy; for sampling as long as the logits agree to the last bit that
matters). Log-probs are recorded as there (`logp` at temperature 1, `sample_logp` under
the sampling distribution).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from da3po_jax.models.config import ModelConfig
from da3po_jax.models.transformer import KVCache, SlotCache
from da3po_jax.parallel import BATCH_AXES
from da3po_jax.parallel.mesh import batch_size_divisor
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


def _slot_shardings(mesh: Mesh, cfg: ModelConfig, like: Slots):
    """Slots split over the mesh's batch axes; KV heads over `tensor` where they divide."""
    tensor = mesh.shape.get("tensor", 1)
    heads = "tensor" if tensor > 1 and cfg.num_kv_heads % tensor == 0 else None

    def spec(x):
        if x.ndim == 4:
            return NamedSharding(mesh, PartitionSpec(BATCH_AXES, None, heads))
        return NamedSharding(mesh, PartitionSpec(BATCH_AXES))

    return jax.tree.map(spec, like)


def init_slots(cfg: ModelConfig, gen: GenerateConfig, sc: SlotConfig, mesh: Mesh | None = None):
    """Empty slots (none running) for prompts up to `sc.prompt_len` tokens."""
    return _slot_initializer(cfg, gen, sc, mesh)()


@functools.lru_cache(maxsize=16)
def _slot_initializer(cfg: ModelConfig, gen: GenerateConfig, sc: SlotConfig, mesh: Mesh | None):
    """The jitted allocation of `init_slots` (cached: the same shapes compile once)."""
    init = _empty_slots(cfg, gen, sc)
    shardings = _slot_shardings(mesh, cfg, jax.eval_shape(init)) if mesh is not None else None
    return jax.jit(init, out_shardings=shardings)


def slot_shapes(cfg: ModelConfig, gen: GenerateConfig, sc: SlotConfig, mesh: Mesh) -> Slots:
    """The slots `init_slots` places on `mesh`, as sharded `jax.ShapeDtypeStruct`s."""
    like = jax.eval_shape(_empty_slots(cfg, gen, sc))
    return jax.tree.map(
        lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
        like,
        _slot_shardings(mesh, cfg, like),
    )


def _empty_slots(cfg: ModelConfig, gen: GenerateConfig, sc: SlotConfig):
    s, n = sc.slots, gen.max_new_tokens

    def init():
        return Slots(
            cache=SlotCache.init(cfg, s, sc.prompt_len + n - 1, sc.block),
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
    h, small = model.hidden(tokens, positions, mask, KVCache.init(model.cfg, a, tb))
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


@dataclasses.dataclass
class FinishedGroup:
    """The G samples of one prompt, as host arrays ([G, N] / [G]).

    Attributes:
      tag: what the caller submitted the prompt with.
      tokens, logp, sample_logp, mask: as `SampleOutput`'s rows.
      lengths: [G] response lengths; truncated: [G] no stop id within N tokens.
      left: rows still running (0 once the group is handed back).
    """

    tag: object
    tokens: np.ndarray
    logp: np.ndarray
    sample_logp: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray
    left: int = 0

    @property
    def mask(self) -> np.ndarray:
        return np.arange(self.tokens.shape[1])[None, :] < self.lengths[:, None]


class SlotDecoder:
    """The host loop of continuous batching (see the module docstring).

    Args:
      graphdef: the model's graph; cfg: its config.
      gen: sampling settings (num_samples = G, max_new_tokens = N, stop and pad ids).
      slot_config: S, the prompt length, K, the attention block, A and H.
      mesh: the slots are split over its batch axes (S must divide); None: one device.

    Counters (since construction): `decode_steps` (decode steps run), `slot_steps`
    (S x decode steps), `decode_tokens` (tokens generated by decode steps, i.e. every
    response token but the first, which the prefill's logits give).
    """

    def __init__(
        self,
        graphdef: nnx.GraphDef,
        cfg: ModelConfig,
        gen: GenerateConfig,
        slot_config: SlotConfig,
        mesh: Mesh | None = None,
    ):
        sc = slot_config.resolved(gen.num_samples)
        if mesh is not None:
            if sc.slots % batch_size_divisor(mesh):
                raise ValueError(
                    f"slots={sc.slots} must be a multiple of the mesh's batch devices "
                    f"({batch_size_divisor(mesh)})"
                )
        self.graphdef, self.cfg, self.gen, self.sc, self.mesh = graphdef, cfg, gen, sc, mesh
        self._slots: Slots | None = None
        self._queue: collections.deque = collections.deque()
        self._free = list(range(sc.slots))
        self._owner: dict[int, tuple[FinishedGroup, int]] = {}  # slot -> (group, sample index)
        self.decode_steps = self.slot_steps = self.decode_tokens = 0

    # ----------------------------------------------------------------- queries
    @property
    def group_size(self) -> int:
        return self.gen.num_samples

    def free_groups(self) -> int:
        """Groups that could start now: free slots // G, less the prompts queued."""
        return max(0, len(self._free) // self.group_size - len(self._queue))

    def busy(self) -> bool:
        """Prompts queued or rows in flight."""
        return bool(self._queue or self._owner)

    @property
    def nbytes(self) -> int:
        return 0 if self._slots is None else sum(x.nbytes for x in jax.tree.leaves(self._slots))

    # ---------------------------------------------------------------- actions
    def submit(self, tag, prompt_ids: Sequence[int], key: jax.Array) -> None:
        """Queues one prompt (token ids) for G samples drawn with prompt key `key`."""
        if not 1 <= len(prompt_ids) <= self.sc.prompt_len:
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens: the slots hold prompts of 1.."
                f"{self.sc.prompt_len} tokens"
            )
        self._queue.append((tag, list(prompt_ids), key))

    def step(self, params) -> list[FinishedGroup]:
        """Starts queued prompts in free slots, runs one decode call and returns the groups
        finished by it (every G rows done)."""
        if self._slots is None:
            self._slots = init_slots(self.cfg, self.gen, self.sc, self.mesh)
        while self._queue and len(self._free) >= self.group_size:
            self._admit(params)
        if not self._owner:
            return []
        self._slots, ran = decode_steps(
            self.graphdef, params, self._slots, gen=self.gen, steps=self.sc.steps_per_call
        )
        running, step, stopped, ran = jax.device_get(
            (self._slots.running, self._slots.step, self._slots.stopped, ran)
        )
        self.decode_steps += int(ran)
        self.slot_steps += int(ran) * self.sc.slots
        done = [s for s in self._owner if not running[s]]
        return self._collect(done, step, stopped)

    def clear(self) -> None:
        """Frees the slots' device memory now (the next `step` allocates them anew). Rows
        and prompts still in flight are abandoned (after an error; a finished run has
        none)."""
        if self._slots is not None:
            for x in jax.tree.leaves(self._slots):
                if not x.is_deleted():
                    x.delete()
        self._slots = None
        self._queue.clear()
        self._owner.clear()
        self._free = list(range(self.sc.slots))

    def _admit(self, params) -> None:
        sc, g, n = self.sc, self.group_size, self.gen.max_new_tokens
        take = min(len(self._queue), len(self._free) // g, sc.admit_prompts)
        width = sc.prompt_len
        tokens = np.full((sc.admit_prompts, width), self.gen.pad_id, np.int32)
        lengths = np.ones((sc.admit_prompts,), np.int32)
        slot_ids = np.full((sc.admit_prompts, g), sc.slots, np.int32)
        keys = []
        for a in range(take):
            tag, ids, key = self._queue.popleft()
            tokens[a, : len(ids)], lengths[a] = ids, len(ids)
            rows = [self._free.pop(0) for _ in range(g)]
            slot_ids[a] = rows
            z = lambda dt: np.zeros((g, n), dt)  # noqa: E731
            group = FinishedGroup(
                tag,
                z(np.int32),
                z(np.float32),
                z(np.float32),
                np.zeros(g, np.int32),
                np.zeros(g, bool),
                g,
            )
            for i, s in enumerate(rows):
                self._owner[s] = (group, i)
            keys.append(key)
        keys += [keys[0]] * (sc.admit_prompts - take)
        self._slots = admit_groups(
            self.graphdef,
            params,
            self._slots,
            jnp.asarray(tokens),
            jnp.asarray(lengths),
            jnp.asarray(slot_ids),
            jnp.stack(keys),
            gen=self.gen,
        )

    def _collect(self, done: list[int], step, stopped) -> list[FinishedGroup]:
        h, finished = self.sc.read_rows, []
        for start in range(0, len(done), h):
            chunk = done[start : start + h]
            rows = np.asarray(chunk + [chunk[0]] * (h - len(chunk)), np.int32)
            toks, logp, slogp = jax.device_get(read_rows(self._slots, jnp.asarray(rows)))
            for j, s in enumerate(chunk):
                group, i = self._owner.pop(s)
                self._free.append(s)
                group.tokens[i], group.logp[i], group.sample_logp[i] = toks[j], logp[j], slogp[j]
                group.lengths[i], group.truncated[i] = step[s], not stopped[s]
                self.decode_tokens += int(step[s]) - 1
                group.left -= 1
                if not group.left:
                    finished.append(group)
        return finished


def generate_continuous(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    prompts: Sequence[Sequence[int]],
    keys: jax.Array,
    gen: GenerateConfig,
    slot_config: SlotConfig,
    mesh: Mesh | None = None,
) -> tuple[list[FinishedGroup], SlotDecoder]:
    """All of `prompts` (token id lists, prompt p sampled with `keys[p]`) through one slot
    decoder; returns the groups in prompt order (tag = prompt index) and the decoder (for
    its counters)."""
    cfg = nnx.merge(graphdef, state).cfg
    decoder = SlotDecoder(graphdef, cfg, gen, slot_config, mesh)
    for p, ids in enumerate(prompts):
        decoder.submit(p, ids, keys[p])
    out: dict[int, FinishedGroup] = {}
    while decoder.busy():
        for group in decoder.step(state):
            out[group.tag] = group
    decoder.clear()
    return [out[p] for p in range(len(prompts))], decoder
