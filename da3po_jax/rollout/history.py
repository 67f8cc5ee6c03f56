"""The per-prompt history table of the `history` DAA estimator, updated on the host after
each step with every generated group's verdicts (docs/algorithms.md, `history`)."""

from __future__ import annotations

import numpy as np

from da3po_jax.rl import PromptHistory, update_history


def add_to_history(
    table: PromptHistory, idx: np.ndarray, correct: np.ndarray, g: int, decay: float
) -> PromptHistory:
    """The history table (host arrays) after the groups `idx` [M] (dataset indices, -1 =
    not in the table) with verdicts `correct` [M, G], applied in order (`update_history`
    each).

    A prompt drawn twice in one step (an epoch boundary) gets both updates, one after
    the other: s <- decay (decay s + k1) + k2. A plain scatter would keep only one.
    """
    success, failure = (np.array(x, np.float32) for x in table)
    rank = _occurrence_rank(idx)
    for r in range(int(rank.max(initial=-1)) + 1):
        sel = (rank == r) & (idx >= 0)  # each prompt at most once per pass
        rows = idx[sel]
        new = update_history(PromptHistory(success[rows], failure[rows]), correct[sel], g, decay)
        success[rows] = np.asarray(new.success)
        failure[rows] = np.asarray(new.failure)
    return PromptHistory(success, failure)


def _occurrence_rank(idx: np.ndarray) -> np.ndarray:
    """rank[j] = number of earlier entries equal to idx[j] (0 for a first occurrence)."""
    order = np.argsort(idx, kind="stable")
    sorted_idx = idx[order]
    start = np.r_[True, sorted_idx[1:] != sorted_idx[:-1]]
    first = np.maximum.accumulate(np.where(start, np.arange(idx.size), 0))
    rank = np.empty(idx.size, np.int64)
    rank[order] = np.arange(idx.size) - first
    return rank
