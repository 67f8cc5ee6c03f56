"""The collect stage of an RL step: prompts in, one full batch of kept groups out.

`Collector` owns the prompt iterator (the data position), asks the rollout engine for
scored groups, runs dynamic sampling (the keep rule and the fixed-capacity buffer, jitted;
the stream of admissions and the cap on admitted prompts, on the host) and updates the
state carried from step to step, `RLCarry`: the dynamic-sampling surplus, the DAA prior's
moment EMA and the per-prompt history table. A checkpoint is the train state + this
carry + the iterator's position.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh

from da3po_jax.data import PromptIterator
from da3po_jax.parallel import replicated, to_host
from da3po_jax.rl import (
    BetaPrior,
    DAAConfig,
    DSBuffer,
    OverlongConfig,
    PriorState,
    PromptHistory,
    apply_overlong,
    ds_add_round,
    ds_empty_buffer,
    ds_keep_mask,
    ds_take,
    group_accuracy,
    init_prior_state,
    prior_from_state,
    update_prior_state,
)
from da3po_jax.rollout.batch import GroupBatch, ScoredGroups
from da3po_jax.rollout.history import add_to_history
from da3po_jax.rollout.protocol import RolloutEngine
from da3po_jax.rollout.stats import RoundStats
from da3po_jax.sampling import prompt_keys

log = logging.getLogger(__name__)


@struct.dataclass
class RLCarry:
    """The RL state carried across steps besides the train state.

    Attributes:
      surplus: kept groups that did not fit the last batch (seed of the next one).
      prior: EMA of the group-accuracy moments (the Beta prior of `bayes` / `history`).
      history: the per-prompt table of decayed success / failure counts, indexed by the
        prompt's position in the training set (`history` estimator; zeros otherwise).
    """

    surplus: DSBuffer
    prior: PriorState
    history: PromptHistory


@dataclasses.dataclass(frozen=True)
class KeepRule:
    """Which finished groups dynamic sampling keeps (hashable: a jit static argument).

    Attributes:
      enable: keep only groups whose `metric` varies (DAPO); off keeps every group.
      metric: `"acc"` (correctness) or `"reward"` (the reward after overlong shaping).
      group_size: G.
      overlong: the shaping applied to rewards before the `reward` metric is tested.
    """

    enable: bool
    metric: str
    group_size: int
    overlong: OverlongConfig


@dataclasses.dataclass(frozen=True)
class CollectConfig:
    """Settings of the collect stage.

    Attributes:
      capacity: groups per training batch (`rl.train_prompts`).
      max_prompts: prompts admitted per step at most (`ds.max_prompts`; `capacity`
        without dynamic sampling).
      keep: the keep rule of finished groups.
      daa: the DAA section: its rule decides what the carry tracks (`use_prior`,
        `track_history`); the prior's moments follow `prior_ema` whether or not it is
        read, the per-prompt counts decay by `history_decay`.
    """

    capacity: int
    max_prompts: int
    keep: KeepRule
    daa: DAAConfig = DAAConfig(enable=False)

    @property
    def use_prior(self) -> bool:
        """The DAA rule reads the Beta prior (the update gets `prior(carry)`)."""
        return self.daa.enable and self.daa.uses_prior

    @property
    def track_history(self) -> bool:
        """The DAA rule reads the per-prompt history table."""
        return self.daa.enable and self.daa.uses_history


@dataclasses.dataclass
class Collected:
    """One step's batch: `train_prompts` slots of groups, `valid` [N] marking the filled
    ones; `outcomes`, every group generated this step as (dataset index [n] (-1: padding
    or not a training prompt), correct [n, G]), kept or not, for the history table; and
    the collect stage's host metrics."""

    batch: GroupBatch
    valid: jax.Array
    outcomes: list[tuple[jax.Array, jax.Array]]
    metrics: dict[str, float]


def add_finished(buffer: DSBuffer, items: GroupBatch, valid: jax.Array, rule: KeepRule):
    """Adds finished groups' kept ones to the buffer (jit with `rule` static).

    The keep mask is DAPO's (non-zero variance of the metric within the group), computed
    on the shaped reward R + R_len when `rule.metric == "reward"`; with dynamic sampling
    off every group is kept. Rows with `valid` [N] False (an engine's padding) never are.
    Returns (buffer, the kept groups that did not fit, keep [N], group accuracy [N]).
    """
    n = items.tokens.shape[0]
    correct = items.correct.reshape(-1)
    rewards, _ = apply_overlong(
        items.rewards, items.lengths, items.truncated, items.response_mask, rule.overlong
    )
    if rule.enable:
        keep = ds_keep_mask(correct, rewards.reshape(-1), rule.group_size, metric=rule.metric)
    else:
        keep = jnp.ones((n,), jnp.bool_)
    keep = keep & valid
    buffer, surplus = ds_add_round(buffer, items, keep)
    mu, _, _ = group_accuracy(correct, rule.group_size)
    return buffer, surplus, keep, mu


