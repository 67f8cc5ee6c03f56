"""Sequence packing for the update: the host plan (first-fit decreasing, the worst-case
slot count, the too-long error), the packed micro-batch layout, and packed log-probs,
losses and gradients equal to the unpacked ones for every aggregation mode, both ratio
levels, with a KL term and with an OPD teacher."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from da3po_jax.models import get_preset, init_model
from da3po_jax.rl import AGG_MODES, AdvantageConfig, LossConfig, OPDConfig, OverlongConfig
from da3po_jax.rollout.batch import GroupBatch
from da3po_jax.update import (
    FrozenModels,
    UpdateBatch,
    UpdateConfig,
    UpdateProgram,
    pack_plan,
    rl_update,
)
from da3po_jax.update.forwards import response_logprobs
from da3po_jax.update.packing import (
    PackConfig,
    micro_slots,
    pack_micro,
    packed_response_logprobs,
    plan_packing,
)
from da3po_jax.update.rows import ResponseRows
from da3po_jax.update.state import init_train_state

N, G, TP, TN, V = 4, 4, 6, 10, 64


def _batch(seed: int = 0) -> GroupBatch:
    """Left-padded prompts of 2..6 tokens, responses of 1..10 tokens."""
    rng = np.random.default_rng(seed)
    lp = rng.integers(2, TP + 1, N)
    prompt_mask = np.arange(TP)[None] >= (TP - lp)[:, None]
    lengths = rng.integers(1, TN + 1, (N, G))
    correct = (rng.random((N, G)) < 0.5).astype(np.float32)
    correct[:, 0], correct[:, 1] = 1.0, 0.0  # every group mixed: every row trains
    return GroupBatch(
        prompt_tokens=jnp.asarray(np.where(prompt_mask, rng.integers(1, V, (N, TP)), 0)),
        prompt_mask=jnp.asarray(prompt_mask),
        tokens=jnp.asarray(rng.integers(1, V, (N, G, TN)), jnp.int32),
        response_mask=jnp.asarray(np.arange(TN)[None, None] < lengths[..., None]),
        logp_old=jnp.asarray(rng.normal(np.log(1 / V), 0.3, (N, G, TN)), jnp.float32),
        rewards=jnp.asarray(correct),
        correct=jnp.asarray(correct),
        lengths=jnp.asarray(lengths, jnp.int32),
        truncated=jnp.zeros((N, G), bool),
        prompt_index=jnp.arange(N, dtype=jnp.int32),
    )


# --- the host plan ---------------------------------------------------------------------


def test_first_fit_decreasing_by_hand():
    """Budget 10, 2 rows per micro-batch: lengths [3, 7, 4, 6, 0, 5] go longest first:
    7 -> row 0; 6 -> row 1; 5 -> row 2; 4 -> row 1 (6+4); 3 -> row 0 (7+3); 0 not packed.
    Rows 0, 1 form micro-batch 0, row 2 micro-batch 1."""
    plan = plan_packing(np.array([3, 7, 4, 6, 0, 5]), PackConfig(length=10, rows=2), 6)
    np.testing.assert_array_equal(plan.micro, [0, 0, 0, 0, -1, 1])
    np.testing.assert_array_equal(plan.row, [0, 0, 1, 1, 0, 0])
    np.testing.assert_array_equal(plan.offset, [7, 0, 6, 0, 0, 0])


def test_plan_never_crosses_mini_batches():
    """Two mini-batches of 3 rows: the second starts its own packed rows."""
    plan = plan_packing(np.array([2, 2, 2, 2, 2, 2]), PackConfig(length=10, rows=1), 3)
    np.testing.assert_array_equal(plan.micro, [0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(plan.offset, [0, 2, 4, 0, 2, 4])


def test_a_sequence_longer_than_the_pack_length_is_an_error_naming_it():
    with pytest.raises(ValueError, match="response row 2: its sequence of 11 tokens"):
        plan_packing(np.array([3, 10, 11, 1]), PackConfig(length=10, rows=1), 4)
    with pytest.raises(ValueError, match="pack length 8 is shorter than the longest"):
        micro_slots(4, 9, PackConfig(length=8, rows=1))


@pytest.mark.parametrize("seed", range(20))
def test_random_plans_fit_the_static_slots_without_overlap(seed):
    """Any lengths up to the maximum fit in `micro_slots` slots; sequences of a packed row
    never overlap and stay inside it."""
    rng = np.random.default_rng(seed)
    mb_rows, max_len = 24, int(rng.integers(3, 20))
    cfg = PackConfig(length=int(rng.integers(max_len, 3 * max_len)), rows=int(rng.integers(1, 4)))
    lens = rng.integers(0, max_len + 1, 2 * mb_rows)
    if seed % 4 == 0:
        lens[:] = max_len  # the worst case
    plan = plan_packing(lens, cfg, mb_rows)
    slots = micro_slots(mb_rows, max_len, cfg)
    packed = lens > 0
    assert (plan.micro[~packed] == -1).all()
    assert (plan.micro[packed] >= 0).all() and (plan.micro[packed] < slots).all()
    for start in (0, mb_rows):
        used = {}
        for i in range(start, start + mb_rows):
            if lens[i]:
                key = (plan.micro[i], plan.row[i])
                cols = set(range(plan.offset[i], plan.offset[i] + lens[i]))
                assert max(cols) < cfg.length
                assert not cols & used.get(key, set())
                used[key] = used.get(key, set()) | cols


# --- the packed layout and log-probs ----------------------------------------------------


def _response_rows(batch: GroupBatch) -> ResponseRows:
    return ResponseRows.from_groups(batch)


def _cfg(**kw) -> UpdateConfig:
    base = dict(
        group_size=G,
        mini_batch_prompts=2,
        micro_batch_prompts=0,
        num_iterations=1,
        loss=LossConfig(),
        adv=AdvantageConfig(),
        daa=None,
        overlong=OverlongConfig(max_len=TN),
        pack=PackConfig(length=TP + TN + 3, rows=2),
    )
    return UpdateConfig(**{**base, **kw})


def test_packed_rows_hold_each_sequence_with_restarting_positions():
    batch = _batch()
    rows = _response_rows(batch)
    cfg = _cfg()
    valid = np.ones(N, bool)
    plan, _ = pack_plan(batch, valid, cfg)
    mb = jax.tree.map(lambda x: x[: 2 * G], rows)
    sub = jax.tree.map(lambda x: x[: 2 * G], plan)
    packed = pack_micro(*mb.inputs(), sub, jnp.int32(0), cfg.pack)
    lp = np.asarray(mb.prompt_mask).sum(-1)
    ln = np.asarray(mb.response_mask).sum(-1)
    for r in np.flatnonzero(np.asarray(sub.micro) == 0):
        seq = np.concatenate(
            [np.asarray(mb.prompt_tokens[r])[TP - lp[r] :], np.asarray(mb.tokens[r])[: ln[r]]]
        )
        row, off = int(sub.row[r]), int(sub.offset[r])
        span = slice(off, off + len(seq))
        np.testing.assert_array_equal(np.asarray(packed.tokens)[row, span], seq)
        np.testing.assert_array_equal(np.asarray(packed.positions)[row, span], np.arange(len(seq)))
        assert (np.asarray(packed.segment_ids)[row, span] == r + 1).all()
    n_real = sum(lp[r] + ln[r] for r in np.flatnonzero(np.asarray(sub.micro) == 0))
    assert (np.asarray(packed.segment_ids) > 0).sum() == n_real


def test_packed_logprobs_equal_the_unpacked_forward():
    model = init_model(get_preset("tiny-qwen2", vocab_size=V), seed=0)
    graphdef, params = nnx.split(model)
    batch = _batch()
    cfg = _cfg(mini_batch_prompts=N)
    plan, _ = pack_plan(batch, np.ones(N, bool), cfg)
    rows = _response_rows(batch).replace(plan=plan)
    want_lp, want_ent = response_logprobs(graphdef, params, *rows.inputs())
    got_lp = np.zeros(want_lp.shape, np.float32)
    got_ent = np.zeros(want_lp.shape, np.float32)
    for m in range(int(np.asarray(plan.micro).max()) + 1):
        lp, ent = packed_response_logprobs(graphdef, params, rows, jnp.int32(m), cfg.pack)
        got_lp += np.asarray(lp)
        got_ent += np.asarray(ent)
    mask = np.asarray(rows.response_mask)
    np.testing.assert_allclose(got_lp[mask], np.asarray(want_lp)[mask], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(got_ent[mask], np.asarray(want_ent)[mask], atol=1e-5, rtol=1e-5)
    # past a response's end (its last token, whose target is padding, aside) nothing is read
    beyond = np.arange(TN)[None] > mask.sum(-1)[:, None]
    assert (got_lp[beyond] == 0).all()


# --- the update ----------------------------------------------------------------------


def _step(cfg, batch, valid, *, ref=False, teacher=None, model_overrides=None):
    """One update with SGD(lr=1): the parameter change is minus the gradient."""
    tx = optax.sgd(1.0)
    model = init_model(get_preset("tiny-qwen2", vocab_size=V, **(model_overrides or {})), 0)
    graphdef, state = init_train_state(model, tx, 0)
    before = jax.tree.map(np.asarray, state.params)
    ref_params = jax.tree.map(jnp.asarray, before) if ref else None
    tg, tparams = teacher or (None, None)
    plan = pack_plan(batch, valid, cfg)[0] if cfg.pack else None
    step = jax.jit(rl_update, static_argnames="program")
    new, metrics = step(
        UpdateProgram(graphdef, tx, cfg, teacher_graphdef=tg),
        state,
        UpdateBatch(batch, jnp.asarray(valid), plan=plan),
        FrozenModels(ref_params, tparams),
    )
    grads = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), before, new.params)
    return grads, {k: float(v) for k, v in metrics.items()}


def _assert_same_update(cfg, batch, valid=None, **kw):
    valid = np.ones(N, bool) if valid is None else valid
    g_pack, m_pack = _step(cfg, batch, valid, **kw)
    g_pad, m_pad = _step(dataclasses.replace(cfg, pack=None), batch, valid, **kw)
    for a, b in zip(jax.tree.leaves(g_pack), jax.tree.leaves(g_pad), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    assert max(np.abs(a).max() for a in jax.tree.leaves(g_pad)) > 1e-4  # a real gradient
    assert m_pack.keys() == m_pad.keys()
    for k in m_pad:
        np.testing.assert_allclose(m_pack[k], m_pad[k], atol=1e-5, rtol=1e-5, err_msg=k)
    return m_pack


# every aggregation once, each ratio level with two of them (the level only changes how
# the packed log-probs are reduced per row, the aggregation only the normalisers)
@pytest.mark.parametrize(
    "agg, level", [(a, ("token", "sequence")[i % 2]) for i, a in enumerate(AGG_MODES)]
)
def test_packed_update_equals_padded(agg, level):
    _assert_same_update(_cfg(loss=LossConfig(agg=agg, ratio_level=level)), _batch(1))


def test_packed_update_with_kl_recompute_and_an_empty_group():
    """A KL term to the reference, recomputed old log-probs, several micro-batches per
    mini-batch and a dynamic-sampling slot without a group (not packed)."""
    cfg = _cfg(loss=LossConfig(kl_coef=0.1), recompute_logp_old=True, pack=PackConfig(TP + TN, 1))
    valid = np.array([True, True, False, True])
    met = _assert_same_update(cfg, _batch(2), valid, ref=True)
    assert met["loss/kl_ref"] != 0.0


def test_packed_update_with_an_opd_teacher():
    teacher = init_model(get_preset("tiny-qwen2", vocab_size=V, num_layers=1), seed=7)
    cfg = _cfg(opd=OPDConfig())
    met = _assert_same_update(cfg, _batch(3), teacher=nnx.split(teacher))
    assert met["opd/reverse_kl"] != 0.0


@pytest.mark.extended
def test_packed_update_with_remat_and_scanned_layers():
    """Rematerialised layers (a `jax.checkpoint` inside the packed slots' scan and cond)
    and the stacked layout under the scan: the padded update of the same model."""
    cfg = _cfg(recompute_logp_old=True)
    for overrides in ({"remat": True}, {"remat": True, "scan_layers": True}):
        _assert_same_update(cfg, _batch(5), model_overrides=overrides)


def test_unused_micro_batch_slots_are_skipped():
    """Short sequences in a budget that holds them all: one slot of the worst-case
    `micro_slots` is used; the update is still the padded one."""
    cfg = _cfg(mini_batch_prompts=N, pack=PackConfig(length=4 * (TP + TN), rows=1))
    plan, _ = pack_plan(_batch(4), np.ones(N, bool), cfg)
    assert micro_slots(N * G, TP + TN, cfg.pack) == 4
    assert int(np.asarray(plan.micro).max()) < 4
    _assert_same_update(cfg, _batch(4))


# --- the trained policy's temperature (loss.temperature) ------------------------------


def test_forwards_read_the_policy_at_its_temperature():
    """`response_logprobs` (padded) and `packed_response_logprobs` at T = 0.6 are
    log softmax(logits / 0.6)[next token] of a direct forward."""
    from da3po_jax.models import positions_from_mask

    model = init_model(get_preset("tiny-qwen2", vocab_size=V), seed=0)
    graphdef, params = nnx.split(model)
    batch = _batch(3)
    rows = _response_rows(batch)
    full = jnp.concatenate([rows.prompt_tokens, rows.tokens], 1)
    attn = jnp.concatenate([rows.prompt_mask, rows.response_mask], 1)
    logits = np.asarray(model(full, positions_from_mask(attn), attn)[0], np.float64) / 0.6
    z = logits - logits.max(-1, keepdims=True)
    logsm = z - np.log(np.exp(z).sum(-1, keepdims=True))
    targets = np.asarray(full)[:, TP:]  # response token t is read at position TP - 1 + t
    want = np.take_along_axis(logsm[:, TP - 1 : TP - 1 + TN], targets[..., None], -1)[..., 0]
    mask = np.asarray(rows.response_mask)
    padded = np.asarray(response_logprobs(graphdef, params, *rows.inputs(), 0.6)[0])
    np.testing.assert_allclose(padded[mask], want[mask], atol=2e-5)
    cfg = _cfg(mini_batch_prompts=N)
    plan, _ = pack_plan(batch, np.ones(N, bool), cfg)
    rows = rows.replace(plan=plan)
    packed = sum(
        np.asarray(
            packed_response_logprobs(graphdef, params, rows, jnp.int32(m), cfg.pack, None, 0.6)[0]
        )
        for m in range(int(np.asarray(plan.micro).max()) + 1)
    )
    np.testing.assert_allclose(packed[mask], want[mask], atol=2e-5)


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "padded"])
def test_the_update_trains_the_policy_at_the_loss_temperature(pack):
    """Old log-probs recorded under the policy at T = 0.6 (as the sampler records them with
    `loss.train_temperature` = the sampling temperature 0.6): with `loss.temperature` 0.6
    the first pass's ratio is 1 on every token; the untempered policy (temperature 1)
    against the same old log-probs is another distribution."""
    model = init_model(get_preset("tiny-qwen2", vocab_size=V), seed=0)
    graphdef, params = nnx.split(model)
    batch = _batch(4)
    logp_t = response_logprobs(graphdef, params, *_response_rows(batch).inputs(), 0.6)[0]
    batch = batch.replace(logp_old=logp_t.reshape(N, G, TN))
    for temperature, on_policy in ((0.6, True), (1.0, False)):
        cfg = _cfg(mini_batch_prompts=N, loss=LossConfig(temperature=temperature))
        cfg = cfg if pack else dataclasses.replace(cfg, pack=None)
        _, metrics = _step(cfg, batch, np.ones(N, bool))
        assert (abs(metrics["loss/ratio_max"] - 1) < 1e-5) == on_policy, temperature
        assert (metrics["loss/approx_kl"] < 1e-9) == on_policy, temperature
