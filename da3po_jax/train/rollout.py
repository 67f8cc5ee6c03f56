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
from da3po_jax.rl import (
    DSBuffer,
    PromptHistory,
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

    def bucket(self, problems: Sequence[MathProblem]) -> int:
        """The padded length (smallest bucket) that fits every prompt of `problems`."""
        return pick_bucket(max(len(self.ids(p)) for p in problems), self.buckets)

    def pad(self, problems: Sequence[MathProblem], length: int | None = None):
        """(tokens, mask) [P, bucket] for `problems`; `length` forces the padded length."""
        ids = [self.ids(p) for p in problems]
        return self.tokenizer.pad_left(ids, length or self.bucket(problems))


@dataclasses.dataclass
class HostSamples:
    """Host-side facts about sampled groups; [P, G] arrays cover all P prompts (gathered
    from every host), `local_*` only this host's rows."""

    correct: np.ndarray
    rewards: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray
    stats: dict[str, int]
    seconds: dict[str, float]
    local_correct: np.ndarray
    local_rewards: np.ndarray


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
      mesh: the device mesh; prompts and samples are split over its batch axes and each
        host decodes and scores its own rows. None: one device, no sharding.
    """

    def __init__(
        self,
        sampler: Sampler,
        encoder: PromptEncoder,
        scorer: RewardScorer,
        gen: GenerateConfig,
        train_prompt_len: int,
        index_of: dict[str, int],
        mesh: Mesh | None = None,
    ):
        self.mesh = mesh
        self.sampler = sampler
        self.encoder = encoder
        self.scorer = scorer
        self.gen = gen
        self.train_prompt_len = train_prompt_len
        self.index_of = index_of

    def sample_and_score(self, params, problems, rng, gen: GenerateConfig | None = None):
        """Samples G responses for each of `problems` (the global list, the same on every
        host) and scores this host's share of them.

        Returns:
          (out, host): `out` is the `SampleOutput` as (global) device arrays; `host` the
          `HostSamples` of all problems, identical on every host.
        """
        gen = gen or self.gen
        mesh, n, g = self.mesh, len(problems), gen.num_samples
        t0 = time.perf_counter()
        rows = host_rows(mesh, n)
        tokens, mask = self.encoder.pad(problems[rows], self.encoder.bucket(problems))
        tokens, mask = global_batch((tokens, mask), mesh, n)
        out = self.sampler.generate(params, tokens, mask, rng, gen)
        all_lengths = to_host(out.lengths)  # small: every host keeps all of them
        resp, lengths = local_rows(out.tokens, mesh), all_lengths[rows]
        t1 = time.perf_counter()
        refs = [p.answer for p in problems[rows] for _ in range(g)]
        texts = decode_responses(self.encoder.tokenizer, resp, lengths)
        scores = self.scorer.score_batch([t for group in texts for t in group], refs)
        shape = (len(refs) // g, g)
        correct = np.asarray(scores.correct, np.float32).reshape(shape)
        rewards = np.asarray(scores.rewards, np.float32).reshape(shape)
        stats = {k: int(v) for k, v in scores.stats.items()}
        if jax.process_count() > 1:
            keys = sorted(stats)
            totals = sum_over_hosts(np.asarray([stats.get(k, 0) for k in keys]))
            stats = dict(zip(keys, totals.tolist()))
        host = HostSamples(
            correct=gather_host_rows(correct, mesh, n),
            rewards=gather_host_rows(rewards, mesh, n),
            lengths=all_lengths,
            truncated=to_host(out.truncated),
            stats=stats,
            seconds={"rollout": t1 - t0, "scoring": time.perf_counter() - t1},
            local_correct=correct,
            local_rewards=rewards,
        )
        return out, host

    def round(self, params, problems: Sequence[MathProblem], rng) -> RoundResult:
        out, host = self.sample_and_score(params, problems, rng)
        mesh, n = self.mesh, len(problems)
        rows = host_rows(mesh, n)
        ptok, pmask = self.encoder.pad(problems[rows], self.train_prompt_len)
        index = np.asarray([self.index_of.get(p.id, -1) for p in problems[rows]], np.int32)
        prompt_tokens, prompt_mask, rewards, correct, prompt_index = global_batch(
            (ptok, pmask, host.local_rewards, host.local_correct, index), mesh, n
        )
        items = GroupBatch(
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
            history=_no_history(n),  # the trainer fills in what its table knows
        )
        return RoundResult(
            items,
            host.correct,
            host.rewards,
            host.lengths,
            host.truncated,
            list(problems),
            host.stats,
            host.seconds,
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
        logp_sample=z(num_prompts, g, n),
        history=_no_history(num_prompts),
    )


def _no_history(num_prompts: int) -> PromptHistory:
    return PromptHistory(jnp.zeros(num_prompts), jnp.zeros(num_prompts))
