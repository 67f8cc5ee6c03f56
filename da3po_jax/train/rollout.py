"""Rollout and dynamic sampling: prompts -> samples -> rewards -> a full batch of groups.

Host side (clearly separate from the jitted math): tokenising prompts into length buckets,
detokenising responses, scoring them in the reward worker pool, and the loop over
generation rounds. Device side: the sampler and the fixed-shape dynamic-sampling buffer
(`ds_add_round`), whose keep mask is computed in `jnp`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from da3po_jax.data import MathProblem
from da3po_jax.models.tokenizer import Tokenizer
from da3po_jax.rewards import RewardScorer
from da3po_jax.rl import (
    DSBuffer,
    ds_add_round,
    ds_empty_buffer,
    ds_keep_mask,
    group_accuracy,
    soft_overlong_punishment,
)
from da3po_jax.sampling import GenerateConfig, Sampler
from da3po_jax.sampling.host import decode_responses, pick_bucket
from da3po_jax.train.rl_step import GroupBatch

log = logging.getLogger(__name__)


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

    def pad(self, problems: Sequence[MathProblem], length: int | None = None):
        """(tokens, mask) [P, bucket] for `problems`; `length` forces the padded length."""
        ids = [self.ids(p) for p in problems]
        if length is None:
            length = pick_bucket(max(len(i) for i in ids), self.buckets)
        return self.tokenizer.pad_left(ids, length)


@dataclasses.dataclass
class RoundResult:
    """One generation round: the groups on device and host-side facts about them."""

    items: GroupBatch
    correct: np.ndarray  # [P, G]
    rewards: np.ndarray  # [P, G]
    lengths: np.ndarray  # [P, G]
    truncated: np.ndarray  # [P, G]
    problems: list[MathProblem]
    score_stats: dict[str, int]
    seconds: dict[str, float]


class Rollout:
    """Samples G responses per prompt, scores them and packs them as `GroupBatch` groups.

    Args:
      sampler: the policy's `Sampler`.
      encoder: prompt tokenisation.
      scorer: reward worker pool.
      gen: sampling settings (num_samples = G).
      train_prompt_len: the fixed prompt length of training batches (every round's
        prompts are re-padded to it so groups of different buckets share one buffer).
      index_of: dataset index of a problem id (for the history estimator).
    """

    def __init__(
        self,
        sampler: Sampler,
        encoder: PromptEncoder,
        scorer: RewardScorer,
        gen: GenerateConfig,
        train_prompt_len: int,
        index_of: dict[str, int],
    ):
        self.sampler = sampler
        self.encoder = encoder
        self.scorer = scorer
        self.gen = gen
        self.train_prompt_len = train_prompt_len
        self.index_of = index_of

    def decode(self, tokens: np.ndarray, lengths: np.ndarray) -> list[str]:
        tok = self.encoder.tokenizer
        return [
            tok.decode(row[:n])
            for row, n in zip(tokens.reshape(-1, tokens.shape[-1]), lengths.reshape(-1))
        ]

    def sample_and_score(self, params, problems, rng, gen: GenerateConfig | None = None):
        """(SampleOutput as NumPy, correct [P, G], rewards [P, G], stats, seconds)."""
        gen = gen or self.gen
        t0 = time.perf_counter()
        tokens, mask = self.encoder.pad(problems)
        out = self.sampler.generate(params, jnp.asarray(tokens), jnp.asarray(mask), rng, gen)
        out = jax.device_get(out)
        t1 = time.perf_counter()
        g = gen.num_samples
        refs = [p.answer for p in problems for _ in range(g)]
        texts = decode_responses(self.encoder.tokenizer, out.tokens, out.lengths)
        scores = self.scorer.score_batch([t for group in texts for t in group], refs)
        shape = (len(problems), g)
        correct = np.asarray(scores.correct, np.float32).reshape(shape)
        rewards = np.asarray(scores.rewards, np.float32).reshape(shape)
        seconds = {"rollout": t1 - t0, "scoring": time.perf_counter() - t1}
        return out, correct, rewards, scores.stats, seconds

    def round(self, params, problems: Sequence[MathProblem], rng) -> RoundResult:
        out, correct, rewards, stats, seconds = self.sample_and_score(params, problems, rng)
        ptok, pmask = self.encoder.pad(problems, self.train_prompt_len)
        items = GroupBatch(
            prompt_tokens=jnp.asarray(ptok),
            prompt_mask=jnp.asarray(pmask),
            tokens=jnp.asarray(out.tokens),
            response_mask=jnp.asarray(out.mask),
            logp_old=jnp.asarray(out.logp),
            rewards=jnp.asarray(rewards),
            correct=jnp.asarray(correct),
            lengths=jnp.asarray(out.lengths),
            truncated=jnp.asarray(out.truncated),
            prompt_index=jnp.asarray([self.index_of.get(p.id, -1) for p in problems], jnp.int32),
        )
        return RoundResult(
            items,
            correct,
            rewards,
            np.asarray(out.lengths),
            np.asarray(out.truncated),
            list(problems),
            stats,
            seconds,
        )


def ds_round_update(
    buffer: DSBuffer,
    items: GroupBatch,
    enable: bool,
    metric: str,
    group_size: int,
    max_len: int,
    overlong_buffer: int,
    penalty: float,
):
    """Adds a round's groups to the buffer (jit with the non-array arguments static).

    The keep mask is DAPO's (non-zero variance of the metric within the group), computed
    on the shaped reward R + R_len when `metric == "reward"`; with dynamic sampling off
    every group is kept. Returns (buffer, surplus, keep [N], group accuracy [N]).
    """
    n = items.tokens.shape[0]
    correct = items.correct.reshape(-1)
    rewards = items.rewards
    if overlong_buffer > 0:
        rewards = rewards + soft_overlong_punishment(
            items.lengths, max_len, overlong_buffer, penalty
        )
    if enable:
        keep = ds_keep_mask(correct, rewards.reshape(-1), group_size, metric=metric)
    else:
        keep = jnp.ones((n,), jnp.bool_)
    buffer, surplus = ds_add_round(buffer, items, keep)
    mu, _, _ = group_accuracy(correct, group_size)
    return buffer, surplus, keep, mu


@dataclasses.dataclass
class StepBatch:
    """What the generation rounds of one step produced for the update."""

    buffer: DSBuffer
    surplus: DSBuffer
    rounds: int
    group_acc: np.ndarray  # [max_rounds * N] accuracies of every generated group
    group_acc_valid: np.ndarray  # [max_rounds * N]
    stats: dict[str, Any]


def empty_buffer(items_like: GroupBatch, capacity: int) -> DSBuffer:
    return ds_empty_buffer(items_like, capacity)


def abstract_round(rollout: Rollout, num_prompts: int) -> GroupBatch:
    """Zero-filled `GroupBatch` with one round's shapes (to build empty buffers)."""
    g, n, tp = rollout.gen.num_samples, rollout.gen.max_new_tokens, rollout.train_prompt_len
    z = lambda *s, dt=jnp.float32: jnp.zeros(s, dt)
    return GroupBatch(
        prompt_tokens=z(num_prompts, tp, dt=jnp.int32),
        prompt_mask=z(num_prompts, tp, dt=bool),
        tokens=z(num_prompts, g, n, dt=jnp.int32),
        response_mask=z(num_prompts, g, n, dt=bool),
        logp_old=z(num_prompts, g, n),
        rewards=z(num_prompts, g),
        correct=z(num_prompts, g),
        lengths=z(num_prompts, g, dt=jnp.int32),
        truncated=z(num_prompts, g, dt=bool),
        prompt_index=z(num_prompts, dt=jnp.int32),
    )
