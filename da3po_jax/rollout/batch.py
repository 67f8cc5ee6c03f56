"""The record that crosses every seam of an RL step, defined once: the batch of groups
the update trains on (`GroupBatch`, also the item type of the dynamic-sampling buffer;
built by `GroupBatch.from_samples` from a sampler's output and its scores) and what a
rollout engine hands back for a set of prompts (`ScoredGroups`: that batch plus the same
groups' host-side facts, `GroupScores`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from da3po_jax.data import MathProblem
from da3po_jax.rl import PromptHistory


@struct.dataclass
class GroupBatch:
    """Sampled groups, leading axis N groups (a dynamic-sampling buffer's items).

    Attributes:
      prompt_tokens: [N, Tp] int32, left-padded prompts.
      prompt_mask: [N, Tp] bool.
      tokens: [N, G, Tn] int32 responses.
      response_mask: [N, G, Tn] bool, 1 on response tokens up to and including EOS.
      logp_old: [N, G, Tn] float32 sampler log-probs of the trained policy (at
        `loss.temperature`).
      rewards: [N, G] float32 verifier rewards (overlong shaping is applied in the step).
      correct: [N, G] float32 verifier verdicts c in {0, 1}.
      lengths: [N, G] int32 response lengths.
      truncated: [N, G] bool, hit the length cap without EOS.
      prompt_index: [N] int32 dataset index of the prompt (history estimator, metrics).
      logp_sample: [N, G, Tn] float32 log mu(token) under the sampling distribution
        (temperature, top-k, top-p): the behaviour policy of truncated importance
        sampling. None when the caller has no sampler output (TIS then unavailable).
      history: the prompt's decayed success / failure counts ([N] each) as known when the
        group was *generated* (history estimator), so a group carried over in the
        dynamic-sampling surplus never sees its own counts. None: not tracked.
      version: [N, G, Tn] int32 policy version (optimizer steps of the weights) that
        sampled each token; only with partial rollouts (`rollout.max_staleness > 0`),
        None otherwise.
    """

    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    tokens: jax.Array
    response_mask: jax.Array
    logp_old: jax.Array
    rewards: jax.Array
    correct: jax.Array
    lengths: jax.Array
    truncated: jax.Array
    prompt_index: jax.Array
    logp_sample: jax.Array | None = None
    history: PromptHistory | None = None
    version: jax.Array | None = None

    @classmethod
    def zeros(
        cls,
        num_groups: int,
        group_size: int,
        prompt_len: int,
        max_new_tokens: int,
        *,
        versions: bool = False,
    ) -> GroupBatch:
        """A zero-filled batch of these shapes, every field present (the shapes a rollout
        engine produces; `version` only with `versions`, partial rollouts): the template
        of empty dynamic-sampling buffers and of the memory planner's count."""
        n, g, tp, tn = num_groups, group_size, prompt_len, max_new_tokens
        z = lambda *s, dt=jnp.float32: jnp.zeros(s, dt)  # noqa: E731
        return cls(
            prompt_tokens=z(n, tp, dt=jnp.int32),
            prompt_mask=z(n, tp, dt=bool),
            tokens=z(n, g, tn, dt=jnp.int32),
            response_mask=z(n, g, tn, dt=bool),
            logp_old=z(n, g, tn),
            rewards=z(n, g),
            correct=z(n, g),
            lengths=z(n, g, dt=jnp.int32),
            truncated=z(n, g, dt=bool),
            prompt_index=z(n, dt=jnp.int32),
            logp_sample=z(n, g, tn),
            history=PromptHistory(z(n), z(n)),
            version=z(n, g, tn, dt=jnp.int32) if versions else None,
        )

    @classmethod
    def from_samples(
        cls,
        prompt_tokens,
        prompt_mask,
        samples,
        rewards,
        correct,
        prompt_index,
    ) -> GroupBatch:
        """The batch of N groups from their prompts ([N, Tp]), their samples (a
        `sampling.SampleOutput`, or anything with its `tokens`, `mask`, `logp`,
        `sample_logp` [N, G, Tn] and `lengths`, `truncated` [N, G]), the verifier's
        `rewards` and `correct` [N, G] and the prompts' dataset indices [N] (-1: not a
        training prompt). The arrays are taken as they are (host or device); `history`
        is left for the collector, which knows the table."""
        return cls(
            prompt_tokens=prompt_tokens,
            prompt_mask=prompt_mask,
            tokens=samples.tokens,
            response_mask=samples.mask,
            logp_old=samples.logp,
            rewards=rewards,
            correct=correct,
            lengths=samples.lengths,
            truncated=samples.truncated,
            prompt_index=prompt_index,
            logp_sample=samples.sample_logp,
            history=None,
        )

    @property
    def num_groups(self) -> int:
        return self.tokens.shape[0]


@dataclasses.dataclass
class GroupScores:
    """Host-side facts about sampled groups; [P, G] arrays over all P prompts (gathered
    from every host, identical on each)."""

    correct: np.ndarray
    rewards: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray
    stats: dict[str, int]  # verifier status counts (ok, timeout, error, no_answer, ...)
    seconds: dict[str, float]  # {"rollout": ..., "scoring": ...}

    def head(self, n: int) -> GroupScores:
        """The first `n` prompts' facts (an engine's padding dropped). The verifier counts
        stay those of every scored row."""
        return dataclasses.replace(
            self,
            correct=self.correct[:n],
            rewards=self.rewards[:n],
            lengths=self.lengths[:n],
            truncated=self.truncated[:n],
        )


@dataclasses.dataclass
class ScoredGroups:
    """Finished, scored groups as a rollout engine returns them: the batch on device (its
    `history` left empty for the collector to fill) and the same groups' host facts.

    An engine that returns batches of one fixed size pads them: `valid` [N] (host bool)
    marks the real rows, which come first; `scores` and `problems` cover those only."""

    batch: GroupBatch
    scores: GroupScores
    problems: list[MathProblem]
    valid: np.ndarray | None = None

    def __post_init__(self):
        if self.valid is None:
            self.valid = np.ones(self.batch.num_groups, bool)
        self.valid = np.asarray(self.valid, bool)
