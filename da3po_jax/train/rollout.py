"""Prompts -> samples -> rewards: the host side of generation.

`PromptEncoder` tokenises prompts once and pads them into length buckets;
`sample_and_score` runs the sampler on a list of problems and scores this host's rows in
the reward worker pool. Rollout engines (`train/engine.py`) and evaluation build on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from da3po_jax.data import MathProblem
from da3po_jax.models.tokenizer import Tokenizer
from da3po_jax.parallel import (
    gather_host_rows,
    global_batch,
    host_rows,
    local_rows,
    sum_over_hosts,
    to_host,
)
from da3po_jax.rewards import RewardScorer
from da3po_jax.sampling import GenerateConfig, SampleOutput, Sampler
from da3po_jax.sampling.host import decode_responses, pick_bucket
from da3po_jax.train.batch import GroupScores


class PromptEncoder:
    """Renders and tokenises prompts once per problem id, and pads them into buckets."""

    def __init__(
        self, tokenizer: Tokenizer, render: Callable[[MathProblem], str], buckets: Sequence[int]
    ):
        self.tokenizer = tokenizer
        self.render = render
        self.buckets = tuple(sorted(buckets))
        self._ids: dict[str, list[int]] = {}

    def ids(self, problem: MathProblem) -> list[int]:
        if problem.id not in self._ids:
            self._ids[problem.id] = self.tokenizer.encode([self.render(problem)])[0]
        return self._ids[problem.id]

    def bucket(self, problems: Sequence[MathProblem]) -> int:
        """The padded length (smallest bucket) that fits every prompt of `problems`."""
        return pick_bucket(max(len(self.ids(p)) for p in problems), self.buckets)

    def pad(self, problems: Sequence[MathProblem], length: int | None = None):
        """(tokens, mask) [P, bucket] for `problems`; `length` forces the padded length."""
        ids = [self.ids(p) for p in problems]
        return self.tokenizer.pad_left(ids, length or self.bucket(problems))


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
    """`sample_and_score`, plus this host's rows of (correct, rewards) [P_local, G]."""
    n, g = len(problems), gen.num_samples
    t0 = time.perf_counter()
    rows = host_rows(mesh, n)
    tokens, mask = encoder.pad(problems[rows], encoder.bucket(problems))
    tokens, mask = global_batch((tokens, mask), mesh, n)
    out = sampler.generate(params, tokens, mask, rng, gen)
    all_lengths = to_host(out.lengths)  # small: every host keeps all of them
    resp, lengths = local_rows(out.tokens, mesh), all_lengths[rows]
    t1 = time.perf_counter()
    refs = [p.answer for p in problems[rows] for _ in range(g)]
    texts = decode_responses(encoder.tokenizer, resp, lengths)
    result = scorer.score_batch([t for group in texts for t in group], refs)
    shape = (len(refs) // g, g)
    correct = np.asarray(result.correct, np.float32).reshape(shape)
    rewards = np.asarray(result.rewards, np.float32).reshape(shape)
    stats = {k: int(v) for k, v in result.stats.items()}
    if jax.process_count() > 1:
        keys = sorted(stats)
        totals = sum_over_hosts(np.asarray([stats.get(k, 0) for k in keys]))
        stats = dict(zip(keys, totals.tolist()))
    scores = GroupScores(
        correct=gather_host_rows(correct, mesh, n),
        rewards=gather_host_rows(rewards, mesh, n),
        lengths=all_lengths,
        truncated=to_host(out.truncated),
        stats=stats,
        seconds={"rollout": t1 - t0, "scoring": time.perf_counter() - t1},
    )
    return out, scores, (correct, rewards)
