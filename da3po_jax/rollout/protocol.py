"""Rollout engines: what the RL loop needs from any generator of scored groups.

The collector (`rollout/collector.py`) and evaluation talk to an engine through the calls
of `RolloutEngine` below and never look inside it; the loop (`run/loop.py`) reaches the
engine only through the collector (`Collector.release_cache`, `engine_snapshot`, ...).
Every member is declared there with its contract (when it is called, what it returns):

- generation: `sync_weights(params, version)`, `capacity()`, `admit(problems, keys)`,
  `in_flight()`, `overdue(version)`, `finished()`, and `release()` at the end of the
  step's collection;
- counting: `tokens_generated()`, the response tokens sampled so far, or None for an
  engine that returns in each step all it generated in it;
- checkpoints of the work carried across steps (`max_staleness > 0`, partial rollouts):
  `snapshot()`, `snapshot_shapes(meta)`, `restore(arrays, meta)`; an engine that carries
  nothing (`max_staleness == 0`) is never asked for them and implements them trivially
  (an empty snapshot), so its checkpoints have no `engine` entry;
- sizes: `group_size`, `prompt_len`, `max_new_tokens`, `max_in_flight` (the most prompts
  it holds at once: what the dynamic-sampling buffer makes room for beyond the batch),
  `return_size` (the groups of each returned batch) and `max_staleness`.

Every engine returns batches of one fixed size (padded, `ScoredGroups.valid`), so the
dynamic-sampling update compiles once.

An engine class is built from `EngineParts` (`from_parts`), says how many prompts it holds
at most for given settings (`max_in_flight_for`, the surplus size a checkpoint records)
and how many groups each returned batch has (`return_size_for`; the compile planner sizes
its programs with both), and whether it decodes in slots (`uses_slots`: `rollout.slots`
must hold a group). It is registered by name in `rollout/engines.py: ENGINES`, the values
of `rollout.engine`. `tests/train/test_engine_contract.py` checks that every call the
collector, the loop and evaluation make on an engine is declared here, and that every
registered engine class implements every member with a compatible signature.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import jax
from jax.sharding import Mesh

from da3po_jax.data import MathProblem
from da3po_jax.models import ModelConfig
from da3po_jax.rewards import RewardScorer
from da3po_jax.rollout.batch import ScoredGroups
from da3po_jax.rollout.encoder import PromptEncoder
from da3po_jax.sampling import GenerateConfig


@runtime_checkable
class RolloutEngine(Protocol):
    """A generator of scored groups (see the module docstring).

    Attributes:
      group_size: G, the samples of each prompt.
      prompt_len: the padded prompt length of the groups it returns.
      max_new_tokens: the response length of the groups it returns.
      max_in_flight: the most prompts it holds at once (admitted, not yet returned).
      return_size: the groups of each batch `finished` returns (padded to it).
      max_staleness: optimizer steps a group may stay in flight (0: none outlives the
        step that admitted it; > 0: partial rollouts, docs/algorithms.md).
    """

    group_size: int
    prompt_len: int
    max_new_tokens: int
    max_in_flight: int
    return_size: int
    max_staleness: int

    def sync_weights(self, params, version: int = 0) -> None:
        """Called at the start of each step's collection (and of an evaluation) before
        anything is admitted: the policy parameters for the generations that follow and
        their version (optimizer steps taken; what partial rollouts record per token).
        The update donates the old buffers, so the engine must not keep using them."""
        ...

    def capacity(self) -> int:
        """How many more prompts `admit` takes now (0 while the engine is full)."""
        ...

    def admit(self, problems: Sequence[MathProblem], keys: jax.Array) -> None:
        """Queues `problems` (at most `capacity()` of them), G samples each, prompt i
        drawn with `keys[i]` (`sampling.prompt_keys`: the samples of a prompt depend on
        its key only)."""
        ...

    def in_flight(self) -> int:
        """Prompts admitted and not yet returned by `finished`."""
        ...

    def overdue(self, version: int) -> int:
        """Of the prompts in flight, those that must come back before the step of weights
        `version` ends: all of them unless the engine carries groups across steps
        (`max_staleness > 0`: those admitted at a version <= `version - max_staleness`).
        The collector ends a full step once this is 0."""
        ...

    def finished(self) -> list[ScoredGroups]:
        """Advances generation and returns the groups done since the last call, generated
        and scored, as `ScoredGroups` of one fixed size (possibly none while work is in
        flight; it blocks while nothing is ready to return)."""
        ...

    def release(self) -> None:
        """Called once the step's batch is collected, before the update (and when an
        evaluation ends): frees generation memory (KV caches). An engine carrying groups
        into the next step (`max_staleness > 0`) keeps their state."""
        ...

    def tokens_generated(self) -> int | None:
        """Read by the collector at the start and the end of each step's collection: the
        response tokens sampled so far, counted as they are sampled (rows still in flight
        and work abandoned included; not what a restored snapshot's rows had sampled
        before the checkpoint, which the run that saved it counted). The step's
        difference is what `train.token_budget` adds up, so the budget sees every
        generated token once, whether or not its group is ever returned.

        None: the engine returns in each step all it generated in it, so the lengths of
        the groups it returns are the count (the collector counts those). An engine that
        carries groups across steps (`max_staleness > 0`) must count (the collector
        refuses it otherwise)."""
        ...

    def snapshot(self) -> tuple[dict, dict]:
        """Called when a checkpoint is written, after `release`, and only when
        `max_staleness > 0`: the work carried into the next step as (arrays, meta), a
        tree of device arrays and a JSON-able dict, from which `restore` in a fresh
        engine of the same settings goes on exactly from here. An engine that carries
        nothing returns `({}, {})`."""
        ...

    def snapshot_shapes(self, meta: dict) -> dict:
        """Called when a checkpoint holding a snapshot is restored, before its arrays are
        read: the abstract arrays (`jax.ShapeDtypeStruct`s, placed as `snapshot` placed
        them) of the snapshot whose meta is `meta`, the restore target."""
        ...

    def restore(self, arrays: dict, meta: dict) -> None:
        """Called once when a run resumes from a checkpoint holding a snapshot, before the
        first step: puts the work `snapshot` saved back (whatever was in flight is
        abandoned first)."""
        ...


@dataclasses.dataclass(frozen=True)
class EngineParts:
    """Everything an engine is built from (`from_parts`).

    Attributes:
      graphdef, model_config: the policy's graph and architecture.
      gen: sampling settings (num_samples = G, length cap, stop and pad ids).
      encoder: prompt tokenisation; scorer: the reward worker pool.
      prompt_len: the padded prompt length of the returned groups (training groups of
        different buckets share one buffer).
      round_size: prompts per call of an engine that generates in rounds.
      index_of: dataset index of a problem id (-1 for others; the history estimator).
      mesh: batches are split over its batch axes; None: one device.
      slots, steps_per_call, attention_block: the decode slots of a slot engine (S, K
        decode steps per jitted call, keys per decode-attention block).
      max_staleness, partial_kv: partial rollouts of a slot engine (`rollout.*`; 0: every
        group admitted in a step finishes in it).
    """

    graphdef: Any
    model_config: ModelConfig
    gen: GenerateConfig
    encoder: PromptEncoder
    scorer: RewardScorer
    prompt_len: int
    round_size: int
    index_of: dict[str, int]
    mesh: Mesh | None
    slots: int
    steps_per_call: int
    attention_block: int
    max_staleness: int = 0
    partial_kv: str = "keep"
