"""The collect stage against stand-in rollout engines (no model): the batch, the surplus
carried to the next step, the cap on admitted prompts, the same batch from a streaming
engine that returns groups in pieces while the collector keeps admitting, padded
returns, and the DAA prior's EMA over every group judged in a step, those carried in
flight from an earlier step included (partial rollouts)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from da3po_jax.data import MathProblem, PromptIterator
from da3po_jax.parallel import to_host
from da3po_jax.rl import DAAConfig, OverlongConfig
from da3po_jax.rollout import (
    CollectConfig,
    Collector,
    GroupBatch,
    GroupScores,
    KeepRule,
    RolloutEngine,
    ScoredGroups,
)

G, TP, TN = 4, 3, 2
PROBLEMS = [MathProblem(id=f"p{i}", prompt=f"q{i}", answer="1") for i in range(12)]


# All wrong (dropped by dynamic sampling); the others are mixed. The iterator's first
# epoch is p5 p8 p11 p7 | p4 p2 p1 p0 | p3 p6 p10 p9, so rounds keep 3, 2 and 2 groups.
DROPPED = {"p8", "p2", "p0", "p6", "p10"}


def verdicts(problem: MathProblem, wrong: frozenset[str] = frozenset(DROPPED)) -> list[float]:
    return [0.0] * G if problem.id in wrong else [1.0] + [0.0] * (G - 1)


def kept_in_order(engine) -> list[int]:
    """Dataset indices of the kept prompts, in the order the engine was given them."""
    return [int(p[1:]) for ids in engine.admitted for p in ids if p not in DROPPED]


class FakeEngine:
    """Scores each admitted prompt by `verdicts`. `slots` prompts may be in flight;
    `finished()` returns `chunk` of them at a time (the oldest first), padded to `pad_to`
    rows when set."""

    group_size, prompt_len, max_new_tokens = G, TP, TN
    max_staleness = 0

    def __init__(self, slots: int, chunk: int, pad_to: int = 0):
        self.slots, self.chunk, self.pad_to = slots, chunk, pad_to
        self.max_in_flight, self.return_size = slots, pad_to or chunk
        self.queue: list[MathProblem] = []
        self.admitted: list[list[str]] = []
        self.synced = self.released = 0
        self.in_flight_at_first_return: int | None = None

    def sync_weights(self, params, version: int = 0) -> None:
        self.synced += 1

    def capacity(self) -> int:
        return self.slots - len(self.queue)

    def admit(self, problems, keys) -> None:
        assert len(keys) == len(problems)
        self.admitted.append([p.id for p in problems])
        self.queue.extend(problems)

    def in_flight(self) -> int:
        return len(self.queue)

    def overdue(self, version: int) -> int:
        return len(self.queue)

    def finished(self) -> list[ScoredGroups]:
        if not self.queue:
            return []
        if self.in_flight_at_first_return is None:
            self.in_flight_at_first_return = len(self.queue)
        done, self.queue = self.queue[: self.chunk], self.queue[self.chunk :]
        if not self.pad_to:
            return [_scored(done)]
        # padding rows: copies of a kept (mixed) group, which must still never be kept
        padded = _scored(done + [PROBLEMS[1]] * (self.pad_to - len(done)))
        real = len(done)
        scores = padded.scores.head(real)
        return [ScoredGroups(padded.batch, scores, done, np.arange(self.pad_to) < real)]

    def release(self) -> None:
        self.released += 1

    def tokens_generated(self) -> int | None:
        return None  # each step returns all it generated: the collector counts those

    def snapshot(self) -> tuple[dict, dict]:
        return {}, {}  # nothing outlives a step

    def snapshot_shapes(self, meta: dict) -> dict:
        return {}

    def restore(self, arrays: dict, meta: dict) -> None:
        pass


def _scored(problems, wrong: frozenset[str] = frozenset(DROPPED)) -> ScoredGroups:
    n = len(problems)
    correct = np.asarray([verdicts(p, wrong) for p in problems], np.float32)
    lengths = np.full((n, G), TN, np.int32)
    batch = GroupBatch.zeros(n, G, TP, TN).replace(
        correct=jnp.asarray(correct),
        rewards=jnp.asarray(correct),
        lengths=jnp.asarray(lengths),
        prompt_index=jnp.asarray([int(p.id[1:]) for p in problems], jnp.int32),
    )
    scores = GroupScores(
        correct, correct, lengths, np.zeros((n, G), bool), {"ok": n * G}, {"rollout": 0.0}
    )
    scores.seconds["scoring"] = 0.0
    return ScoredGroups(batch, scores, list(problems))


def _collector(engine, max_prompts=12) -> Collector:
    cfg = CollectConfig(
        capacity=4,
        max_prompts=max_prompts,
        keep=KeepRule(enable=True, metric="acc", group_size=G, overlong=OverlongConfig(TN)),
        daa=DAAConfig(estimator="history"),
    )
    return Collector(engine, PromptIterator(PROBLEMS, seed=0), cfg)


def _steps(engine, steps=2, max_prompts=12):
    collector = _collector(engine, max_prompts)
    carry = collector.initial_carry(len(PROBLEMS))
    out = []
    for s in range(steps):
        collected, carry = collector.collect(None, carry, jax.random.key(s))
        carry = collector.after_update(carry, collected)
        out.append((collected, carry))
    return collector, out


def test_engines_satisfy_the_protocol():
    assert isinstance(FakeEngine(4, 4), RolloutEngine)


def test_static_rounds_fill_the_batch_and_carry_the_surplus():
    """Step 1: rounds keep 3 + 2 groups: 4 train, 1 carried. Step 2: the carried group,
    then rounds keeping 2 and 3: 4 train, 2 carried."""
    engine = FakeEngine(slots=4, chunk=4)
    _, ((first, carry1), (second, _)) = _steps(engine)
    m1, m2 = first.metrics, second.metrics
    assert (m1["ds/prompts"], m1["ds/surplus_groups"], m1["ds/batch_fill"]) == (8, 1, 1.0)
    assert (m2["ds/prompts"], m2["ds/surplus_groups"]) == (8, 2)
    assert m1["samples/generated"] == 8 * G and m1["ds/kept_frac"] == pytest.approx(5 / 8)
    order = [pid for ids in engine.admitted for pid in ids]
    kept = kept_in_order(engine)
    assert to_host(first.batch.prompt_index).tolist() == kept[:4]
    assert to_host(second.batch.prompt_index).tolist() == kept[4:8]  # surplus first
    assert engine.synced == 2 and engine.released == 0  # the loop releases, not the collector
    # the history table counts every generated group, filtered ones included
    table = to_host(carry1.history.success) + to_host(carry1.history.failure)
    assert sorted(np.flatnonzero(table).tolist()) == sorted(int(p[1:]) for p in order[:8])


def test_dynamic_sampling_as_a_stream():
    """An engine with 8 slots that returns two groups at a time: the collector admits 8
    prompts, then 2 more each time 2 come back, and stops admitting once the batch is full
    (12 of the 24 allowed). The batch is the static engine's (the first kept groups);
    the groups in flight when it filled finish and all land in the surplus (nothing
    generated is dropped); the engine holds nothing when the batch is handed over."""
    static, streaming = FakeEngine(slots=4, chunk=4), FakeEngine(slots=8, chunk=2)
    _, ((ref, _),) = _steps(static, steps=1, max_prompts=24)
    _, ((got, carry),) = _steps(streaming, steps=1, max_prompts=24)
    assert streaming.in_flight_at_first_return == 8
    assert [len(a) for a in streaming.admitted] == [8, 2, 2] and not streaming.queue
    for x, y in zip(
        jax.tree.leaves((ref.batch, ref.valid)), jax.tree.leaves((got.batch, got.valid))
    ):
        np.testing.assert_array_equal(to_host(x), to_host(y))
    kept = kept_in_order(streaming)
    surplus = to_host(carry.surplus.items.prompt_index)[: int(carry.surplus.count)]
    assert to_host(got.batch.prompt_index).tolist() + surplus.tolist() == kept
    assert len(surplus) == 3
    assert got.metrics["ds/prompts"] == 12 and got.metrics["samples/generated"] == 12 * G
    assert got.metrics["ds/surplus_groups"] == 3


def test_padded_returns_count_only_their_real_rows():
    """Padding rows (copies of a mixed group, `valid` False) are never kept, counted or
    added to the history table: the batch equals the unpadded engine's."""
    _, ((ref, ref_carry),) = _steps(FakeEngine(slots=4, chunk=4), steps=1)
    _, ((got, carry),) = _steps(FakeEngine(slots=4, chunk=4, pad_to=6), steps=1)
    for x, y in zip(
        jax.tree.leaves((ref.batch, ref.valid)), jax.tree.leaves((got.batch, got.valid))
    ):
        np.testing.assert_array_equal(to_host(x), to_host(y))
    assert got.metrics == ref.metrics
    np.testing.assert_array_equal(
        to_host(carry.history.success), to_host(ref_carry.history.success)
    )
    assert int(carry.surplus.count) == int(ref_carry.surplus.count) == 1