def _count(engine: RolloutEngine) -> int | None:
    """The engine's `tokens_generated()` as an int, or None when it does not count (it
    returns in each step all it generated in it)."""
    count = engine.tokens_generated()
    return None if count is None else int(count)


def staleness_metrics(items: GroupBatch, valid, version: int, engine) -> dict[str, float]:
    """How stale the batch trained at weights `version` is (partial rollouts): the share
    of its response tokens sampled `k` versions earlier, `stale/token_lag_k` for k = 0 ..
    max_staleness and `stale/token_lag_over` beyond (groups judged in an earlier step and
    carried in the dynamic-sampling surplus); `stale/max_lag`; `stale/mixed_groups`, the
    share of its groups whose tokens come from more than one version; and
    `stale/in_flight`, the prompts the engine carries into the next step."""
    mask = to_host(items.response_mask) & to_host(valid)[:, None, None]
    lag = np.where(mask, version - to_host(items.version), -1)
    total, top = max(int(mask.sum()), 1), engine.max_staleness
    out = {f"stale/token_lag_{k}": float((lag == k).sum() / total) for k in range(top + 1)}
    out["stale/token_lag_over"] = float((lag > top).sum() / total)
    out["stale/max_lag"] = float(lag.max(initial=0))
    newest = np.where(mask, -lag, np.iinfo(np.int32).min).max(axis=(1, 2))
    oldest = np.where(mask, -lag, np.iinfo(np.int32).max).min(axis=(1, 2))
    groups = mask.any(axis=(1, 2))
    out["stale/mixed_groups"] = float((groups & (newest > oldest)).sum() / max(groups.sum(), 1))
    out["stale/in_flight"] = float(engine.in_flight())
    return out


def groups_like(engine: RolloutEngine, n: int = 1) -> GroupBatch:
    """`n` zero groups of the shapes `engine` returns (the per-token policy versions with
    partial rollouts): the template of the collector's buffers and of the batch the
    update takes. `engine` may be any object with the protocol's sizes (the compile
    planner passes the ones a run's engine would have)."""
    return GroupBatch.zeros(
        n,
        engine.group_size,
        engine.prompt_len,
        engine.max_new_tokens,
        versions=engine.max_staleness > 0,
    )


def empty_surplus(engine: RolloutEngine) -> DSBuffer:
    """The carry's dynamic-sampling surplus: room for every group `engine` holds."""
    return ds_empty_buffer(groups_like(engine), engine.max_in_flight)


def empty_pending(engine: RolloutEngine, capacity: int, like: GroupBatch | None = None):
    """A step's buffer of kept groups: the batch's `capacity`, and room for every group
    `engine` may return once the batch is full (they become the next step's surplus).
    `like`: groups of the same shapes (default `groups_like(engine)`)."""
    like = groups_like(engine) if like is None else like
    return ds_empty_buffer(like, capacity + engine.max_in_flight)


def jitted_add_finished():
    """`add_finished` jitted as the collector runs it (the keep rule static); one per
    collector, so its compile count is the collector's."""
    return jax.jit(add_finished, static_argnames="rule")


