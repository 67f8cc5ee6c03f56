"""Rollout engines: what the RL loop needs from any generator of scored groups.

The collector (`rollout/collector.py`) and evaluation talk to an engine through these calls
and never look inside it:

- `sync_weights(params, version)`: the policy parameters for the generations that follow,
  and their version (optimizer steps taken; what partial rollouts record per token);
- `capacity()`: how many more prompts it takes now (0 while it is full);
- `admit(problems, keys)`: queues prompts, G samples each, prompt i drawn with `keys[i]`
  (`sampling.prompt_keys`: the samples of a prompt depend on its key only);
- `in_flight()`: prompts admitted and not yet returned;
- `overdue(version)`: of those, the prompts that must come back before the step of
  weights `version` ends (all of them unless the engine carries groups across steps:
  `max_staleness > 0`, see docs/algorithms.md, "Partial rollouts");
- `finished()`: advances generation and returns the groups done since the last call,
  generated and scored, as `ScoredGroups` (possibly none while work is in flight; blocks
  while nothing is ready to return);
- `release()`: frees generation memory (KV caches) before the update (an engine carrying
  groups to the next step keeps their state);

and `max_in_flight`, the most prompts it holds at once (what the dynamic-sampling buffer
makes room for beyond the batch). Every engine returns batches of one fixed size (padded,
`ScoredGroups.valid`), so the dynamic-sampling update compiles once.

An engine that carries groups across steps (`max_staleness > 0`) must also count what it
samples, `tokens_generated()`: the response tokens it has sampled so far, counted as they
are sampled (rows still in flight and work abandoned included; not what a restored
snapshot's rows had sampled before the checkpoint, which the run that saved it counted).
The collector reports each step's difference and `train.token_budget` adds them up, so
the budget sees every generated token once, whether or not its group is ever returned.
An engine without the call (optional otherwise) returns in each step all it generated in
it, so the lengths of the groups it returns are that count (`tokens_generated` below).

An engine class is built from `EngineParts` (`from_parts`), says how many prompts it holds
at most for given settings (`max_in_flight_for`, the surplus size a checkpoint records)
and whether it decodes in slots (`uses_slots`: `rollout.slots` must hold a group). It is
registered by name in `rollout/engines.py: ENGINES`, the values of `rollout.engine`.
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
    """A generator of scored groups (see the module docstring for the contract)."""

    group_size: int
    prompt_len: int  # the padded prompt length of the groups it returns
    max_new_tokens: int
    max_in_flight: int
    max_staleness: int  # steps a group may stay in flight (0: none outlives its step)

    def sync_weights(self, params, version: int = 0) -> None: ...

    def capacity(self) -> int: ...

    def admit(self, problems: Sequence[MathProblem], keys: jax.Array) -> None: ...

    def in_flight(self) -> int: ...

    def overdue(self, version: int) -> int: ...

    def finished(self) -> list[ScoredGroups]: ...

    def release(self) -> None: ...


def tokens_generated(engine: RolloutEngine) -> int | None:
    """The engine's `tokens_generated()`, or None when it has no such call (then it
    returns in each step all it generated in it; see the module docstring)."""
    count = getattr(engine, "tokens_generated", None)
    return None if count is None else int(count())


@dataclasses.dataclass(frozen=True)
class EngineParts:
    """Everything an engine is built from (`from_parts`).

    Attributes:
      graphdef, model_cfg: the policy's graph and architecture.
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
    model_cfg: ModelConfig
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