def test_the_prompt_cap_trains_on_what_was_kept(caplog):
    """Four prompts allowed, 3 of them kept: a batch of 3, with a warning."""
    _, ((collected, carry),) = _steps(FakeEngine(4, 4), steps=1, max_prompts=4)
    assert to_host(collected.valid).tolist() == [True, True, True, False]
    assert collected.metrics["ds/batch_fill"] == 0.75
    assert int(carry.surplus.count) == 0
    assert "reached ds.max_prompts=4 admitted prompts with 3 of 4 groups" in caplog.text


class CarryingEngine(FakeEngine):
    """Partial rollouts with `max_staleness` 1: a prompt admitted at version v may stay in
    flight past the step of v and is overdue in the next one. `finished()` returns the
    oldest `chunk` prompts in flight, scored with `wrong` the all-wrong prompts; each
    returned group counts G x TN sampled tokens (`tokens_generated`)."""

    max_staleness = 1

    def __init__(self, slots: int, chunk: int, wrong: frozenset[str]):
        super().__init__(slots, chunk)
        self.wrong, self.version, self.sampled = wrong, 0, 0
        self.versions: list[int] = []  # admission version of each prompt in flight

    def sync_weights(self, params, version: int = 0) -> None:
        super().sync_weights(params, version)
        self.version = version

    def admit(self, problems, keys) -> None:
        super().admit(problems, keys)
        self.versions += [self.version] * len(problems)

    def overdue(self, version: int) -> int:
        return sum(v <= version - self.max_staleness for v in self.versions)

    def finished(self) -> list[ScoredGroups]:
        done, self.queue = self.queue[: self.chunk], self.queue[self.chunk :]
        started, self.versions = self.versions[: len(done)], self.versions[len(done) :]
        if not done:
            return []
        self.sampled += len(done) * G * TN
        scored = _scored(done, self.wrong)
        # every token sampled at its group's admission version (what the batch records)
        version = np.broadcast_to(np.asarray(started, np.int32)[:, None, None], (len(done), G, TN))
        batch = scored.batch.replace(version=jnp.asarray(version))
        return [ScoredGroups(batch, scored.scores, scored.problems)]

    def tokens_generated(self) -> int:
        return self.sampled


