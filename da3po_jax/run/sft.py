"""Supervised fine-tuning: the warm start of the tiny demo, and `config.stage = "sft"`.

Each example is the rendered prompt followed by its target (the worked solution ending in
`Answer: ...`, or just that line) and an EOS token; the loss is the mean negative
log-likelihood of the target tokens (the prompt is context only).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm import tqdm

from da3po_jax.data import MathProblem
from da3po_jax.models import positions_from_mask
from da3po_jax.models.tokenizer import Tokenizer
from da3po_jax.parallel import global_batch, host_rows, replicated
from da3po_jax.update.state import TrainState

log = logging.getLogger(__name__)


def sft_target(problem: MathProblem) -> str:
    return problem.solution or f"Answer: {problem.answer}"


def build_sft_arrays(
    problems: Sequence[MathProblem],
    tokenizer: Tokenizer,
    render: Callable[[MathProblem], str],
    max_len: int,
) -> dict[str, np.ndarray]:
    """Left-padded examples: tokens, attention mask, and target mask, all [N, max_len].

    `target[b, t]` marks tokens to be predicted (the solution and its EOS). Examples longer
    than `max_len` are dropped with a warning (never silently truncated).
    """
    eos = tokenizer.eos_ids[0]
    rows, targets, dropped = [], [], 0
    for p in problems:
        prompt = tokenizer.encode([render(p)])[0]
        answer = tokenizer.encode([sft_target(p)])[0] + [eos]
        if len(prompt) + len(answer) > max_len:
            dropped += 1
            continue
        rows.append(prompt + answer)
        targets.append([False] * len(prompt) + [True] * len(answer))
    if dropped:
        log.warning(
            "SFT: dropped %d of %d examples longer than sft.max_len=%d",
            dropped,
            len(problems),
            max_len,
        )
    if not rows:
        raise ValueError(f"no SFT example fits in sft.max_len={max_len}")
    tokens, mask = tokenizer.pad_left(rows, max_len)
    target = np.zeros_like(mask)
    for i, t in enumerate(targets):
        target[i, max_len - len(t) :] = t
    return {"tokens": tokens, "mask": mask, "target": target}


def sft_loss(graphdef, params, tokens, mask, target):
    """Mean NLL of the target tokens; position t predicts token t + 1."""
    model = nnx.merge(graphdef, params)
    next_tokens = jnp.concatenate([tokens[:, 1:], jnp.zeros_like(tokens[:, :1])], axis=1)
    weight = jnp.concatenate([target[:, 1:], jnp.zeros_like(target[:, :1])], axis=1)
    logp, _ = model.token_logprobs(tokens, positions_from_mask(mask), mask, next_tokens)
    weight = weight.astype(jnp.float32)
    return -(logp * weight).sum() / jnp.maximum(weight.sum(), 1.0)


def sft_step(graphdef, tx: optax.GradientTransformation, state: TrainState, batch):
    """One AdamW step on a batch (jit with graphdef and tx static; donate state)."""
    loss, grads = jax.value_and_grad(sft_loss, argnums=1)(
        graphdef, state.params, batch["tokens"], batch["mask"], batch["target"]
    )
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"sft/loss": loss, "sft/grad_norm": optax.global_norm(grads)}
    return state.replace(params=params, opt_state=opt_state, step=state.step + 1), metrics


def run_sft(
    graphdef,
    state: TrainState,
    tx: optax.GradientTransformation,
    data: dict[str, np.ndarray],
    steps: int,
    batch_size: int,
    seed: int,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    check: Callable[[TrainState, int], bool] | None = None,
    check_every: int = 0,
    mesh=None,
    stop=None,
) -> TrainState:
    """Up to `steps` SFT updates over shuffled epochs of `data` (fixed batch, one compile).

    Every `check_every` steps `check(state, step)` may end the warm-up early (returning
    True), e.g. once the policy's accuracy reaches a useful RL regime. `stop` (a
    `signals.StopRequest`) is checked after every step: a signal raises `Preempted`.
    """
    shardings = jax.tree.map(lambda x: x.sharding, state) if mesh is not None else None
    step_fn = jax.jit(
        sft_step,
        static_argnames=("graphdef", "tx"),
        donate_argnames="state",
        out_shardings=(shardings, replicated(mesh)) if mesh is not None else None,
    )
    n = data["tokens"].shape[0]
    if n < batch_size:
        raise ValueError(f"{n} SFT examples are fewer than sft.batch_size={batch_size}")
    rng = np.random.default_rng(seed)
    rows = host_rows(mesh, batch_size)  # every host draws the same batch, feeds its rows
    order = rng.permutation(n)
    pos = 0
    bar = tqdm(range(steps), desc="sft", dynamic_ncols=True, leave=False)
    for i in bar:
        if pos + batch_size > n:
            order, pos = rng.permutation(n), 0
        idx = order[pos : pos + batch_size]
        pos += batch_size
        local = {k: v[idx[rows]] for k, v in data.items()}
        state, metrics = step_fn(graphdef, tx, state, global_batch(local, mesh, batch_size))
        if on_step is not None or i % 10 == 0:
            scalars = {k: float(v) for k, v in metrics.items()}
            bar.set_postfix(loss=f"{scalars['sft/loss']:.3f}")
            if on_step is not None:
                on_step(i + 1, scalars)
        if stop is not None:
            stop.check(
                f"nothing was saved: the SFT warm start is not checkpointed (stopped at "
                f"step {i + 1} of {steps}; rerun the same command to start it again)",
                saved=False,
            )
        if check is not None and check_every and (i + 1) % check_every == 0 and i + 1 < steps:
            if check(state, i + 1):
                break
    return state
