"""Rollout engines: what the RL loop needs from any generator of scored groups.

The collector (`train/collector.py`) talks to an engine through five calls and never
looks inside it:

- `sync_weights(params)`: the policy parameters for the generations that follow;
- `capacity()`: how many more prompts it takes now (0 while it is busy);
- `admit(problems, rng)`: queues prompts (G samples each, drawn with keys from `rng`);
- `finished()`: blocks until some admitted groups are done and returns them, generated
  and scored, as `ScoredGroups` (an empty list when nothing is pending);
- `release()`: frees generation memory (KV caches) before the update.

A static engine (`StaticEngine`, below) runs each admitted round as one sampler call and
returns it whole. A streaming engine may instead keep generating while it returns groups
as they finish, and report free capacity between calls: the collector admits more prompts
whenever `capacity()` allows, so it works unchanged. Batches should come back in a few
fixed sizes (the dynamic-sampling update compiles once per size).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import jax
import numpy as np
from jax.sharding import Mesh

from da3po_jax.data import MathProblem
from da3po_jax.parallel import global_batch, host_rows
from da3po_jax.rewards import RewardScorer
from da3po_jax.sampling import GenerateConfig, Sampler
from da3po_jax.train.batch import GroupBatch, ScoredGroups
from da3po_jax.train.rollout import PromptEncoder, _sample_and_score


@runtime_checkable
class RolloutEngine(Protocol):
    """A generator of scored groups (see the module docstring for the contract)."""

    group_size: int
    prompt_len: int  # the padded prompt length of the groups it returns
    max_new_tokens: int

    def sync_weights(self, params) -> None: ...

    def capacity(self) -> int: ...

    def admit(self, problems: Sequence[MathProblem], rng: jax.Array) -> None: ...

    def finished(self) -> list[ScoredGroups]: ...

    def release(self) -> None: ...


class StaticEngine:
    """The static-batch engine: each admitted round is one `Sampler` call (every prompt
    prefilled once, its G rows decoded until the longest stops), scored in the reward
    worker pool and packed as a `GroupBatch`.

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
      round_size: prompts taken per admission (the round size of dynamic sampling).
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
        self.max_new_tokens = gen.max_new_tokens
        self._params = None
        self._queue: collections.deque = collections.deque()

    def sync_weights(self, params) -> None:
        self._params = params

    def capacity(self) -> int:
        return 0 if self._queue else self.round_size

    def admit(self, problems: Sequence[MathProblem], rng: jax.Array) -> None:
        self._queue.append((list(problems), rng))

    def finished(self) -> list[ScoredGroups]:
        if not self._queue:
            return []
        if self._params is None:
            raise RuntimeError("StaticEngine.finished: call sync_weights(params) first")
        problems, rng = self._queue.popleft()
        return [self._generate(problems, rng)]

    def release(self) -> None:
        self.sampler.clear()

    def _generate(self, problems: list[MathProblem], rng: jax.Array) -> ScoredGroups:
        out, scores, (correct, rewards) = _sample_and_score(
            self.sampler,
            self._params,
            problems,
            rng,
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
        return ScoredGroups(batch, scores, problems)