def _moments_ema(steps: list[list[float]], decay: float) -> tuple[float, float]:
    """The prior's moment EMA by hand: per step the mean and unbiased variance of the
    judged groups' accuracies; the first step's taken as they are."""
    mean = var = None
    for acc in steps:
        m, v = float(np.mean(acc)), float(np.var(acc, ddof=1))
        if mean is None:
            mean, var = m, v
        else:
            mean, var = decay * mean + (1 - decay) * m, decay * var + (1 - decay) * v
    return mean, var


@pytest.mark.parametrize("chunk", [1, 2])
def test_the_prior_sees_every_group_judged_with_partial_rollouts(chunk):
    """Batches of 2, 4 prompts admitted per step. Step 1 (version 0) admits p5 p8 p11 p7
    and its batch fills with the mixed p5, p8: p11 and p7 stay in flight (not overdue).
    Step 2 admits p4 p2 p1 p0 and judges the carried p11, p7 (all wrong), then p4, p2
    (all wrong), then p1, p0 (mixed): 6 groups, more than the 4 it admits. The prior's
    EMA takes all 6 accuracies (before, the step's accuracy array held `max_prompts`:
    returns of 2 failed to fit it, returns of 1 were silently left out)."""
    wrong = frozenset({"p11", "p7", "p4", "p2"})
    engine = CarryingEngine(slots=8, chunk=chunk, wrong=wrong)
    cfg = CollectConfig(
        capacity=2,
        max_prompts=4,
        keep=KeepRule(enable=True, metric="acc", group_size=G, overlong=OverlongConfig(TN)),
        daa=DAAConfig(estimator="bayes"),
    )
    collector = Collector(engine, PromptIterator(PROBLEMS, seed=0), cfg)
    carry = collector.initial_carry(len(PROBLEMS))
    judged = []
    for version in range(2):
        collected, carry = collector.collect(None, carry, jax.random.key(version), version)
        carry = collector.after_update(carry, collected)
        index = np.concatenate([to_host(i) for i, _ in collected.outcomes])
        correct = np.concatenate([to_host(c) for _, c in collected.outcomes])
        judged.append((index.tolist(), correct.mean(axis=1).tolist()))
        assert collected.metrics["ds/batch_fill"] == 1.0
        mean, var = _moments_ema([acc for _, acc in judged], cfg.daa.prior_ema)
        assert float(carry.prior.mean) == pytest.approx(mean, rel=1e-6, abs=1e-7), version
        assert float(carry.prior.var) == pytest.approx(var, rel=1e-6, abs=1e-7), version
    assert engine.admitted == [["p5", "p8", "p11", "p7"], ["p4", "p2", "p1", "p0"]]
    assert judged[0] == ([5, 8], [0.25, 0.25])
    assert judged[1] == ([11, 7, 4, 2, 1, 0], [0.0, 0.0, 0.0, 0.0, 0.25, 0.25])
    # the hand-computed values themselves: step 1 (1/4, 0), then the EMA with step 2's
    # mean 1/12 and unbiased variance (4 (1/12)^2 + 2 (1/6)^2) / 5 = 1/60
    assert _moments_ema([judged[0][1], judged[1][1]], 0.9) == pytest.approx(
        (0.9 / 4 + 0.1 / 12, 0.1 / 60)
    )


def test_an_engine_carrying_groups_must_count_its_tokens():
    """An engine with `max_staleness` > 0 and no `tokens_generated()` count (it returns
    None) is refused: the token budget would miss what its groups in flight sampled."""

    class Uncounted(FakeEngine):
        max_staleness = 1

    with pytest.raises(TypeError, match="has no tokens_generated"):
        _collector(Uncounted(4, 4))


def test_round_stats_grow_rather_than_lose_an_accuracy():
    """Sized for fewer groups than a step judges (an engine exceeding its `max_in_flight`),
    the accuracy array grows: every group still reaches the prior's EMA."""
    from da3po_jax.rollout.stats import RoundStats

    stats = RoundStats(1)
    for problems in (PROBLEMS[:2], PROBLEMS[2:3]):  # p0 p1, then p2 (all wrong)
        groups = _scored(problems)
        mu = groups.scores.correct.mean(axis=1)
        stats.add(groups, np.ones(len(problems), bool), mu, 0)
    acc, valid = stats.group_accuracies()
    assert to_host(acc).tolist() == [0.0, 0.25, 0.0] and to_host(valid).all()
