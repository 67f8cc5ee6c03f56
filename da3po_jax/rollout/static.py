"""The static-batch rollout engine: each admitted round is one `Sampler` call.

Every prompt of a round is prefilled once and its G rows decode until the longest stops;
this host's rows are decoded to text and scored in the reward worker pool
(`rollout/scoring.py`), and the round comes back whole as one `GroupBatch`. Simple and
exact: the reference the continuous engine (the default) is tested against.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from da3po_jax.data import MathProblem
from da3po_jax.parallel import (
    gather_host_rows,
    global_batch,
    host_rows,
    local_rows,
    sum_counts_over_hosts,
    to_host,
)
from da3po_jax.rewards import RewardScorer
from da3po_jax.rollout.batch import GroupBatch, GroupScores, ScoredGroups
from da3po_jax.rollout.encoder import PromptEncoder
from da3po_jax.rollout.protocol import EngineParts
from da3po_jax.rollout.scoring import score_responses
from da3po_jax.sampling import GenerateConfig, SampleOutput, Sampler


class StaticEngine:
    """The static-batch engine (see the module docstring). A round of fewer than
    `round_size` prompts is padded with copies of its first prompt (invalid rows), so
    every call has one shape.

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

    uses_slots = False
    max_staleness = 0  # every round comes back whole within its step

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
        self.return_size = self.return_size_for(round_size, 0, self.group_size)
        self._params = None
        self._queue: collections.deque = collections.deque()

    @classmethod
    def from_parts(cls, parts: EngineParts) -> StaticEngine:
        """An engine with its own `Sampler` (its cache freed by `release`)."""
        return cls(
            Sampler(parts.graphdef, parts.model_config, parts.gen),
            parts.encoder,
            parts.scorer,
            parts.gen,
            parts.prompt_len,
            parts.index_of,
            parts.mesh,
            round_size=parts.round_size,
        )

    @staticmethod
    def max_in_flight_for(round_size: int, slots: int, group_size: int) -> int:
        """One round."""
        return round_size

    @staticmethod
    def return_size_for(round_size: int, slots: int, group_size: int) -> int:
        """One round per returned batch."""
        return round_size

    def sync_weights(self, params, version: int = 0) -> None:
        self._params = params

    def capacity(self) -> int:
        return 0 if self._queue else self.round_size

    def admit(self, problems: Sequence[MathProblem], keys: jax.Array) -> None:
        if not 0 < len(problems) <= self.round_size:
            raise ValueError(f"{len(problems)} prompts for a round of {self.round_size}")
        self._queue.append((list(problems), keys))

    def in_flight(self) -> int:
        return sum(len(p) for p, _ in self._queue)

    def overdue(self, version: int) -> int:
        return self.in_flight()

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

    def tokens_generated(self) -> None:
        """None: each step returns all it generated (its rounds come back whole), so the
        returned groups' lengths are the count (`RolloutEngine.tokens_generated`)."""
        return None

    # ------------------------------------------------------------- checkpoints
    # Nothing outlives a step (max_staleness 0): the collector never asks for a snapshot,
    # and a checkpoint of this engine has no `engine` entry.
    def snapshot(self) -> tuple[dict, dict]:
        """Nothing is carried into the next step: an empty snapshot."""
        return {}, {}

    def snapshot_shapes(self, meta: dict) -> dict:
        """The empty snapshot's (no) arrays; a checkpoint of work in flight (written by
        an engine with `max_staleness > 0`) is refused."""
        _refuse_work(meta)
        return {}

    def restore(self, arrays: dict, meta: dict) -> None:
        """Puts the empty snapshot back (nothing to do; work in flight is refused)."""
        _refuse_work(meta)

    def _generate(self, problems: list[MathProblem], keys: jax.Array, real: int) -> ScoredGroups:
        out, scores, verdicts = _sample_and_score(
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
            (ptok, pmask, verdicts.rewards, verdicts.correct, index), self.mesh, n
        )
        batch = GroupBatch.from_samples(
            prompt_tokens, prompt_mask, out, rewards, correct, prompt_index
        )
        if real < n:
            scores = scores.head(real)
        return ScoredGroups(batch, scores, problems[:real], np.arange(n) < real)


def _refuse_work(meta: dict) -> None:
    """ValueError for a snapshot that is not the static engine's (empty) one."""
    if meta:
        raise ValueError(
            "the checkpoint holds rollout work in flight (written with rollout.max_staleness "
            "> 0), which the static engine cannot take over"
        )


def sample_and_score(
    sampler: Sampler,
    params,
    problems: Sequence[MathProblem],
    rng: jax.Array,
    *,
    encoder: PromptEncoder,
    scorer: RewardScorer,
    gen: GenerateConfig,
    mesh: Mesh | None = None,
) -> tuple[SampleOutput, GroupScores]:
    """Samples `gen.num_samples` responses for each of `problems` (the global list, the
    same on every host) and scores this host's share of them.

    Returns:
      (out, scores): `out` is the `SampleOutput` as (global) device arrays; `scores` the
      `GroupScores` of all problems, identical on every host.
    """
    out, scores, _ = _sample_and_score(sampler, params, problems, rng, encoder, scorer, gen, mesh)
    return out, scores


def _sample_and_score(sampler, params, problems, rng, encoder, scorer, gen, mesh):
    """`sample_and_score`, plus the `Verdicts` of this host's rows [P_local, G]."""
    n = len(problems)
    t0 = time.perf_counter()
    rows = host_rows(mesh, n)
    tokens, mask = encoder.pad(problems[rows], encoder.bucket(problems))
    tokens, mask = global_batch((tokens, mask), mesh, n)
    out = sampler.generate(params, tokens, mask, rng, gen)
    all_lengths = to_host(out.lengths)  # small: every host keeps all of them
    resp, lengths = local_rows(out.tokens, mesh), all_lengths[rows]
    t1 = time.perf_counter()
    answers = [p.answer for p in problems[rows]]
    verdicts = score_responses(encoder.tokenizer, scorer, resp, lengths, answers)
    scores = GroupScores(
        correct=gather_host_rows(verdicts.correct, mesh, n),
        rewards=gather_host_rows(verdicts.rewards, mesh, n),
        lengths=all_lengths,
        truncated=to_host(out.truncated),
        stats=sum_counts_over_hosts(verdicts.stats),
        seconds={"rollout": t1 - t0, "scoring": time.perf_counter() - t1},
    )
    return out, scores, verdicts
