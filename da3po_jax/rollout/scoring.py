"""Responses -> verdicts: the one decode -> score path of every rollout engine.

The static engine scores this host's rows of a sampler call, the continuous engine the
groups that just finished (in its scoring thread); both decode each response up to its
length and verify it against its prompt's reference answer in the reward worker pool.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from da3po_jax.models.tokenizer import Tokenizer
from da3po_jax.rewards import RewardScorer
from da3po_jax.sampling.host import decode_responses


@dataclasses.dataclass
class Verdicts:
    """The verifier's output for P prompts x G responses (host arrays).

    Attributes:
      correct: [P, G] float32 verdicts c in {0, 1}.
      rewards: [P, G] float32 rewards (before overlong shaping).
      stats: verifier status counts (ok, timeout, error, no_answer, ...).
    """

    correct: np.ndarray
    rewards: np.ndarray
    stats: dict[str, int]


def score_responses(
    tokenizer: Tokenizer,
    scorer: RewardScorer,
    tokens: np.ndarray,
    lengths: np.ndarray,
    answers: Sequence[str],
) -> Verdicts:
    """Decodes responses `tokens` [P, G, N] up to `lengths` [P, G] and scores each
    against its prompt's reference answer (`answers`, P of them)."""
    g = tokens.shape[1]
    texts = [t for group in decode_responses(tokenizer, tokens, lengths) for t in group]
    result = scorer.score_batch(texts, [a for a in answers for _ in range(g)])
    shape = (len(answers), g)
    return Verdicts(
        correct=np.asarray(result.correct, np.float32).reshape(shape),
        rewards=np.asarray(result.rewards, np.float32).reshape(shape),
        stats={k: int(v) for k, v in result.stats.items()},
    )
