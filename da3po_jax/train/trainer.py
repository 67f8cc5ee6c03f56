"""The RL loop of docs/design.md: rollout -> rewards -> dynamic-sampling rounds -> advantages
(DAA) -> mini-batch updates -> eval -> checkpoint, resumable exactly from any checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from tqdm import tqdm

from da3po_jax.data import PromptIterator
from da3po_jax.parallel import replicated, to_host
from da3po_jax.rewards import RewardScorer
from da3po_jax.rl import (
    OverlongConfig,
    PromptHistory,
    ds_add_round,
    init_prior_state,
    prior_from_state,
    update_history,
    update_prior_state,
)
from da3po_jax.sampling import Sampler
from da3po_jax.sampling.host import pick_bucket
from da3po_jax.train import config as config_lib
from da3po_jax.train.checkpoint import Checkpointer, CheckpointError, check_compatible
from da3po_jax.train.evaluation import evaluate
from da3po_jax.train.logger import MetricsLogger
from da3po_jax.train.rl_step import RLStepConfig, rl_update
from da3po_jax.train.rollout import (
    PromptEncoder,
    Rollout,
    abstract_round,
    ds_round_update,
    empty_buffer,
)
from da3po_jax.train.setup import Datasets, generate_configs
from da3po_jax.train.signals import StopRequest
from da3po_jax.train.state import init_train_state, make_optimizer, optimizer_updates

log = logging.getLogger(__name__)


class NonFiniteTraining(RuntimeError):
    """`train.max_nonfinite_steps` steps in a row had a non-finite loss or gradient."""


def fingerprint(cfg) -> dict[str, Any]:
    """The config fields a checkpoint must agree with to be resumed."""
    teacher = None  # frozen and not checkpointed: a resume must use the same one
    if cfg.algo in config_lib.DISTILLATION:
        teacher = cfg.teacher.path or f"preset:{cfg.teacher.preset}:seed{cfg.teacher.seed}"
    return {
        "algo": cfg.algo,
        "model": cfg.model.path or cfg.model.preset,
        "rollout.group_size": cfg.rollout.group_size,
        "rl.train_prompts": cfg.rl.train_prompts,
        "rollout.max_new_tokens": cfg.rollout.max_new_tokens,
        "teacher": teacher,
    }


class RLTrainer:
    """Owns the device state (policy, optimizer, DS surplus, DAA prior/history) and the
    host state (data position), and runs `cfg.train.steps` RL steps. OPD / RA-OPD also
    take the frozen `teacher` (never updated, never checkpointed)."""

    def __init__(
        self,
        cfg,
        workdir: str,
        model: nnx.Module,
        encoder: PromptEncoder,
        data: Datasets,
        scorer: RewardScorer,
        mesh: Mesh | None = None,
        teacher: nnx.Module | None = None,
        stop: StopRequest | None = None,
        on_resumed: Callable[[], None] | None = None,
    ):
        self.cfg, self.workdir, self.data, self.mesh = cfg, workdir, data, mesh
        self.stop = stop or StopRequest()  # never set unless train() installs handlers
        self._on_resumed = on_resumed  # called once the checkpoint (if any) is restored
        self._nonfinite_run = 0  # steps in a row with a skipped non-finite update
        self._eval_pending = False  # a due eval not run yet (a stop came first)
        self._saved_step: int | None = None
        self.g = cfg.rollout.group_size
        self.capacity = cfg.rl.train_prompts
        self.round_size = cfg.rollout.prompts_per_round if cfg.ds.enable else self.capacity
        updates = cfg.rl.num_iterations * (cfg.rl.train_prompts // cfg.rl.mini_batch_prompts)
        self.tx, self.schedule = make_optimizer(cfg.optim, cfg.train.steps, updates)
        self.graphdef, self.state = init_train_state(model, self.tx, cfg.seed, mesh)
        self.ref_params = None
        if cfg.loss.kl_coef > 0:  # frozen copy: the policy's buffers are donated each step
            self.ref_params = jax.tree.map(jnp.copy, self.state.params)
        self.teacher_graphdef, self.teacher_params = None, None
        if teacher is not None:
            self.teacher_graphdef, self.teacher_params = nnx.split(teacher)
        self.gen, self.eval_gen = generate_configs(cfg, encoder.tokenizer)
        self.train_prompt_len = pick_bucket(
            max(len(encoder.ids(p)) for p in data.train), cfg.rollout.prompt_buckets
        )
        index_of = {p.id: i for i, p in enumerate(data.train)}
        self.rollout = Rollout(
            Sampler(self.graphdef, model.cfg, self.gen),
            encoder,
            scorer,
            self.gen,
            self.train_prompt_len,
            index_of,
            mesh,
        )
        # Every host walks the same global stream; each feeds its rows of every batch.
        self.iterator = PromptIterator(data.train, seed=cfg.seed)
        self.step_cfg = RLStepConfig(
            group_size=self.g,
            mini_batch_prompts=cfg.rl.mini_batch_prompts,
            micro_batch_prompts=cfg.rl.micro_batch_prompts,
            num_iterations=cfg.rl.num_iterations,
            loss=config_lib.loss_config(cfg),
            adv=config_lib.advantage_config(cfg),
            daa=config_lib.daa_config(cfg),
            overlong=OverlongConfig(
                max_len=cfg.rollout.max_new_tokens,
                buffer_len=cfg.overlong.buffer,
                penalty=cfg.overlong.penalty,
                filter=cfg.overlong.filter,
            ),
            recompute_logp_old=cfg.rollout.logp_old == "recompute",
            opd=config_lib.opd_config(cfg),
            ra_opd=config_lib.ra_opd_config(cfg),
        )
        if self.step_cfg.opd is not None and teacher is None:
            raise ValueError(f"algo={cfg.algo!r} needs the teacher model (config.teacher)")
        self.aux = {
            "surplus": empty_buffer(abstract_round(self.rollout, self.round_size), self.round_size),
            "prior": init_prior_state(),
            "history": {
                "success": jnp.zeros(len(data.train)),
                "failure": jnp.zeros(len(data.train)),
            },
        }
        if mesh is not None:
            self.aux = jax.device_put(self.aux, replicated(mesh))
        state_shardings = jax.tree.map(lambda x: x.sharding, self.state) if mesh else None
        self._update = jax.jit(
            rl_update,
            static_argnums=(0, 1, 2),
            static_argnames=("teacher_graphdef",),
            donate_argnums=(3,),
            out_shardings=(state_shardings, replicated(mesh)) if mesh else None,
        )
        self._ds_update = jax.jit(ds_round_update, static_argnums=(2, 3, 4, 5, 6, 7))
        self._seed_buffer = jax.jit(ds_add_round)
        self._prior_update = jax.jit(update_prior_state, static_argnums=(3,))
        self.checkpointer = Checkpointer(workdir, cfg.train.keep_checkpoints, finite=("['train']",))
        self.logger = MetricsLogger(
            workdir,
            enabled=jax.process_index() == 0,
            wandb_project=cfg.train.wandb_project,
            config=cfg.to_dict(),
        )

    # ------------------------------------------------------------------ checkpoints
    def _tree(self) -> dict[str, Any]:
        return {"train": self.state, **self.aux}

    def save(self) -> None:
        step = int(self.state.step)
        if step == self._saved_step:
            return
        self._saved_step = step
        host = {
            "data": self.iterator.state.to_dict(),
            "config": fingerprint(self.cfg),
            "eval_pending": self._eval_pending,
        }
        self.checkpointer.save(step, self._tree(), host)

    def maybe_restore(self) -> int:
        """Resumes from the newest good checkpoint in the workdir (a damaged newer one is
        set aside with a warning); returns the step reached. Metrics rows of later steps
        (and, from step 0, all rows) are dropped: the run writes them again."""
        path = self.checkpointer.directory
        fp = fingerprint(self.cfg)
        found = self.checkpointer.restore_latest(
            self._tree(), lambda host: check_compatible(host.get("config", {}), fp, path)
        )
        if found is None:
            self.logger.truncate(-1)
            return 0
        step, tree, host = found
        self._saved_step = step
        state = tree.pop("train")
        try:
            self.iterator.restore(host["data"])
        except (KeyError, ValueError) as e:
            raise CheckpointError(
                f"checkpoint in {path!r}: data position unusable ({e}). "
                "Nothing was changed; use another --workdir."
            ) from e
        self.state, self.aux = state, tree
        self._eval_pending = bool(host.get("eval_pending", False))
        self.logger.truncate(step if step > 0 else -1)
        log.info("resumed from %s at step %d", path, step)
        return step

    # ------------------------------------------------------------------ one step
    def collect(self, keys: jax.Array) -> tuple[Any, list, dict[str, float]]:
        """Generation rounds until the batch holds `train_prompts` kept groups (or the
        round cap); surplus kept groups are carried to the next step.

        Returns (buffer, every round's (prompt index, correct) arrays, metrics)."""
        cfg, n = self.cfg, self.round_size
        max_rounds = cfg.ds.max_rounds if cfg.ds.enable else 1
        buffer = empty_buffer(self.aux["surplus"].items, self.capacity)
        buffer, surplus = self._seed_buffer(
            buffer, self.aux["surplus"].items, self.aux["surplus"].valid
        )
        acc = np.zeros(max_rounds * n, np.float32)
        acc_valid = np.zeros(max_rounds * n, np.bool_)
        host = _RoundStats()
        generated: list[tuple[jax.Array, jax.Array]] = []  # (prompt index, correct)
        rounds = 0
        while int(buffer.count) < self.capacity and rounds < max_rounds:
            problems = self.iterator.next_batch(n)
            res = self.rollout.round(self.state.params, problems, keys[rounds])
            items = res.items
            if self._tracks_history():  # what the table knew before generation, carried along
                items = items.replace(history=self._history_of(items.prompt_index))
            generated.append((res.items.prompt_index, res.items.correct))
            buffer, surplus, keep, mu = self._ds_update(
                buffer,
                items,
                bool(cfg.ds.enable),
                cfg.ds.metric,
                self.g,
                cfg.rollout.max_new_tokens,
                cfg.overlong.buffer,
                cfg.overlong.penalty,
            )
            acc[rounds * n : (rounds + 1) * n] = to_host(mu)
            acc_valid[rounds * n : (rounds + 1) * n] = True
            host.add(res, to_host(keep))
            rounds += 1
        count = int(buffer.count)
        if count < self.capacity:
            log.warning(
                "dynamic sampling reached ds.max_rounds=%d with %d of %d groups; "
                "training on what was kept",
                max_rounds,
                count,
                self.capacity,
            )
        self.aux["surplus"] = surplus
        self.aux["prior"] = self._prior_update(
            self.aux["prior"], jnp.asarray(acc), jnp.asarray(acc_valid), cfg.daa.prior_ema
        )
        metrics = host.summary(rounds, count, self.capacity, int(surplus.count))
        return buffer, generated, metrics

    def _prior(self):
        """The Beta prior of the bayes / history estimators (None for the others)."""
        daa = self.step_cfg.daa
        if daa is None or daa.estimator not in ("bayes", "history"):
            return None
        return prior_from_state(self.aux["prior"], self.g)

    def _tracks_history(self) -> bool:
        daa = self.step_cfg.daa
        return daa is not None and daa.estimator == "history"

    def _history_of(self, prompt_index: jax.Array) -> PromptHistory:
        """The table's counts for the prompts of a round (0 for prompts outside it)."""
        table = self.aux["history"]
        known = prompt_index >= 0
        safe = jnp.maximum(prompt_index, 0)
        return PromptHistory(
            jnp.where(known, table["success"][safe], 0.0),
            jnp.where(known, table["failure"][safe], 0.0),
        )

    def _update_history(self, generated) -> None:
        """Adds this step's outcomes to the per-prompt history table: every generated group,
        including those dynamic sampling filtered (all wrong / all right), which carry most
        of the information about a hard prompt (docs/algorithms.md, `history`).

        Runs after the update, so the step's own groups never see their counts."""
        if not generated:
            return
        table = add_to_history(
            {k: to_host(v) for k, v in self.aux["history"].items()},
            np.concatenate([to_host(i) for i, _ in generated]),
            np.concatenate([to_host(c) for _, c in generated]),
            self.g,
            self.cfg.daa.history_decay,
        )
        placed = jax.device_put(table, replicated(self.mesh)) if self.mesh else table
        self.aux["history"] = {k: jnp.asarray(v) for k, v in placed.items()}

    def step(self) -> dict[str, float]:
        t0 = time.perf_counter()
        keys = jax.random.split(self.state.rng, 1 + max(self.cfg.ds.max_rounds, 1))
        self.state = self.state.replace(rng=keys[0])
        buffer, generated, metrics = self.collect(keys[1:])
        self.rollout.sampler.clear()  # no KV cache during the update (as plan.py counts)
        t1 = time.perf_counter()
        self.state, dev = self._update(
            self.graphdef,
            self.tx,
            self.step_cfg,
            self.state,
            buffer.items,
            buffer.valid,
            self._prior(),
            self.ref_params,
            self.teacher_params,
            teacher_graphdef=self.teacher_graphdef,
        )
        if self._tracks_history():
            self._update_history(generated)
        metrics.update({k: float(v) for k, v in jax.device_get(dev).items()})
        t2 = time.perf_counter()
        # the rate of the step's last optimizer update (the schedule counts updates)
        metrics["optim/lr"] = float(self.schedule(max(optimizer_updates(self.state) - 1, 0)))
        metrics.update({"time/collect": t1 - t0, "time/update": t2 - t1, "time/step": t2 - t0})
        metrics["throughput/gen_tokens_per_s"] = metrics.pop("_gen_tokens") / max(
            metrics["time/rollout"], 1e-9
        )
        return metrics

    def _check_finite(self, metrics: dict[str, float]) -> None:
        """Counts steps in a row with a non-finite update (skipped in `rl_update`, so the
        parameters stay finite); `train.max_nonfinite_steps` of them stop the run before
        anything is saved or exported."""
        if metrics.get("optim/nonfinite_updates", 0) == 0:
            self._nonfinite_run = 0
            return
        self._nonfinite_run += 1
        limit = self.cfg.train.max_nonfinite_steps
        step = int(self.state.step)
        log.warning(
            "step %d: %d updates skipped for a non-finite loss, gradient or update norm "
            "(loss/total=%s, optim/grad_norm=%s); %d such steps in a row",
            step,
            int(metrics["optim/nonfinite_updates"]),
            metrics.get("loss/total"),
            metrics.get("optim/grad_norm"),
            self._nonfinite_run,
        )
        if limit and self._nonfinite_run >= limit:
            last = self.checkpointer.latest_step()
            raise NonFiniteTraining(
                f"training stopped at step {step}: {self._nonfinite_run} steps in a row had "
                "a non-finite loss, gradient or update norm (train.max_nonfinite_steps="
                f"{limit}); those updates were skipped and nothing was saved after them "
                f"(last checkpoint: {'none' if last is None else f'step {last}'}). Lower "
                "optim.lr, check the data and the model weights."
            )

    def evaluate(self) -> dict[str, float]:
        problems = self.data.heldout[: self.cfg.eval.max_prompts or None]
        if not problems:
            return {}
        rng = jax.random.fold_in(jax.random.PRNGKey(self.cfg.seed + 1), int(self.state.step))
        return evaluate(
            self.rollout,
            self.state.params,
            problems,
            self.eval_gen,
            min(self.cfg.eval.prompts_per_call, len(problems)),
            rng,
        )

    # ------------------------------------------------------------------ the loop
    def run(self) -> list[dict[str, float]]:
        """Trains to `train.steps`; returns the eval results of this invocation."""
        cfg = self.cfg
        start = self.maybe_restore()
        if self._on_resumed is not None:
            self._on_resumed()
        evals = []
        if (start == 0 and cfg.train.eval_every) or self._eval_pending:
            evals.append(self._log_eval())
            self._stop_if_asked()
        bar = tqdm(
            range(start, cfg.train.steps),
            initial=start,
            total=cfg.train.steps,
            desc=f"{cfg.algo}",
            dynamic_ncols=True,
            disable=jax.process_index() != 0,
        )
        for _ in bar:
            metrics = self.step()
            step = int(self.state.step)
            self.logger.write(step, metrics)
            self._check_finite(metrics)
            bar.set_postfix(_progress(metrics))
            last = step == cfg.train.steps
            self._eval_pending = bool(
                cfg.train.eval_every and (step % cfg.train.eval_every == 0 or last)
            )
            self._stop_if_asked()  # before the eval: a preempted run has seconds, not minutes
            if self._eval_pending:
                evals.append(self._log_eval())
            if cfg.train.checkpoint_every and (step % cfg.train.checkpoint_every == 0 or last):
                self.save()
            self._stop_if_asked()
        self.checkpointer.wait()
        return evals

    def _stop_if_asked(self) -> None:
        """On SIGTERM / SIGINT: saves the state reached (and whether its eval is still
        due), waits for the write, and raises `Preempted`."""
        if not self.stop.requested:
            return
        self.save()
        self.checkpointer.wait()
        step = int(self.state.step)
        self.stop.check(f"checkpoint of step {step} saved in {self.checkpointer.directory}")

    def _log_eval(self) -> dict[str, float]:
        metrics = self.evaluate()
        self._eval_pending = False
        step = int(self.state.step)
        if metrics:
            self.logger.write(step, metrics, kind="eval")
            key = f"eval/avg@{self.cfg.eval.num_samples}"
            tiers = {
                k.rsplit("/", 1)[-1]: round(v, 3)
                for k, v in metrics.items()
                if k.startswith(key + "/")
            }
            log.info("eval at step %d: %s=%.3f %s", step, key, metrics[key], tiers)
        return {"step": step, **metrics}

    def close(self) -> None:
        self.checkpointer.close()
        self.logger.close()


def _progress(metrics: dict[str, float]) -> dict[str, str]:
    """Progress-bar fields; a step that trained on carried groups only (no generation
    round) has no rollout metrics."""
    if "reward/mean" not in metrics:
        return {"rounds": "0 (carried surplus)"}
    return {
        "reward": f"{metrics['reward/mean']:.3f}",
        "acc": f"{metrics['reward/acc']:.3f}",
        "tok_s": f"{metrics['throughput/gen_tokens_per_s']:.0f}",
    }


def add_to_history(
    table: dict[str, np.ndarray], idx: np.ndarray, correct: np.ndarray, g: int, decay: float
) -> dict[str, np.ndarray]:
    """The history table after the groups `idx` [M] (dataset indices, -1 = not in the
    table) with verdicts `correct` [M, G], applied in order (`update_history` each).

    A prompt drawn twice in one step (an epoch boundary) gets both updates, one after
    the other: s <- decay (decay s + k1) + k2. A plain scatter would keep only one.
    """
    table = {k: np.array(v, np.float32) for k, v in table.items()}
    rank = _occurrence_rank(idx)
    for r in range(int(rank.max(initial=-1)) + 1):
        sel = (rank == r) & (idx >= 0)  # each prompt at most once per pass
        rows = idx[sel]
        hist = PromptHistory(table["success"][rows], table["failure"][rows])
        new = update_history(hist, correct[sel], g, decay)
        table["success"][rows] = np.asarray(new.success)
        table["failure"][rows] = np.asarray(new.failure)
    return table


def _occurrence_rank(idx: np.ndarray) -> np.ndarray:
    """rank[j] = number of earlier entries equal to idx[j] (0 for a first occurrence)."""
    order = np.argsort(idx, kind="stable")
    sorted_idx = idx[order]
    start = np.r_[True, sorted_idx[1:] != sorted_idx[:-1]]
    first = np.maximum.accumulate(np.where(start, np.arange(idx.size), 0))
    rank = np.empty(idx.size, np.int64)
    rank[order] = np.arange(idx.size) - first
    return rank


class _RoundStats:
    """Host-side sums over the generation rounds of one step."""

    def __init__(self):
        self.correct, self.rewards, self.lengths, self.truncated = [], [], [], []
        self.kept = []
        self.status: dict[str, int] = {}
        self.seconds = {"rollout": 0.0, "scoring": 0.0}

    def add(self, res, keep: np.ndarray) -> None:
        self.correct.append(res.correct)
        self.rewards.append(res.rewards)
        self.lengths.append(res.lengths)
        self.truncated.append(res.truncated)
        self.kept.append(keep)
        for k, v in res.score_stats.items():
            self.status[k] = self.status.get(k, 0) + int(v)
        for k, v in res.seconds.items():
            self.seconds[k] += v

    def summary(self, rounds: int, count: int, capacity: int, surplus: int) -> dict[str, float]:
        m: dict[str, float] = {
            "ds/rounds": rounds,
            "ds/batch_fill": count / capacity,
            "ds/surplus_groups": surplus,
            "samples/generated": float(sum(c.size for c in self.correct)),
            "time/rollout": self.seconds["rollout"],
            "time/scoring": self.seconds["scoring"],
            "_gen_tokens": 0.0,
        }
        if not self.correct:
            return m
        c, r = np.concatenate(self.correct), np.concatenate(self.rewards)
        lengths, trunc = np.concatenate(self.lengths), np.concatenate(self.truncated)
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
                "_gen_tokens": float(lengths.sum()),
            }
        )
        for k in ("timeout", "error", "no_answer"):
            m[f"reward/{k}"] = float(self.status.get(k, 0))
        return m
