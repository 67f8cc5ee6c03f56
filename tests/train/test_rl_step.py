"""The jitted RL update on a hand-made batch: empty mini-batches leave the state untouched,
step metrics equal direct computations (micro-batches, iterations, amplified tokens),
truncated importance sampling in the step, and the proximal log-probs of partial rollouts
recomputed under the step's weights."""

from __future__ import annotations

import dataclasses
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from da3po_jax.config import resolve_settings
from da3po_jax.models import get_preset, init_model
from da3po_jax.rl import (
    ADVANTAGE_ESTIMATORS,
    AdvantageConfig,
    DAAConfig,
    LossConfig,
    OverlongConfig,
    compute_advantages,
    da3po_loss,
    grpo_advantages,
)
from da3po_jax.rollout.batch import GroupBatch
from da3po_jax.run.build import update_config
from da3po_jax.update import PolicyUpdate, UpdateBatch, UpdateConfig, UpdateProgram, rl_update
from da3po_jax.update.forwards import response_logprobs
from da3po_jax.update.state import init_train_state, make_optimizer, optimizer_updates

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_train_smoke import micro_config  # noqa: E402

N, G, TP, TN, V = 2, 4, 5, 6, 64
# group 0: 1 of 4 correct (hard: mu = 0.25 < tau = 0.5); group 1: 2 of 4 (not hard)
CORRECT = np.array([[1, 0, 0, 0], [1, 1, 0, 0]], np.float32)


def _batch(seed: int = 0) -> GroupBatch:
    rng = np.random.default_rng(seed)
    prompt_mask = np.ones((N, TP), bool)
    prompt_mask[0, :2] = False
    lengths = rng.integers(2, TN + 1, (N, G))
    return GroupBatch(
        prompt_tokens=jnp.asarray(rng.integers(1, V, (N, TP)), jnp.int32),
        prompt_mask=jnp.asarray(prompt_mask),
        tokens=jnp.asarray(rng.integers(1, V, (N, G, TN)), jnp.int32),
        response_mask=jnp.asarray(np.arange(TN)[None, None] < lengths[..., None]),
        logp_old=jnp.asarray(rng.normal(np.log(1 / V), 0.05, (N, G, TN)), jnp.float32),
        rewards=jnp.asarray(CORRECT),
        correct=jnp.asarray(CORRECT),
        lengths=jnp.asarray(lengths, jnp.int32),
        truncated=jnp.zeros((N, G), bool),
        prompt_index=jnp.arange(N, dtype=jnp.int32),
    )


def _cfg(**kw) -> UpdateConfig:
    base = dict(
        group_size=G,
        mini_batch_prompts=1,
        micro_batch_prompts=0,
        num_iterations=1,
        loss=LossConfig(agg="token-mean"),
        adv=AdvantageConfig(),
        daa=None,
        overlong=OverlongConfig(max_len=TN),
    )
    return UpdateConfig(**{**base, **kw})


def _model():
    return init_model(get_preset("tiny-qwen2", vocab_size=V), seed=0)


def _run(cfg, batch, valid=None, tx=None):
    tx = tx or optax.adamw(1e-3, weight_decay=0.1)
    graphdef, state = init_train_state(_model(), tx, 0)
    before = jax.tree.map(np.asarray, state)
    valid = jnp.ones(batch.tokens.shape[0], bool) if valid is None else valid
    step = jax.jit(rl_update, static_argnames="program")
    new, metrics = step(UpdateProgram(graphdef, tx, cfg), state, UpdateBatch(batch, valid))
    return graphdef, before, new, {k: float(v) for k, v in metrics.items()}


def _assert_trees_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_empty_minibatches_leave_params_and_optimizer_state_bitwise_unchanged():
    """AdamW would still apply weight decay (and a schedule count) on a zero gradient."""
    _, before, new, met = _run(_cfg(), _batch(), valid=jnp.zeros(N, bool))
    _assert_trees_equal(before.params, new.params)
    _assert_trees_equal(before.opt_state, new.opt_state)
    assert (met["optim/updates"], met["optim/skipped_updates"]) == (0.0, 2.0)
    assert met["loss/total"] == 0.0 and met["loss/num_tokens"] == 0.0


