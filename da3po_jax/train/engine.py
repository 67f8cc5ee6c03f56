"""Rollout engines: what the RL loop needs from any generator of scored groups.

The collector (`train/collector.py`) and evaluation talk to an engine through these calls
and never look inside it:

- `sync_weights(params)`: the policy parameters for the generations that follow;
- `capacity()`: how many more prompts it takes now (0 while it is full);
- `admit(problems, keys)`: queues prompts, G samples each, prompt i drawn with `keys[i]`
  (`sampling.prompt_keys`: the samples of a prompt depend on its key only);
- `in_flight()`: prompts admitted and not yet returned;
- `finished()`: advances generation and returns the groups done since the last call,
  generated and scored, as `ScoredGroups` (possibly none while work is in flight; blocks
  while nothing is ready to return);
- `release()`: frees generation memory (KV caches) before the update;

and `max_in_flight`, the most prompts it holds at once (what the dynamic-sampling buffer
makes room for beyond the batch).

`StaticEngine` (below) runs each admitted round as one sampler call and returns it whole.
`ContinuousEngine` keeps S decode slots busy (continuous batching) and returns groups as
they finish, while the collector admits new prompts into the slots they free. Both return
batches of one fixed size (padded, `ScoredGroups.valid`), so the dynamic-sampling update
compiles once.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from concurrent import futures
from typing import Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from da3po_jax.data import MathProblem
from da3po_jax.parallel import global_batch, host_rows, shard_batch
from da3po_jax.rewards import RewardScorer
from da3po_jax.sampling import GenerateConfig, Sampler
from da3po_jax.sampling.continuous import FinishedGroup, SlotDecoder
from da3po_jax.train.batch import GroupBatch, GroupScores, ScoredGroups
from da3po_jax.train.rollout import PromptEncoder, _sample_and_score


@runtime_checkable
class RolloutEngine(Protocol):
    """A generator of scored groups (see the module docstring for the contract)."""

    group_size: int
    prompt_len: int  # the padded prompt length of the groups it returns
    max_new_tokens: int
    max_in_flight: int

    def sync_weights(self, params) -> None: ...

    def capacity(self) -> int: ...

    def admit(self, problems: Sequence[MathProblem], keys: jax.Array) -> None: ...

    def in_flight(self) -> int: ...

    def finished(self) -> list[ScoredGroups]: ...

    def release(self) -> None: ...


class StaticEngine:
    """The static-batch engine: each admitted round is one `Sampler` call (every prompt
    prefilled once, its G rows decoded until the longest stops), scored in the reward
    worker pool and packed as a `GroupBatch`. A round of fewer than `round_size` prompts
    is padded with copies of its first prompt (invalid rows), so every call has one shape.

    Args:
      sampler: the policy's `Sampler` (its KV cache is freed by `release`).
      encoder: prompt tokenisation.
      scorer: reward worker pool.
      gen: sampling settings (num_samples = G).
      prompt_len: the fixed prompt length of training groups (every round's prompts are
        re-padded to it, so groups of different buckets share one buffer).
      index_of: dataset index of a problem id (-1 for others; the history estimator).
      mesh: prompts and samples are split over its batch axes and each host decodes and
        scores its own rows. None: one device.
      round_size: prompts per sampler call (the round size of dynamic sampling).
    """

    def __init__(
        self,
        sampler: Sampler,
        encoder: PromptEncoder,
        scorer: RewardScorer,
        gen: GenerateConfig,
        prompt_len: int,
        index_of: dict[str, int],
        mesh: Mesh | None = None,
        *,
        round_size: int,
    ):
        self.sampler, self.encoder, self.scorer, self.gen = sampler, encoder, scorer, gen
        self.mesh, self.index_of, self.round_size = mesh, index_of, round_size
        self.group_size, self.prompt_len = gen.num_samples, prompt_len
        self.max_new_tokens, self.max_in_flight = gen.max_new_tokens, round_size
        self._params = None
        self._queue: collections.deque = collections.deque()

    def sync_weights(self, params) -> None:
        self._params = params

    def capacity(self) -> int:
        return 0 if self._queue else self.round_size

    def admit(self, problems: Sequence[MathProblem], keys: jax.Array) -> None:
        if not 0 < len(problems) <= self.round_size:
            raise ValueError(f"{len(problems)} prompts for a round of {self.round_size}")
        self._queue.append((list(problems), keys))

    def in_flight(self) -> int:
        return sum(len(p) for p, _ in self._queue)

    def finished(self) -> list[ScoredGroups]:
        if not self._queue:
            return []
        if self._params is None:
            raise RuntimeError("StaticEngine.finished: call sync_weights(params) first")
        problems, keys = self._queue.popleft()
        real = len(problems)
        if real < self.round_size:  # one shape per call: pad with copies, marked invalid
            fill = self.round_size - real
            problems = problems + [problems[0]] * fill
            keys = jnp.concatenate([keys, jnp.repeat(keys[:1], fill)])
        return [self._generate(problems, keys, real)]

    def release(self) -> None:
        self.sampler.clear()

    def _generate(self, problems: list[MathProblem], keys: jax.Array, real: int) -> ScoredGroups:
        out, scores, (correct, rewards) = _sample_and_score(
            self.sampler,
            self._params,
            problems,
            keys,
            self.encoder,
            self.scorer,
            self.gen,
            self.mesh,
        )
        n = len(problems)
        rows = host_rows(self.mesh, n)
        ptok, pmask = self.encoder.pad(problems[rows], self.prompt_len)
        index = np.asarray([self.index_of.get(p.id, -1) for p in problems[rows]], np.int32)
        prompt_tokens, prompt_mask, rewards, correct, prompt_index = global_batch(
            (ptok, pmask, rewards, correct, index), self.mesh, n
        )
        batch = GroupBatch(
            prompt_tokens=prompt_tokens,
            prompt_mask=prompt_mask,
            tokens=out.tokens,
            response_mask=out.mask,
            logp_old=out.logp,
            rewards=rewards,
            correct=correct,
            lengths=out.lengths,
            truncated=out.truncated,
            prompt_index=prompt_index,
            logp_sample=out.sample_logp,
            history=None,
        )
        if real < n:
            scores = scores.head(real)
        return ScoredGroups(batch, scores, problems[:real], np.arange(n) < real)


class ContinuousEngine:
    """Continuous batching behind the engine protocol: a `SlotDecoder` keeps S slots
    busy, a prompt starting whenever G slots are free; each call of `finished()` runs one
    decode call (K steps), hands the groups it finished to a scoring thread (detokenise +
    reward workers, overlapping the next decode calls) and returns the groups whose scoring
    is done, packed in batches of `return_size` groups (padded).

    One process only: the slots, their host bookkeeping and the scoring live on it.

    Args:
      decoder: the policy's `SlotDecoder` (its G = the group size).
      encoder: prompt tokenisation.
      scorer: reward worker pool (used from the scoring thread only while generating).
      prompt_len: the prompt length of the returned batches (training groups).
      index_of: dataset index of a problem id (-1 for others; the history estimator).
      mesh: returned batches are split over its batch axes. None: one device.
      max_in_flight: prompts held at once at most (`config.surplus_capacity`).
    """

    def __init__(
        self,
        decoder: SlotDecoder,
        encoder: PromptEncoder,
        scorer: RewardScorer,
        prompt_len: int,
        index_of: dict[str, int],
        mesh: Mesh | None = None,
        *,
        max_in_flight: int,
    ):
        if jax.process_count() > 1:
            raise ValueError(
                f"rollout.engine='continuous' runs in one process (this run has "
                f"{jax.process_count()}); use rollout.engine='static'"
            )
        self.decoder, self.encoder, self.scorer, self.mesh = decoder, encoder, scorer, mesh
        self.index_of = index_of
        g, s = decoder.group_size, decoder.sc.slots
        self.group_size, self.prompt_len = g, prompt_len
        self.max_new_tokens = decoder.gen.max_new_tokens
        self.max_in_flight = max_in_flight
        self.return_size = max(1, s // g)
        self._params = None
        self._in_flight = 0
        self._scoring: collections.deque[futures.Future] = collections.deque()
        self._pool = futures.ThreadPoolExecutor(1, thread_name_prefix="da3po-scoring")
        self._rollout_s = 0.0  # wall time in `finished` not yet reported

    def sync_weights(self, params) -> None:
        self._params = params

    def capacity(self) -> int:
        return max(0, min(self.decoder.free_groups(), self.max_in_flight - self._in_flight))

    def admit(self, problems: Sequence[MathProblem], keys: jax.Array) -> None:
        for p, key in zip(problems, keys):
            self.decoder.submit(p, self.encoder.ids(p), key)
        self._in_flight += len(problems)

    def in_flight(self) -> int:
        return self._in_flight

    def finished(self) -> list[ScoredGroups]:
        if not self._in_flight:
            return []
        if self._params is None:
            raise RuntimeError("ContinuousEngine.finished: call sync_weights(params) first")
        t0 = time.perf_counter()
        if self.decoder.busy():
            groups = self.decoder.step(self._params)
            if groups:
                self._scoring.append(self._pool.submit(self._score, groups))
        elif self._scoring:
            futures.wait([self._scoring[0]])
        ready = []
        while self._scoring and self._scoring[0].done():
            ready.extend(self._pack(*self._scoring.popleft().result()))
        self._rollout_s += time.perf_counter() - t0
        if ready:
            ready[0].scores.seconds["rollout"] = self._rollout_s
            self._rollout_s = 0.0
        self._in_flight -= sum(len(r.problems) for r in ready)
        return ready

    def release(self) -> None:
        """Frees the slots; work still in flight (only after an error) is abandoned."""
        for f in self._scoring:
            f.cancel()
        futures.wait(self._scoring)  # the scorer is free again before anyone else uses it
        self._scoring.clear()
        self._in_flight = 0
        self.decoder.clear()

    def _score(self, groups: list[FinishedGroup]):
        """(groups, correct, rewards [F, G], verifier counts, seconds): the scoring thread."""
        t0 = time.perf_counter()
        tok = self.encoder.tokenizer
        texts = [tok.decode(row[:n]) for gr in groups for row, n in zip(gr.tokens, gr.lengths)]
        refs = [gr.tag.answer for gr in groups for _ in range(self.group_size)]
        result = self.scorer.score_batch(texts, refs)
        shape = (len(groups), self.group_size)
        correct = np.asarray(result.correct, np.float32).reshape(shape)
        rewards = np.asarray(result.rewards, np.float32).reshape(shape)
        stats = {k: int(v) for k, v in result.stats.items()}
        return groups, correct, rewards, stats, time.perf_counter() - t0

    def _pack(self, groups, correct, rewards, stats, seconds) -> list[ScoredGroups]:
        """Batches of `return_size` groups (the last padded with copies, marked invalid)."""
        out, u = [], self.return_size
        for start in range(0, len(groups), u):
            real = min(u, len(groups) - start)
            idx = list(range(start, start + real)) + [start] * (u - real)
            batch = self._batch([groups[i] for i in idx], correct[idx], rewards[idx])
            first = start == 0  # the call's verifier counts and time go with its first batch
            scores = GroupScores(
                correct=correct[start : start + real],
                rewards=rewards[start : start + real],
                lengths=np.stack([gr.lengths for gr in groups[start : start + real]]),
                truncated=np.stack([gr.truncated for gr in groups[start : start + real]]),
                stats=stats if first else {},
                seconds={"rollout": 0.0, "scoring": seconds if first else 0.0},
            )
            problems = [gr.tag for gr in groups[start : start + real]]
            out.append(ScoredGroups(batch, scores, problems, np.arange(u) < real))
        return out

    def _batch(self, chunk: list[FinishedGroup], correct, rewards) -> GroupBatch:
        """The device batch of finished groups (split over the mesh's batch axes)."""
        problems = [gr.tag for gr in chunk]
        ptok, pmask = self.encoder.pad(problems, self.prompt_len)

        def stack(name):
            return np.stack([getattr(gr, name) for gr in chunk])

        batch = GroupBatch(
            prompt_tokens=ptok,
            prompt_mask=pmask,
            tokens=stack("tokens"),
            response_mask=stack("mask"),
            logp_old=stack("logp"),
            rewards=rewards,
            correct=correct,
            lengths=stack("lengths"),
            truncated=stack("truncated"),
            prompt_index=np.asarray([self.index_of.get(p.id, -1) for p in problems], np.int32),
            logp_sample=stack("sample_logp"),
            history=None,
        )
        return shard_batch(batch, self.mesh) if self.mesh is not None else jax.device_put(batch)
