"""Host-side sums over the groups judged in one step (those the engine returned in it,
whatever step admitted them): the collect stage's metrics (rewards, accuracy, lengths,
dynamic-sampling fractions, verifier failures, times) and the group accuracies the DAA
prior's moment EMA reads."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from da3po_jax.rollout.batch import ScoredGroups


class RoundStats:
    """Host-side sums over the groups judged in one step; `max_groups` is the size of the
    fixed-shape accuracy array the prior update reads: the most groups a step can judge
    (`Collector.judged_max`, the groups carried in flight from earlier steps included), so
    it compiles once. Should a step judge more, the array grows (the prior update then
    compiles for the new size) rather than lose an accuracy the prior's EMA must see."""

    def __init__(self, max_groups: int):
        self.scores, self.kept, self.dropped = [], [], 0
        self.acc = np.zeros(max_groups, np.float32)
        self.acc_valid = np.zeros(max_groups, np.bool_)
        self._filled = 0

    def add(self, groups: ScoredGroups, keep: np.ndarray, mu: np.ndarray, dropped) -> None:
        """One engine return: `keep` and `mu` [N] over its rows, padding included."""
        keep, mu = keep[groups.valid], mu[groups.valid]
        self.scores.append(groups.scores)
        self.dropped += dropped
        self.kept.append(keep)
        end = self._filled + mu.size
        if end > self.acc.size:
            more = end - self.acc.size
            self.acc = np.concatenate([self.acc, np.zeros(more, np.float32)])
            self.acc_valid = np.concatenate([self.acc_valid, np.zeros(more, np.bool_)])
        self.acc[self._filled : end], self.acc_valid[self._filled : end] = mu, True
        self._filled = end

    def group_accuracies(self) -> tuple[jax.Array, jax.Array]:
        return jnp.asarray(self.acc), jnp.asarray(self.acc_valid)

    def summary(self, admitted: int, count: int, capacity: int, surplus: int) -> dict[str, float]:
        seconds = {k: sum(s.seconds[k] for s in self.scores) for k in ("rollout", "scoring")}
        m: dict[str, float] = {
            "ds/prompts": admitted,
            "ds/batch_fill": count / capacity,
            "ds/surplus_groups": surplus,
            "samples/generated": float(sum(s.correct.size for s in self.scores)),
            "time/rollout": seconds["rollout"],
            "time/scoring": seconds["scoring"],
            "_gen_tokens": 0.0,
        }
        if not self.scores:
            return m
        cat = lambda name: np.concatenate([getattr(s, name) for s in self.scores])  # noqa: E731
        c, r, lengths, trunc = cat("correct"), cat("rewards"), cat("lengths"), cat("truncated")
        mu = c.mean(axis=1)
        m.update(
            {
                "reward/mean": float(r.mean()),
                "reward/acc": float(c.mean()),
                "response/len_mean": float(lengths.mean()),
                "response/len_max": float(lengths.max()),
                "response/truncated_frac": float(trunc.mean()),
                "ds/kept_frac": float(np.concatenate(self.kept).mean()),
                "ds/all_correct_frac": float((mu == 1).mean()),
                "ds/all_wrong_frac": float((mu == 0).mean()),
                "_gen_tokens": float(lengths.sum()),  # the returned groups' (collector)
            }
        )
        for k in ("timeout", "error", "no_answer"):
            m[f"reward/{k}"] = float(sum(s.stats.get(k, 0) for s in self.scores))
        return m