def test_only_the_empty_trailing_minibatch_is_skipped():
    """valid = [True, False]: the first mini-batch updates, the second changes nothing, so
    the result is that of the one-group batch alone."""
    batch = _batch()
    _, before, new, met = _run(_cfg(), batch, valid=jnp.asarray([True, False]))
    assert (met["optim/updates"], met["optim/skipped_updates"]) == (1.0, 1.0)
    assert optimizer_updates(new) == 1
    _, _, alone, _ = _run(_cfg(), jax.tree.map(lambda x: x[:1], batch))
    for x, y in zip(jax.tree.leaves(new.params), jax.tree.leaves(alone.params), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)
    assert not all(
        np.array_equal(np.asarray(x), y)
        for x, y in zip(jax.tree.leaves(new.params), jax.tree.leaves(before.params))
    )


def _direct_minibatch_loss(graphdef, params, batch, cfg: UpdateConfig):
    """The mini-batch loss of the whole (two-group) batch in one call, independently of the
    step's micro-batching and metric bookkeeping."""
    rows = lambda x: x.reshape(N * G, *x.shape[2:])
    pt, pm = jnp.repeat(batch.prompt_tokens, G, 0), jnp.repeat(batch.prompt_mask, G, 0)
    logp, _ = response_logprobs(
        graphdef, params, pt, pm, rows(batch.tokens), rows(batch.response_mask)
    )
    adv, _ = compute_advantages(batch.rewards.reshape(-1), batch.correct.reshape(-1), G)
    return da3po_loss(logp, rows(batch.logp_old), adv, rows(batch.response_mask), config=cfg.loss)


@pytest.mark.parametrize("micro", [0, 1])
def test_loss_metrics_with_micro_batches_and_iterations(micro):
    """One mini-batch of 2 groups, optionally as 2 micro-batches, 2 iterations: `loss/pg`
    of the first pass is the whole mini-batch's loss (not half of it), `loss/num_tokens`
    counts each token once."""
    cfg = _cfg(mini_batch_prompts=2, micro_batch_prompts=micro, num_iterations=1)
    batch = _batch()
    graphdef, before, _, met = _run(cfg, batch)
    loss, _ = _direct_minibatch_loss(graphdef, before.params, batch, cfg)
    np.testing.assert_allclose(met["loss/pg"], float(loss), rtol=1e-5)
    np.testing.assert_allclose(met["loss/total"], float(loss), rtol=1e-5)
    n_tok = float(np.asarray(batch.response_mask).sum())
    assert met["loss/num_tokens"] == n_tok
    _, _, _, met2 = _run(dataclasses.replace(cfg, num_iterations=2), batch)
    assert met2["loss/num_tokens"] == n_tok
    assert met2["optim/updates"] == 2.0


def test_amplified_clip_fraction_is_a_mean_over_amplified_tokens():
    """Every token's ratio is e (> 1 + eps_high): every amplified token (the correct
    response of hard group 0) is clipped high, so the fraction is 1.0, also when the other
    micro-batch holds no amplified token."""
    tx = optax.sgd(0.0)
    graphdef, state = init_train_state(_model(), tx, 0)
    batch = _batch()
    rows = lambda x: x.reshape(N * G, *x.shape[2:])
    logp, _ = response_logprobs(
        graphdef,
        state.params,
        jnp.repeat(batch.prompt_tokens, G, 0),
        jnp.repeat(batch.prompt_mask, G, 0),
        rows(batch.tokens),
        rows(batch.response_mask),
    )
    batch = batch.replace(logp_old=(logp - 1.0).reshape(N, G, TN))
    cfg = _cfg(mini_batch_prompts=2, micro_batch_prompts=1, daa=DAAConfig(estimator="power"))
    _, _, _, met = _run(cfg, batch, tx=tx)
    assert met["daa/frac_hard"] == 0.5 and met["daa/lambda_mean"] > 1.0
    assert met["loss/clipfrac_high_amplified"] == pytest.approx(1.0)
    assert met["loss/num_amplified_tokens"] == float(np.asarray(batch.response_mask)[0, 0].sum())


