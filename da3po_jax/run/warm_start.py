"""The SFT warm start: supervised warm-up of a random policy on the SFT split, exported
to a HF folder that later runs reuse (`run/sft.py` has the SFT step itself)."""

from __future__ import annotations

import logging
import os

import jax
from flax import nnx

from da3po_jax.parallel import is_main_process
from da3po_jax.run.build import make_engine
from da3po_jax.run.context import RunContext
from da3po_jax.run.evaluation import evaluate
from da3po_jax.run.inputs import generate_configs, tokenizer_dir
from da3po_jax.run.saved_run import export_policy
from da3po_jax.run.sft import build_sft_arrays, run_sft
from da3po_jax.runtime.logger import MetricsLogger
from da3po_jax.update.state import init_train_state, make_optimizer

log = logging.getLogger(__name__)


def sft_warm_start(ctx: RunContext, model, out_dir: str, logs: str = "sft_logs"):
    """Supervised warm-up on the SFT split, exported to `out_dir` (reused when present).

    With `sft.stop_acc > 0` the warm-up stops at the first check (every `sft.check_every`
    steps) where the policy's accuracy at the rollout temperature on `sft.check_prompts`
    RL-training prompts reaches it: RL then starts in the regime where it can learn.

    The warm start is not checkpointed (on the demo it takes a few minutes, and a real
    model starts from `model.path`): on SIGTERM / SIGINT it stops after the current step
    and raises `Preempted(saved=False)`, so the command exits non-zero (143 / 130) with a
    line saying nothing was saved; a rerun starts it again.
    """
    settings = ctx.settings
    arrays = build_sft_arrays(ctx.data.sft, ctx.tokenizer, ctx.encoder.render, settings.sft.max_len)
    tx, _ = make_optimizer(
        settings.optim,
        settings.sft.steps,
        lr=settings.sft.lr,
        warmup_steps=settings.sft.warmup_steps,
        schedule="cosine",
        b2=0.98,
    )
    graphdef, state = init_train_state(model, tx, settings.seed, ctx.mesh)
    logger = MetricsLogger(os.path.join(ctx.workdir, logs), enabled=is_main_process())
    check = None
    if settings.sft.stop_acc > 0 and ctx.data.train:
        check = _stop_check(ctx, graphdef, model.config, logger)
    state = run_sft(
        graphdef,
        state,
        tx,
        arrays,
        settings.sft.steps,
        settings.sft.batch_size,
        settings.seed,
        on_step=lambda i, m: logger.write(i, m, kind="sft") if i % 10 == 0 else None,
        check=check,
        check_every=settings.sft.check_every,
        mesh=ctx.mesh,
        stop=ctx.stop,
    )
    model = nnx.merge(graphdef, state.params)
    export_policy(model, out_dir, tokenizer_dir(settings, ctx.workdir))
    logger.plot()
    logger.close()
    return model


def _stop_check(ctx: RunContext, graphdef, model_config, logger: MetricsLogger):
    """`check(state, step)`: the policy's accuracy (4 samples at the rollout settings) on
    the first `sft.check_prompts` training prompts, logged; True once it reaches
    `sft.stop_acc`."""
    settings = ctx.settings
    gen = generate_configs(settings, ctx.tokenizer)[0].replace(num_samples=4)
    problems = ctx.data.train[: settings.sft.check_prompts]
    engine = make_engine(ctx, graphdef, model_config, gen, problems, len(problems))

    def check(state, step: int) -> bool:
        rng = jax.random.PRNGKey(settings.seed + step)
        metrics = evaluate(engine, state.params, problems, rng, "", f"SFT check at step {step}")
        acc = metrics["eval/avg@4"]
        logger.write(step, {"sft/check_acc": acc}, kind="sft")
        logger.plot()
        log.info(
            "SFT step %d: accuracy %.3f on %d training prompts (stop at %.2f)",
            step,
            acc,
            len(problems),
            settings.sft.stop_acc,
        )
        return acc >= settings.sft.stop_acc

    return check
