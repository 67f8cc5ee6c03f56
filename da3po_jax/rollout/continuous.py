"""The continuous-batching rollout engine: a `SlotDecoder` keeps S decode slots busy, a
prompt starting whenever G slots are free.

Each call of `finished()` runs one decode call (K steps), hands the groups it finished to
a scoring thread (decode + reward workers, `rollout/scoring.py`, overlapping the next
decode calls) and returns the groups whose scoring is done, packed in batches of
`return_size` = S / G groups (padded). A group's slots free up row by row, so more groups
than S / G are in flight when the slots are full: the engine holds at most 4 x S / G
prompts, which bounds the dynamic-sampling surplus.

Partial rollouts (`max_staleness` > 0): `release` keeps the rows in flight (their keys
and values too with `partial_kv="keep"`; with `"recompute"` it frees the cache, and the
next `sync_weights` of a new version prefills every row in flight anew), and a group may
stay in flight for up to `max_staleness` optimizer steps: `overdue(version)` counts the
groups admitted at a version <= `version - max_staleness`, which the collector waits for
before it ends the step (docs/algorithms.md, "Partial rollouts"). The returned batches
then carry each token's policy version (`GroupBatch.version`).

Finished groups come back on a fixed schedule, not as their scoring happens to end: a
decode call's groups are scored while the next call decodes and are returned by that next
call (or, once nothing decodes, by the call after their own). So the groups a step keeps
do not depend on timing, and every host returns the same ones.

Several processes: the decoder splits the slots over the hosts' devices and keeps the
same bookkeeping on every host (`sampling/continuous.py`); each host scores every
process_count-th finished group (from its process index) and the verdicts are summed over
the hosts, so every host packs the same batches.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from concurrent import futures

import jax
import numpy as np
from jax.sharding import Mesh

from da3po_jax.data import MathProblem
from da3po_jax.parallel import shard_batch, sum_counts_over_hosts, sum_over_hosts
from da3po_jax.rewards import RewardScorer
from da3po_jax.rollout.batch import GroupBatch, GroupScores, ScoredGroups
from da3po_jax.rollout.encoder import PromptEncoder
from da3po_jax.rollout.protocol import EngineParts
from da3po_jax.rollout.scoring import Verdicts, score_responses
from da3po_jax.sampling.continuous import (
    FinishedGroup,
    SlotConfig,
    SlotDecoder,
    group_shapes,
    stack_groups,
    unstack_groups,
)
from da3po_jax.sampling.sampler import SampleOutput


class ContinuousEngine:
    """Continuous batching behind the engine protocol (see the module docstring).

    Args:
      decoder: the policy's `SlotDecoder` (its G = the group size).
      encoder: prompt tokenisation.
      scorer: reward worker pool (used from the scoring thread only while generating).
      prompt_len: the prompt length of the returned batches (training groups).
      index_of: dataset index of a problem id (-1 for others; the history estimator).
      mesh: returned batches are split over its batch axes. None: one device.
      max_in_flight: prompts held at once at most (`max_in_flight_for`).
      max_staleness: optimizer steps a group may stay in flight (0: every group admitted
        in a step finishes in it).
      partial_kv: `"keep"` or `"recompute"` the keys/values of rows carried into a step.
    """

    uses_slots = True

    def __init__(
        self,
        decoder: SlotDecoder,
        encoder: PromptEncoder,
        scorer: RewardScorer,
        prompt_len: int,
        index_of: dict[str, int],
        mesh: Mesh | None = None,
        *,
        max_in_flight: int,
        max_staleness: int = 0,
        partial_kv: str = "keep",
    ):
        self.decoder, self.encoder, self.scorer, self.mesh = decoder, encoder, scorer, mesh
        self.index_of = index_of
        g, s = decoder.group_size, decoder.slot_config.slots
        self.group_size, self.prompt_len = g, prompt_len
        self.max_new_tokens = decoder.gen.max_new_tokens
        self.max_in_flight = max_in_flight
        if partial_kv not in ("keep", "recompute"):
            raise ValueError(f"partial_kv={partial_kv!r}: expected 'keep' or 'recompute'")
        self.max_staleness, self.partial_kv = max_staleness, partial_kv
        self.return_size = self.return_size_for(0, s, g)  # the round size plays no part
        self._params = None
        self._in_flight = 0
        # finished groups being scored: (future, their admission versions)
        self._scoring: collections.deque[tuple[futures.Future, list[int]]] = collections.deque()
        self._pool = futures.ThreadPoolExecutor(1, thread_name_prefix="da3po-scoring")
        self._rollout_s = 0.0  # wall time in `finished` not yet reported
        # response tokens sampled by rows no longer in the decoder (`tokens_generated`)
        self._tokens_done = 0

    @classmethod
    def from_parts(cls, parts: EngineParts) -> ContinuousEngine:
        """An engine of `parts.slots` slots (freed by `release`)."""
        slots = SlotConfig(
            slots=parts.slots,
            prompt_len=parts.prompt_len,
            steps_per_call=parts.steps_per_call,
            block=parts.attention_block,
        )
        decoder = SlotDecoder(parts.graphdef, parts.model_config, parts.gen, slots, parts.mesh)
        return cls(
            decoder,
            parts.encoder,
            parts.scorer,
            parts.prompt_len,
            parts.index_of,
            parts.mesh,
            max_in_flight=cls.max_in_flight_for(
                parts.round_size, parts.slots, parts.gen.num_samples
            ),
            max_staleness=parts.max_staleness,
            partial_kv=parts.partial_kv,
        )

    @staticmethod
    def max_in_flight_for(round_size: int, slots: int, group_size: int) -> int:
        """4 x S / G prompts: a group's slots free up row by row, so more groups than
        S / G are in flight when the slots are full."""
        return 4 * max(1, slots // group_size)

    @staticmethod
    def return_size_for(round_size: int, slots: int, group_size: int) -> int:
        """S / G groups per returned batch (at least one)."""
        return max(1, slots // group_size)

    def sync_weights(self, params, version: int = 0) -> None:
        """Generation goes on with `params`, policy version `version`; with
        `partial_kv="recompute"` the rows carried from an older version are prefilled
        anew under them."""
        self._params = params
        changed = version != self.decoder.version
        self.decoder.set_version(version)
        if changed and self.partial_kv == "recompute" and self.decoder.live_groups():
            self.decoder.refill(params)

    def capacity(self) -> int:
        return max(0, min(self.decoder.free_groups(), self.max_in_flight - self._in_flight))

    def admit(self, problems: Sequence[MathProblem], keys: jax.Array) -> None:
        for p, key in zip(problems, keys):
            self.decoder.submit(p, self.encoder.ids(p), key)
        self._in_flight += len(problems)

    def in_flight(self) -> int:
        return self._in_flight

    def overdue(self, version: int) -> int:
        """Prompts in flight admitted at a version <= `version - max_staleness` (all of
        them when it is 0): those must come back within the step of weights `version`."""
        if not self.max_staleness:
            return self._in_flight
        limit = version - self.max_staleness
        live = sum(gr.start_version <= limit for gr in self.decoder.live_groups())
        scoring = sum(v <= limit for _, starts in self._scoring for v in starts)
        return live + scoring

    def finished(self) -> list[ScoredGroups]:
        if not self._in_flight:
            return []
        if self._params is None:
            raise RuntimeError("ContinuousEngine.finished: call sync_weights(params) first")
        t0 = time.perf_counter()
        newest = 0  # the scoring started by this call, which overlaps the next one
        if self.decoder.busy():
            groups = self.decoder.step(self._params)
            self._tokens_done += sum(int(gr.lengths.sum()) for gr in groups)
            if groups:
                starts = [gr.start_version for gr in groups]
                self._scoring.append((self._pool.submit(self._score, groups), starts))
                newest = 1
        ready = []
        while len(self._scoring) > newest:  # a fixed schedule, not whichever is done
            ready.extend(self._pack(*self._gather(*self._scoring.popleft()[0].result())))
        self._rollout_s += time.perf_counter() - t0
        if ready:
            ready[0].scores.seconds["rollout"] = self._rollout_s
            self._rollout_s = 0.0
        self._in_flight -= sum(len(r.problems) for r in ready)
        return ready

    def release(self) -> None:
        """Frees the slots; work still in flight (only after an error) is abandoned. With
        partial rollouts the groups in flight are kept for the next step (with
        `partial_kv="recompute"` without their keys/values)."""
        if self.max_staleness and self._in_flight:
            if self.partial_kv == "recompute":
                self.decoder.drop_cache()
            return
        self.abandon()

    def tokens_generated(self) -> int:
        """Response tokens sampled so far (`RolloutEngine`): those of every group the
        decoder finished (returned, being scored or abandoned since) and those the rows in
        flight have sampled up to now, less those a restored snapshot's rows came with."""
        return self._tokens_done + self.decoder.tokens_in_flight()

    def abandon(self) -> None:
        """Frees the slots and abandons whatever is in flight (its tokens stay counted in
        `tokens_generated`: they were sampled)."""
        self._tokens_done += self.decoder.tokens_in_flight()
        for f, _ in self._scoring:
            f.cancel()
        futures.wait([f for f, _ in self._scoring])  # the scorer is free before anyone reuses it
        self._scoring.clear()
        self._in_flight = 0
        self.decoder.clear()

    # ------------------------------------------------------------- checkpoints
    def snapshot(self) -> tuple[dict, dict]:
        """The work in flight, for a checkpoint (partial rollouts): (arrays, meta), the
        decoder's (`SlotDecoder.snapshot`) plus the finished groups still being scored
        (saved as groups and scored again on restore; the verifier is deterministic)."""
        arrays, meta = self.decoder.snapshot(lambda p: p.to_dict())
        scoring = [f.result()[0] for f, _ in self._scoring]
        flat = [gr for groups in scoring for gr in groups]
        if flat:
            arrays["scoring"] = self.decoder.replicate(stack_groups(flat))
        meta["scoring_sizes"] = [len(g) for g in scoring]
        meta["scoring"] = [[gr.tag.to_dict(), gr.start_version, 0] for gr in flat]
        meta["in_flight"] = self._in_flight
        return arrays, meta

    def snapshot_shapes(self, meta: dict) -> dict:
        """The abstract arrays of a `snapshot` with this `meta` (the restore target)."""
        out = self.decoder.snapshot_shapes(meta)
        if meta["scoring"]:
            like = group_shapes(len(meta["scoring"]), self.group_size, self.max_new_tokens)
            out["scoring"] = self.decoder.replicate(like, abstract=True)
        return out

    def restore(self, arrays: dict, meta: dict) -> None:
        """Puts a `snapshot` back: the decoder's state, and the finished groups that were
        being scored submitted for scoring again, in their order."""
        self.abandon()
        self.decoder.restore(arrays, meta, _problem)
        # the rows' tokens up to the checkpoint were counted by the run that saved it
        self._tokens_done -= self.decoder.tokens_in_flight()
        flat = unstack_groups(arrays.get("scoring"), meta["scoring"], _problem)
        for size in meta["scoring_sizes"]:
            groups, flat = flat[:size], flat[size:]
            starts = [gr.start_version for gr in groups]
            self._scoring.append((self._pool.submit(self._score, groups), starts))
        self._in_flight = meta["in_flight"]

    def _score(self, groups: list[FinishedGroup]) -> tuple[list, list[int], Verdicts, float]:
        """The scoring thread: (groups, the indices of those this host scores (every
        process_count-th from its index), their verdicts [F_host, G], seconds)."""
        t0 = time.perf_counter()
        mine = list(range(jax.process_index(), len(groups), jax.process_count()))
        g = self.group_size
        verdicts = Verdicts(np.zeros((0, g), np.float32), np.zeros((0, g), np.float32), {})
        if mine:
            verdicts = score_responses(
                self.encoder.tokenizer,
                self.scorer,
                np.stack([groups[i].tokens for i in mine]),
                np.stack([groups[i].lengths for i in mine]),
                [groups[i].tag.answer for i in mine],
            )
        return groups, mine, verdicts, time.perf_counter() - t0

    def _gather(self, groups, mine: list[int], verdicts: Verdicts, seconds: float):
        """(groups, the verdicts of all of them [F, G], seconds): the hosts' shares summed
        (each group is scored by one host, the others add zeros)."""
        if jax.process_count() == 1:
            return groups, verdicts, seconds
        shape = (len(groups), self.group_size)
        both = np.zeros((2, *shape), np.float32)
        both[0, mine], both[1, mine] = verdicts.correct, verdicts.rewards
        both = sum_over_hosts(both)
        return groups, Verdicts(both[0], both[1], sum_counts_over_hosts(verdicts.stats)), seconds

    def _pack(self, groups, verdicts: Verdicts, seconds: float) -> list[ScoredGroups]:
        """Batches of `return_size` groups (the last padded with copies, marked invalid)."""
        out, u = [], self.return_size
        correct, rewards = verdicts.correct, verdicts.rewards
        for start in range(0, len(groups), u):
            real = min(u, len(groups) - start)
            idx = list(range(start, start + real)) + [start] * (u - real)
            batch = self._batch([groups[i] for i in idx], correct[idx], rewards[idx])
            first = start == 0  # the call's verifier counts and time go with its first batch
            scores = GroupScores(
                correct=correct[start : start + real],
                rewards=rewards[start : start + real],
                lengths=np.stack([gr.lengths for gr in groups[start : start + real]]),
                truncated=np.stack([gr.truncated for gr in groups[start : start + real]]),
                stats=verdicts.stats if first else {},
                seconds={"rollout": 0.0, "scoring": seconds if first else 0.0},
            )
            problems = [gr.tag for gr in groups[start : start + real]]
            out.append(ScoredGroups(batch, scores, problems, np.arange(u) < real))
        return out

    def _batch(self, chunk: list[FinishedGroup], correct, rewards) -> GroupBatch:
        """The device batch of finished groups (split over the mesh's batch axes)."""
        problems = [gr.tag for gr in chunk]
        ptok, pmask = self.encoder.pad(problems, self.prompt_len)

        def stack(name):
            return np.stack([getattr(gr, name) for gr in chunk])

        samples = SampleOutput(
            tokens=stack("tokens"),
            logp=stack("logp"),
            sample_logp=stack("sample_logp"),
            mask=stack("mask"),
            lengths=stack("lengths"),
            truncated=stack("truncated"),
            num_steps=np.zeros((), np.int32),
        )
        index = np.asarray([self.index_of.get(p.id, -1) for p in problems], np.int32)
        batch = GroupBatch.from_samples(ptok, pmask, samples, rewards, correct, index)
        if self.max_staleness:
            batch = batch.replace(version=stack("version"))
        return shard_batch(batch, self.mesh) if self.mesh is not None else jax.device_put(batch)


def _problem(fields: dict) -> MathProblem:
    """A `MathProblem` from its `to_dict()`."""
    return MathProblem(**fields)