def test_truncated_importance_sampling_in_the_step():
    """With the sampler's log-probs and a cap, the step's weights are min(pi_old / mu, C)."""
    batch = _batch()
    rng = np.random.default_rng(3)
    logp_sample = batch.logp_old + jnp.asarray(rng.normal(0.0, 1.0, (N, G, TN)), jnp.float32)
    batch = batch.replace(logp_sample=logp_sample)
    cap = 2.0
    cfg = _cfg(loss=LossConfig(agg="token-mean", tis_cap=cap))
    _, _, _, met = _run(cfg, batch)
    m = np.asarray(batch.response_mask)
    w = np.minimum(np.exp(np.asarray(batch.logp_old) - np.asarray(logp_sample)), cap)
    np.testing.assert_allclose(met["loss/tis_weight_mean"], w[m].mean(), rtol=1e-5)
    np.testing.assert_allclose(met["loss/tis_capped_frac"], (w[m] >= cap).mean(), rtol=1e-5)
    with pytest.raises(ValueError, match="logp_sample"):
        _run(cfg, batch.replace(logp_sample=None))


def test_a_new_advantage_estimator_is_one_function_and_one_registration():
    """What adding an estimator takes: a function of (rewards [P, G], valid, config) and a
    `register` call; the update then trains with it, chosen by name. RLOO's advantage is
    G / (G - 1) times the centred reward, so an estimator registered here that computes
    that must give the very update `rloo` gives (and not GRPO's)."""
    name = "scaled-centred (test)"

    def scaled_centred(rewards, valid, config):
        g = rewards.shape[1]
        return g / (g - 1) * grpo_advantages(rewards, g, valid=valid, norm="none")

    sgd = optax.sgd(0.1)  # Adam's normalisation would blow up float noise near g = 0
    ADVANTAGE_ESTIMATORS.register(name, scaled_centred)
    try:
        cfg = _cfg(adv=AdvantageConfig(estimator=name))
        _, before, custom, met = _run(cfg, _batch(), tx=sgd)
    finally:
        ADVANTAGE_ESTIMATORS.unregister(name)
    _, _, rloo, met_rloo = _run(_cfg(adv=AdvantageConfig(estimator="rloo")), _batch(), tx=sgd)
    _, _, grpo, _ = _run(_cfg(), _batch(), tx=sgd)
    # group [1, 0, 0, 0]: A = 1 (correct), -1/3 (wrong); group [1, 1, 0, 0]: A = +-2/3
    assert met["adv/abs_mean"] == pytest.approx((4 * 0.5 + 4 * 2 / 3) / 8, rel=1e-6)
    assert met_rloo["adv/abs_mean"] == pytest.approx(met["adv/abs_mean"], rel=1e-6)
    leaves = lambda t: [np.asarray(x) for x in jax.tree.leaves(t.params)]  # noqa: E731
    for x, y in zip(leaves(custom), leaves(rloo), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    assert not all(np.allclose(x, y) for x, y in zip(leaves(rloo), leaves(grpo)))
    assert not all(np.array_equal(x, y) for x, y in zip(leaves(rloo), leaves(before)))
    with pytest.raises(ValueError, match="scaled-centred"):  # unregistered: refused by name
        AdvantageConfig(estimator=name)


@functools.partial(jax.jit, static_argnums=1)
def _scaled(state: nnx.State, factor: float) -> nnx.State:
    """Every parameter times `factor` (one jitted call, not one per parameter)."""
    return jax.tree.map(lambda x: factor * x, state)


def _sharp_model(seed: int):
    """(graphdef, params, model) of the tiny model with every parameter scaled by 3: the
    default init's near-uniform logits made peaked, so two seeds' log-probs of the same
    tokens differ visibly."""
    graphdef, state = nnx.split(init_model(get_preset("tiny-qwen2", vocab_size=V), seed=seed))
    state = _scaled(state, 3.0)
    return graphdef, state, nnx.merge(graphdef, state)


def test_partial_rollouts_step_uses_log_probs_recomputed_under_its_weights():
    """The update step of a partial-rollouts run (`rollout.max_staleness = 1`, its config
    as the run builds it, packing included) on a group batch whose rows were sampled
    partly by an older version A and partly by the step's weights B (`version` 0 then 1,
    each token's behaviour log-prob under the weights that sampled it, as the engine
    records them). The decoupled objective takes the ratio against the proximal policy,
    the step's weights: its old log-probs are B's, recomputed, so before the first update
    every ratio is 1, and A enters only through the TIS weight w = min(pi_B / pi_A, C) of
    the version-0 tokens: the loss is -sum(m w adv) / sum(m). Had the step kept the
    behaviour log-probs as its old ones, the ratios would be pi_B / pi_A on those tokens
    and the TIS weights 1 (behaviour and sampling log-probs are equal at temperature 1)."""
    s = resolve_settings(
        micro_config(
            "da3po",
            **{
                "rollout.engine": "continuous",
                "rollout.max_staleness": 1,
                "rl.mini_batch_prompts": N,  # one optimizer update: ratios read before it
            },
        )
    )
    cfg = update_config(s)
    assert cfg.pack is not None and cfg.mini_batch_prompts == N and cfg.group_size == G
    graphdef, a, _ = _sharp_model(seed=1)
    _, b, model = _sharp_model(seed=0)  # the step's weights (version 1)
    # two of four correct in each group: no hard group, so the advantages are GRPO's,
    # (c - 1/2) / std (ddof 1) = +-sqrt(3) / 2, and DAA leaves them as they are
    correct = jnp.asarray([[1, 1, 0, 0], [0, 1, 0, 1]], jnp.float32)
    batch = _batch().replace(rewards=correct, correct=correct)
    rows = lambda x: x.reshape(N * G, *x.shape[2:])  # noqa: E731
    inputs = (
        jnp.repeat(batch.prompt_tokens, G, 0),
        jnp.repeat(batch.prompt_mask, G, 0),
        rows(batch.tokens),
        rows(batch.response_mask),
    )
    forward = jax.jit(response_logprobs, static_argnums=0)
    logp_a, logp_b = (
        np.asarray(forward(graphdef, p, *inputs)[0]).reshape(N, G, TN) for p in (a, b)
    )
    # each row switches from A to B at its own token index (0: admitted under B)
    switch = np.random.default_rng(1).integers(0, TN + 1, (N, G))
    version = (np.arange(TN)[None, None] >= switch[..., None]).astype(np.int32)
    behaviour = np.where(version == 0, logp_a, logp_b).astype(np.float32)
    batch = batch.replace(
        logp_old=jnp.asarray(behaviour),
        logp_sample=jnp.asarray(behaviour),
        version=jnp.asarray(version),
    )
    m = np.asarray(batch.response_mask)
    assert (m & (version == 0)).any() and (m & (version == 1)).any()

    tx, schedule = make_optimizer(s.optim, s.train.steps, s.updates_per_step)
    graphdef, state = init_train_state(model, tx, 0)
    update = PolicyUpdate(graphdef, tx, schedule, cfg)
    _, met = update(state, batch, jnp.ones(N, bool), None)
    met = {k: float(v) for k, v in met.items()}

    w = np.minimum(np.exp(logp_b - behaviour), cfg.loss.tis_cap)
    adv = (np.asarray(correct) - 0.5)[..., None] * np.sqrt(3.0)  # (c - 1/2) / sqrt(1/3)
    assert met["daa/frac_hard"] == 0.0
    assert met["loss/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert met["loss/ratio_max"] == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(met["loss/tis_weight_mean"], w[m].mean(), rtol=1e-5)
    np.testing.assert_allclose(met["loss/pg"], -(w * adv)[m].sum() / m.sum(), rtol=1e-5)
    # on A's tokens behaviour and proximal log-probs differ visibly: keeping the behaviour
    # log-probs as the old ones gives other ratios (pi_B / pi_A, not 1) and weights (1)
    old = m & (version == 0)
    assert np.abs(np.exp(logp_b - behaviour) - 1)[old].mean() > 0.3
    assert np.abs(w - 1)[old].mean() > 0.3
