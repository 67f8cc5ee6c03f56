"""The RL loop of docs/design.md. Each step runs named stages: collect (the collector asks
the rollout engine for scored groups until dynamic sampling has a full batch) -> update
(the jitted `rl_update`) -> bookkeeping (history table, metrics, compile counts, eval,
checkpoint). The loop only sequences them; `run/build.py: build_trainer` wires the
stages from the settings. Resumable exactly from any checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import jax
from tqdm import tqdm

from da3po_jax.config import Settings
from da3po_jax.parallel import is_main_process
from da3po_jax.rollout import Collector, RLCarry
from da3po_jax.runtime.checkpoint import Checkpointer, CheckpointError, check_compatible
from da3po_jax.runtime.logger import MetricsLogger
from da3po_jax.runtime.perf import CompileCounts, mfu_metrics
from da3po_jax.runtime.signals import StopRequest
from da3po_jax.update import PolicyUpdate, TrainState

log = logging.getLogger(__name__)


def _checkpoint(trainer: RLTrainer) -> tuple[dict, dict]:
    """(device tree, host JSON) of a checkpoint: the train state, the carry, the data
    position, and the work a partial-rollout engine carries into the next step
    (`engine`), so a resumed run goes on exactly from it."""
    tree = {"train": trainer.state, "carry": trainer.carry}
    host = {
        "data": trainer.collector.data_state(),
        "config": trainer.settings.fingerprint(),
        "eval_pending": trainer._eval_pending,
        "tokens_generated": trainer.tokens.total,
    }
    work = trainer.collector.engine_snapshot()  # None: the engine carries nothing
    if work is not None:
        tree["engine"], host["engine"] = work
    return tree, host


class NonFiniteTraining(RuntimeError):
    """`train.max_nonfinite_steps` steps in a row had a non-finite loss or gradient."""


class RLTrainer:
    """Runs `settings.train.steps` RL steps of the stages it is given.

    Args:
      settings: the run's `Settings`.
      state: the policy's `TrainState`; `carry` the `RLCarry` (both replaced every step).
      collector: the collect stage (owns the rollout engine and the data position).
      update: the update stage (`PolicyUpdate`).
      evaluate: `(params, step) -> eval metrics` (e.g. `evaluation.HeldoutEval`).
      checkpointer, logger: where state and metrics go.
      stop: set by SIGTERM / SIGINT handlers (`signals.stop_on_signals`).
      on_resumed: called once the checkpoint (if any) is restored.
      perf: extra metrics per step (compile counts, FLOP rates), or None.
    """

    def __init__(
        self,
        settings: Settings,
        state: TrainState,
        carry: RLCarry,
        collector: Collector,
        update: PolicyUpdate,
        evaluate: Callable[[Any, int], dict[str, float]],
        checkpointer: Checkpointer,
        logger: MetricsLogger,
        *,
        stop: StopRequest | None = None,
        on_resumed: Callable[[], None] | None = None,
        perf: StepPerf | None = None,
    ):
        self.settings, self.state, self.carry = settings, state, carry
        self.collector, self.update, self._evaluate = collector, update, evaluate
        self.checkpointer, self.logger, self.perf = checkpointer, logger, perf
        self.stop = stop or StopRequest()  # never set unless train() installs handlers
        self._on_resumed = on_resumed
        self._nonfinite = NonFiniteGuard(settings.train.max_nonfinite_steps)
        self.tokens = TokenBudget(settings.train.token_budget)
        self._eval_pending = False  # a due eval not run yet (a stop came first)
        self._saved_step: int | None = None

    def step(self) -> dict[str, float]:
        """One RL step: collect -> update -> history; returns its metrics."""
        t0 = time.perf_counter()
        rng, key = jax.random.split(self.state.rng)
        self.state = self.state.replace(rng=rng)
        version = int(self.state.step)  # the policy version (partial rollouts record it)
        collected, self.carry = self.collector.collect(self.state.params, self.carry, key, version)
        self.collector.release_cache()  # no KV cache in the update (but partial_kv="keep")
        t1 = time.perf_counter()
        prior = self.collector.prior(self.carry)
        self.state, update_metrics = self.update(
            self.state, collected.batch, collected.valid, prior
        )
        self.carry = self.collector.after_update(self.carry, collected)
        metrics = collected.metrics
        metrics.update({k: float(v) for k, v in jax.device_get(update_metrics).items()})
        t2 = time.perf_counter()
        metrics["optim/lr"] = self.update.lr(self.state)
        metrics.update({"time/collect": t1 - t0, "time/update": t2 - t1, "time/step": t2 - t0})
        generated = metrics.pop("_gen_tokens")
        metrics["throughput/gen_tokens_per_s"] = generated / max(metrics["time/rollout"], 1e-9)
        metrics.update(self.tokens.add(generated))
        if self.perf is not None:
            metrics.update(self.perf(int(self.state.step), t2 - t1))
        return metrics

    def run(self) -> list[dict[str, float]]:
        """Trains to `train.steps`; returns the eval results of this invocation."""
        train = self.settings.train
        start = self.restore()
        if self._on_resumed is not None:
            self._on_resumed()
        evals = []
        if (start == 0 and train.eval_every) or self._eval_pending:
            evals.append(self._log_eval())
            self._stop_if_asked()
        bar = _progress_bar(self.settings, start)
        self.collector.progress = bar.set_postfix_str  # dynamic sampling's progress
        for _ in bar:
            if self.tokens.reached:  # train.token_budget: the step before spent it
                break
            metrics = self.step()
            step = int(self.state.step)
            self.logger.write(step, metrics)
            self._nonfinite.check(step, metrics, self.checkpointer.latest_step)
            bar.set_postfix(_progress(metrics, self.tokens))
            every, last = train.eval_every, step == train.steps or self.tokens.reached
            self._eval_pending = bool(every and (step % every == 0 or last))
            self._stop_if_asked()  # before the eval: a preempted run has seconds, not minutes
            if self._eval_pending:
                evals.append(self._log_eval())
            if train.checkpoint_every and (step % train.checkpoint_every == 0 or last):
                self.save()
            self._stop_if_asked()
        self.checkpointer.wait()
        return evals

    def save(self) -> None:
        """Checkpoints the train state, the carry, the data position and the work in flight
        (once per step)."""
        step = int(self.state.step)
        if step != self._saved_step:
            self._saved_step = step
            self.checkpointer.save(step, *_checkpoint(self))

    def restore(self) -> int:
        """Resumes from the newest good checkpoint in the workdir (a damaged newer one is
        set aside with a warning); returns the step reached. Metrics rows of later steps
        (and, from step 0, all rows) are dropped: the run writes them again."""
        found = restore_run(
            self.checkpointer, self.settings, self.state, self.carry, self.collector
        )
        if found is None:
            self.logger.truncate(-1)
            return 0
        step, self.state, self.carry, self._eval_pending, self.tokens.total = found
        self._saved_step = step
        self.logger.truncate(step if step > 0 else -1)
        return step

    def _stop_if_asked(self) -> None:
        """On SIGTERM / SIGINT: saves the state reached (and whether its eval is still
        due), waits for the write, and raises `Preempted`."""
        if self.stop.requested:
            self.save()
            self.checkpointer.wait()
            where = self.checkpointer.directory
            self.stop.check(f"checkpoint of step {int(self.state.step)} saved in {where}")

    def evaluate(self) -> dict[str, float]:
        return self._evaluate(self.state.params, int(self.state.step))

    def _log_eval(self) -> dict[str, float]:
        metrics = self.evaluate()
        self._eval_pending = False
        step = int(self.state.step)
        if metrics:
            self.logger.write(step, metrics, kind="eval")
            log.info(
                "eval at step %d: %s", step, eval_line(metrics, self.settings.eval.num_samples)
            )
            self.logger.plot()
        return {"step": step, **metrics}

    def close(self) -> None:
        self.checkpointer.close()
        self.logger.close()


def eval_line(metrics: dict[str, float], k: int) -> str:
    """`eval/avg@k=0.xxx {tier: value, ...}` for the log, then each suite's avg@k and
    their average (`<name> avg@k=0.xxx`)."""
    key = f"eval/avg@{k}"
    parts = []
    if key in metrics:
        tiers = {
            n.rsplit("/", 1)[-1]: round(v, 3) for n, v in metrics.items() if n.startswith(key + "/")
        }
        parts.append(f"{key}={metrics[key]:.3f} {tiers}")
    for name, value in metrics.items():
        suite, _, rest = name.removeprefix("eval/").partition("/")
        if name.startswith("eval/") and rest.startswith("avg@") and "/" not in rest:
            parts.append(f"{suite} {rest}={value:.3f}")
    return "; ".join(parts)


def restore_run(checkpointer: Checkpointer, settings: Settings, state, carry, collector: Collector):
    """(step, state, carry, eval_pending, generated tokens) of the newest good checkpoint,
    with the collector's data position (and its engine's work in flight) restored; None
    when there is none."""
    path, fp = checkpointer.directory, settings.fingerprint()

    def like(host: dict) -> dict:
        tree = {"train": state, "carry": carry}
        if "engine" in host:  # partial rollouts: the work in flight
            tree["engine"] = collector.engine_snapshot_shapes(host["engine"])
        return tree

    def same_data(host: dict) -> None:
        saved = host.get("data")
        _restore_position(saved, collector.restore_data, collector.prompts_per_epoch, path)

    def check_host(host: dict) -> None:
        check_compatible(host.get("config", {}), fp, path)
        same_data(host)

    found = checkpointer.restore_latest(like, check_host)
    if found is None:
        return None
    step, tree, host = found
    if "engine" in host:
        collector.restore_engine(tree["engine"], host["engine"])
    same_data(host)
    log.info("resumed from %s at step %d", path, step)
    pending, tokens = bool(host.get("eval_pending", False)), int(host.get("tokens_generated", 0))
    return step, tree["train"], tree["carry"], pending, tokens


def check_same_data(saved: dict | None, iterator, path: str) -> None:
    """Restores a checkpoint's data position (`saved`) into `iterator`, refusing one made
    for other training prompts (other ids or order, another seed: `data.*` or
    `rollout.prompt_buckets` changed) as a configuration change, not as damage.

    Raises:
      CheckpointError: the position does not belong to these prompts (nothing changed).
    """
    _restore_position(saved, iterator.restore, iterator.epoch_length, path)


def _restore_position(
    saved: dict | None, restore: Callable[[dict], None], epoch_length: int, path: str
) -> None:
    """`check_same_data` through `restore` (`PromptIterator.restore`, or the collector's
    `restore_data`) for a stream of `epoch_length` prompts per epoch."""
    try:
        restore(saved if saved is not None else {})
    except ValueError as e:
        raise CheckpointError(
            f"checkpoint in {path!r} was written for other training data (now "
            f"{epoch_length} prompts per epoch; {e}). Nothing was changed; resume "
            "with the run's data and settings or use another --workdir."
        ) from e


class TokenBudget:
    """The response tokens generated so far (every sample of every generation round,
    groups that dynamic sampling drops included) against `train.token_budget` (0 = no
    budget): the run stops after the step that reaches it, so runs of different
    algorithms can be compared at equal generation.

    A step adds what the engine sampled during it (the collector's `_gen_tokens`, see
    `rollout/protocol.py: RolloutEngine.tokens_generated`), not the lengths of the groups
    it returned: with partial rollouts the rows still in flight when the run stops have
    generated tokens no batch ever returns, and a group carried across steps is counted as its
    tokens are sampled. The total is saved in the checkpoint (`tokens_generated`) and a
    restored engine does not count again what its rows in flight had sampled, so a
    resumed run counts every token once."""

    def __init__(self, budget: int):
        self.budget, self.total = budget, 0

    def add(self, generated: float) -> dict[str, float]:
        """Counts the tokens generated during one step; returns its metrics."""
        self.total += int(generated)
        return {"tokens/generated": float(generated), "tokens/generated_total": float(self.total)}

    @property
    def reached(self) -> bool:
        return self.budget > 0 and self.total >= self.budget


class NonFiniteGuard:
    """Counts steps in a row with a non-finite update (skipped in `rl_update`, so the
    parameters stay finite); `limit` of them (`train.max_nonfinite_steps`, 0 = never)
    stop the run before anything is saved or exported."""

    def __init__(self, limit: int):
        self.limit, self.run = limit, 0

    def check(self, step: int, metrics: dict[str, float], last_saved: Callable) -> None:
        skipped = int(metrics.get("optim/nonfinite_updates", 0))
        if skipped == 0:
            self.run = 0
            return
        self.run += 1
        log.warning(
            "step %d: %d updates skipped for a non-finite loss, gradient or update norm "
            "(loss/total=%s, optim/grad_norm=%s); %d such steps in a row",
            step,
            skipped,
            metrics.get("loss/total"),
            metrics.get("optim/grad_norm"),
            self.run,
        )
        if self.limit and self.run >= self.limit:
            last = last_saved()
            raise NonFiniteTraining(
                f"training stopped at step {step}: {self.run} steps in a row had "
                "a non-finite loss, gradient or update norm (train.max_nonfinite_steps="
                f"{self.limit}); those updates were skipped and nothing was saved after them "
                f"(last checkpoint: {'none' if last is None else f'step {last}'}). "
                "Lower optim.lr, check the data and the model weights."
            )


class StepPerf:
    """Per-step performance metrics: compile counts of the step's jitted functions (a
    new compile after the first step is logged as a warning) and the update's model
    FLOP/s and MFU (`runtime/perf.py`)."""

    def __init__(
        self,
        counts: CompileCounts,
        update_flops: float | Callable[[], float],
        peak: Callable[[], float],
        devices: int,
    ):
        """`update_flops`: the update's model FLOPs, or a function giving those of the
        update just run (a packed update's depend on the batch's lengths)."""
        self.counts, self.update_flops, self._peak, self.devices = (
            counts,
            update_flops,
            peak,
            devices,
        )

    def __call__(self, step: int, update_seconds: float) -> dict[str, float]:
        metrics = self.counts.check(step)
        flops = self.update_flops() if callable(self.update_flops) else self.update_flops
        rate = mfu_metrics(flops, update_seconds, self._peak(), num_devices=self.devices)
        return {**metrics, **rate}


def _progress_bar(settings: Settings, start: int) -> tqdm:
    if start < settings.train.steps:
        log.info("step %d compiles the sampler and the update (later steps reuse them)", start + 1)
    return tqdm(
        range(start, settings.train.steps),
        initial=start,
        total=settings.train.steps,
        desc=f"{settings.algo}",
        dynamic_ncols=True,
        disable=not is_main_process(),
    )


def _progress(metrics: dict[str, float], tokens: TokenBudget) -> dict[str, str]:
    """Progress-bar fields (with `train.token_budget`, the share of it spent); a step that
    trained on carried groups only (no generation round) has no rollout metrics."""
    spent = {"budget": f"{tokens.total / tokens.budget:.0%}"} if tokens.budget else {}
    if "reward/mean" not in metrics:
        return {"rounds": "0 (carried surplus)", **spent}
    return {
        "reward": f"{metrics['reward/mean']:.3f}",
        "acc": f"{metrics['reward/acc']:.3f}",
        "tok_s": f"{metrics['throughput/gen_tokens_per_s']:.0f}",
        **spent,
    }