class Collector:
    """Fills one training batch per step from a rollout engine (see the module docstring).

    Args:
      engine: any `RolloutEngine`.
      iterator: the training prompts' `PromptIterator` (every host walks the same stream).
      config: `CollectConfig`.
      mesh: the carried arrays are replicated over it (None: one device).
    """

    def __init__(
        self,
        engine: RolloutEngine,
        iterator: PromptIterator,
        config: CollectConfig,
        mesh: Mesh | None = None,
    ):
        if engine.max_staleness and engine.tokens_generated() is None:
            raise TypeError(
                f"{type(engine).__name__} carries groups across steps (max_staleness="
                f"{engine.max_staleness}) but has no tokens_generated() count (it returns "
                "None): the token budget would miss the tokens of groups in flight "
                "(rollout/protocol.py)"
            )
        self.engine, self.iterator, self.config, self.mesh = engine, iterator, config, mesh
        self.progress: Callable[[str], None] | None = None  # e.g. a progress bar's postfix
        self.add_finished = jitted_add_finished()
        self._seed_buffer = jax.jit(ds_add_round)
        self._take = jax.jit(ds_take, static_argnames="n")
        self._prior_update = jax.jit(update_prior_state, static_argnames="decay")

    def initial_carry(self, num_prompts: int) -> RLCarry:
        """An empty surplus, a fresh prior and a zero table for `num_prompts` prompts."""
        carry = RLCarry(
            surplus=empty_surplus(self.engine),
            prior=init_prior_state(),
            history=PromptHistory(jnp.zeros(num_prompts), jnp.zeros(num_prompts)),
        )
        # committed like the arrays the steps put back (an uncommitted input compiles anew)
        return jax.device_put(carry, replicated(self.mesh) if self.mesh else jax.devices()[0])

    def collect(
        self, params, carry: RLCarry, key: jax.Array, version: int = 0
    ) -> tuple[Collected, RLCarry]:
        """Dynamic sampling as a stream: while the batch lacks kept groups and fewer than
        `max_prompts` prompts were admitted, admits as many new prompts as the engine has
        room for (the step's j-th prompt sampled with the key fold_in(key, j),
        `sampling.prompt_keys`), and adds finished groups as they come back, until the
        engine has nothing in flight that is due in this step (`overdue`). Groups in
        flight when the batch fills finish and go to the next step's surplus, so nothing
        generated is thrown away (the pending buffer has room for the engine's
        `max_in_flight` groups beyond the batch); with partial rollouts only the overdue
        ones do, and the others go on generating in the next step.

        Every group judged in the step (returned by the engine, kept or not, whatever step
        admitted it) enters the DAA prior's moment EMA. The metric `_gen_tokens`, which
        `train.token_budget` adds up, is the response tokens the engine sampled during the
        step (`RolloutEngine.tokens_generated`; when it is None, the returned groups'
        tokens).

        `params` are policy version `version` (the optimizer steps they have taken).
        Returns the batch and the new carry."""
        config, engine = self.config, self.engine
        engine.sync_weights(params, version)
        tokens_before = _count(engine)
        pending = empty_pending(engine, config.capacity, like=carry.surplus.items)
        pending, _ = self._seed_buffer(pending, carry.surplus.items, carry.surplus.valid)
        stats = RoundStats(self.judged_max())
        outcomes: list[tuple[jax.Array, jax.Array]] = []
        admitted, count = 0, int(pending.count)
        while True:
            room = min(engine.capacity(), config.max_prompts - admitted)
            if count < config.capacity and room > 0:
                keys = prompt_keys(key, room, start=admitted)
                engine.admit(self.iterator.next_batch(room), keys)
                admitted += room
                continue
            if not engine.in_flight():
                break
            if count >= config.capacity and not engine.overdue(version):
                break  # the rest goes on in the next step (partial rollouts)
            done = engine.finished()
            for groups in done:
                pending = self._add(carry, groups, pending, stats, outcomes)
            if done:  # one sync per return, none while the engine only decoded
                count = int(pending.count)
                self._report(count, admitted)
        batch, surplus = self._take(pending, n=config.capacity)
        self._warn(admitted, count, int(stats.dropped))  # one sync, not one per group
        acc, acc_valid = stats.group_accuracies()
        prior = self._prior_update(carry.prior, acc, acc_valid, decay=config.daa.prior_ema)
        carry = carry.replace(surplus=surplus, prior=prior)
        metrics = stats.summary(
            admitted, min(count, config.capacity), config.capacity, int(surplus.count)
        )
        if tokens_before is not None:  # rows still in flight and later dropped included
            metrics["_gen_tokens"] = float(_count(engine) - tokens_before)
        if engine.max_staleness:
            metrics.update(staleness_metrics(batch.items, batch.valid, version, engine))
        return Collected(batch.items, batch.valid, outcomes, metrics), carry

    def judged_max(self) -> int:
        """The most groups a step can judge: the `max_prompts` it admits, plus, with
        partial rollouts, the groups carried in flight from earlier steps (at most the
        engine's `max_in_flight`); the size of the step's accuracy array (`RoundStats`)."""
        carried = self.engine.max_in_flight if self.engine.max_staleness else 0
        return self.config.max_prompts + carried

    # ------------------------------------- what the loop asks of the engine and the data
    def release_cache(self) -> None:
        """Frees the engine's generation memory once the batch is collected, before the
        update (`RolloutEngine.release`; an engine carrying groups into the next step
        keeps their state)."""
        self.engine.release()

    def data_state(self) -> dict:
        """The prompt stream's position (JSON), for a checkpoint."""
        return self.iterator.state.to_dict()

    def restore_data(self, saved: dict) -> None:
        """Puts a `data_state` back.

        Raises:
          ValueError: the position was made for other prompts (other ids or order, another
            seed); nothing is changed.
        """
        self.iterator.restore(saved)

    @property
    def prompts_per_epoch(self) -> int:
        """The training prompts this host's stream walks per epoch."""
        return self.iterator.epoch_length

    def engine_snapshot(self) -> tuple[dict, dict] | None:
        """The work the engine carries into the next step, for a checkpoint: the (arrays,
        JSON meta) of `RolloutEngine.snapshot`; None when it carries none across steps
        (`max_staleness` 0: the checkpoint has no `engine` entry)."""
        if not self.engine.max_staleness:
            return None
        return self.engine.snapshot()

    def engine_snapshot_shapes(self, meta: dict) -> dict:
        """The restore target of a checkpoint's `engine_snapshot` with this `meta`."""
        return self.engine.snapshot_shapes(meta)

    def restore_engine(self, arrays: dict, meta: dict) -> None:
        """Puts an `engine_snapshot` back into the engine (the run resumes from it)."""
        self.engine.restore(arrays, meta)

    def _add(self, carry, groups: ScoredGroups, pending, stats: RoundStats, outcomes: list):
        """Files one engine return: its outcomes, its kept groups into `pending`."""
        items = groups.batch.replace(history=self._history_of(carry, groups.batch))
        valid = jnp.asarray(groups.valid)
        # padding rows are no prompt's outcome (-1: not in the history table)
        outcomes.append((jnp.where(valid, items.prompt_index, -1), items.correct))
        pending, dropped, keep, mu = self.add_finished(pending, items, valid, rule=self.config.keep)
        stats.add(groups, to_host(keep), to_host(mu), dropped.count)
        return pending

    def _report(self, count: int, admitted: int) -> None:
        """Where dynamic sampling stands, for `progress` (kept groups of the batch)."""
        if self.progress is not None:
            kept = min(count, self.config.capacity)
            self.progress(f"sampling: {kept}/{self.config.capacity} kept of {admitted} prompts")

    def _warn(self, admitted: int, count: int, dropped: int) -> None:
        config = self.config
        if count < config.capacity:
            log.warning(
                "dynamic sampling reached ds.max_prompts=%d admitted prompts with %d of %d "
                "groups; training on what was kept",
                config.max_prompts,
                count,
                config.capacity,
            )
        if dropped:
            log.warning(
                "%d kept groups did not fit the batch and the surplus (%d prompts admitted): "
                "dropped",
                dropped,
                admitted,
            )

    def _history_of(self, carry: RLCarry, batch: GroupBatch) -> PromptHistory:
        """What the table knows of the round's prompts before generation (0 for prompts
        outside it, and everywhere when the table is not tracked)."""
        n = batch.num_groups
        if not self.config.track_history:
            return PromptHistory(jnp.zeros(n), jnp.zeros(n))
        idx = batch.prompt_index
        known, safe = idx >= 0, jnp.maximum(idx, 0)
        return PromptHistory(
            jnp.where(known, carry.history.success[safe], 0.0),
            jnp.where(known, carry.history.failure[safe], 0.0),
        )

    def prior(self, carry: RLCarry) -> BetaPrior | None:
        """The Beta prior the update's DAA rule reads (None when it reads none)."""
        if not self.config.use_prior:
            return None
        return prior_from_state(carry.prior, self.config.keep.group_size)

    def after_update(self, carry: RLCarry, collected: Collected) -> RLCarry:
        """Adds this step's outcomes to the history table: every generated group,
        including those dynamic sampling filtered (all wrong / all right), which carry most
        of the information about a hard prompt (docs/algorithms.md, `history`).

        Runs after the update, so the step's own groups never see their counts."""
        if not self.config.track_history or not collected.outcomes:
            return carry
        table = add_to_history(
            PromptHistory(*(to_host(x) for x in carry.history)),
            np.concatenate([to_host(i) for i, _ in collected.outcomes]),
            np.concatenate([to_host(c) for _, c in collected.outcomes]),
            self.config.keep.group_size,
            self.config.daa.history_decay,
        )
        placed = jax.device_put(table, replicated(self.mesh)) if self.mesh else table
        return carry.replace(history=PromptHistory(*(jnp.asarray(x) for x in placed)))
