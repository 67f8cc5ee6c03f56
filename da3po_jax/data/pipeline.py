"""Deterministic, resumable prompt order for RL: batches of any size, epoch after epoch.

The trainer asks for prompts several times per step (dynamic sampling runs extra rounds
with *new* prompts while its buffer is short), so the iterator hands out `next_batch(n)`
for any `n` and the stream does not depend on how it is cut: `next_batch(3)` then
`next_batch(5)` yields the same eight prompts as eight `next_batch(1)` calls.

Order: epoch `e` is a permutation of all records seeded by `(seed, e)`, computed with
`grain.MapDataset.shuffle` (a stateless index shuffle: record `i` of the epoch is found
without materialising the permutation). With `num_shards` hosts, host `h` takes positions
`h, h + num_shards, ...` of each epoch's global permutation, so within an epoch the hosts'
prompts are disjoint and together cover the data; the last `len % num_shards` positions of
each epoch are skipped so every host has the same epoch length and the hosts stay in step
(a different few records each epoch, none permanently).

Why grain's random-access `MapDataset` and not its `DatasetIterator`: a grain iterator
yields fixed-size batches, while dynamic sampling asks for varying counts; with random
access, the whole position is two integers `(epoch, position)`, trivially checkpointable
next to the trainer state (JSON or orbax), and resuming costs nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

import grain
import numpy as np

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class IteratorState:
    """Where a `PromptIterator` stands.

    Attributes:
      epoch: epochs completed so far.
      position: records of the current epoch already handed out (this host's view).
      fingerprint: hash of (record ids, seed, sharding) of the iterator that made the
        state; restoring into a different dataset or setup is refused.
    """

    epoch: int = 0
    position: int = 0
    fingerprint: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view, for checkpoints."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> IteratorState:
        """Inverse of `to_dict` (numbers may arrive as numpy scalars from a checkpoint)."""
        try:
            return cls(int(d["epoch"]), int(d["position"]), str(d.get("fingerprint", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a data iterator state: {dict(d)!r}") from e


def _record_key(record: Any) -> str:
    key = getattr(record, "id", None)
    return str(key) if key is not None else repr(record)


def _epoch_seed(seed: int, epoch: int) -> int:
    """A 32-bit shuffle seed mixing (seed, epoch), so seed s epoch 1 != seed s+1 epoch 0."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1, dtype=np.uint32)[0])


class PromptIterator(Generic[T]):
    """Seeded, resumable, shardable stream of records (e.g. `MathProblem`s).

    Example:
      it = PromptIterator(problems, seed=0, shard_index=jax.process_index(),
                          num_shards=jax.process_count())
      batch = it.next_batch(64)
      ckpt["data"] = it.state.to_dict()
      ...
      it.restore(IteratorState.from_dict(ckpt["data"]))
    """

    def __init__(
        self,
        records: Sequence[T],
        *,
        seed: int = 0,
        shard_index: int = 0,
        num_shards: int = 1,
        shuffle: bool = True,
    ):
        """Args:
          records: the dataset (random access); must not change while iterating.
          seed: non-negative shuffle seed.
          shard_index: this host's shard, in `[0, num_shards)`.
          num_shards: number of hosts sharing the data.
          shuffle: reshuffle each epoch; False keeps the records' order (e.g. eval).

        Raises:
          ValueError: bad shard arguments, a negative seed, or fewer records than shards.
        """
        if num_shards < 1 or not 0 <= shard_index < num_shards:
            raise ValueError(f"need 0 <= shard_index < num_shards, got {shard_index}/{num_shards}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        if len(records) < num_shards:
            raise ValueError(
                f"{len(records)} records cannot be split over {num_shards} shards "
                "(every shard needs at least one)"
            )
        self._source = grain.MapDataset.source(records)
        self._seed = int(seed)
        self._shard_index = int(shard_index)
        self._num_shards = int(num_shards)
        self._shuffle = bool(shuffle)
        self._epoch_length = len(records) // num_shards
        self._fingerprint = self._make_fingerprint(records)
        self._epoch, self._position = 0, 0
        self._view_epoch, self._view = -1, self._source

    def _make_fingerprint(self, records: Sequence[T]) -> str:
        h = hashlib.blake2b(digest_size=8)
        h.update(repr((self._seed, self._shard_index, self._num_shards, self._shuffle)).encode())
        for r in records:
            h.update(_record_key(r).encode("utf-8", errors="replace") + b"\0")
        return h.hexdigest()

    @property
    def epoch_length(self) -> int:
        """Records this host receives per epoch."""
        return self._epoch_length

    @property
    def state(self) -> IteratorState:
        """Current position; `restore` it into an identically built iterator to continue."""
        return IteratorState(self._epoch, self._position, self._fingerprint)

    def restore(self, state: IteratorState | Mapping[str, Any]) -> None:
        """Continues from a saved `state` (an `IteratorState` or its `to_dict()`).

        Raises:
          ValueError: the state belongs to a different dataset/seed/sharding, or its
            position is out of range.
        """
        if not isinstance(state, IteratorState):
            state = IteratorState.from_dict(state)
        if state.fingerprint and state.fingerprint != self._fingerprint:
            raise ValueError(
                "saved data position was made for a different dataset, seed or sharding "
                f"(fingerprint {state.fingerprint} != {self._fingerprint}); refusing to resume"
            )
        if state.epoch < 0 or not 0 <= state.position < self._epoch_length:
            raise ValueError(
                f"saved data position {state} is out of range for an epoch of "
                f"{self._epoch_length} records"
            )
        self._epoch, self._position = state.epoch, state.position

    def _epoch_view(self, epoch: int) -> grain.MapDataset:
        """This host's records of `epoch`, in order (cached for the current epoch)."""
        if epoch != self._view_epoch:
            ds = self._source
            if self._shuffle:
                ds = ds.shuffle(seed=_epoch_seed(self._seed, epoch))
            stop = self._epoch_length * self._num_shards
            self._view = ds[self._shard_index : stop : self._num_shards]
            self._view_epoch = epoch
        return self._view

    def next_batch(self, n: int) -> list[T]:
        """The next `n` records of this host's stream, crossing epochs as needed.

        `n` may vary from call to call and may exceed an epoch (records then repeat).
        """
        if n < 0:
            raise ValueError(f"batch size must be >= 0, got {n}")
        out: list[T] = []
        while len(out) < n:
            view = self._epoch_view(self._epoch)
            take = min(n - len(out), self._epoch_length - self._position)
            out.extend(view[i] for i in range(self._position, self._position + take))
            self._position += take
            if self._position == self._epoch_length:
                self._epoch, self._position = self._epoch + 1, 0
        return out

    def __iter__(self) -> PromptIterator[T]:
        return self

    def __next__(self) -> T:
        return self.next_batch(1)[0]
