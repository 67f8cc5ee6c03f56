"""On-policy distillation in the trainer: teacher log-probs, degenerate cases of the jitted
update (teacher = student, fully filtered batch), tokenizer checks, 2-step smoke runs."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from test_train_smoke import HashScorer, micro_config, read_rows  # noqa: F401

import da3po_jax.run.context as context_lib
from da3po_jax.config import resolve_settings
from da3po_jax.data import corpus
from da3po_jax.models import get_preset, init_model, positions_from_mask, save_model
from da3po_jax.models.tokenizer import Tokenizer, build_bpe_tokenizer
from da3po_jax.rl import AdvantageConfig, LossConfig, OPDConfig, OverlongConfig, RAOPDConfig
from da3po_jax.rollout.batch import GroupBatch
from da3po_jax.run import train
from da3po_jax.run.teacher import check_same_tokenizer, load_teacher
from da3po_jax.runtime.checkpoint import Checkpointer, CheckpointError
from da3po_jax.update import FrozenModels, UpdateBatch, UpdateConfig, UpdateProgram, rl_update
from da3po_jax.update.state import init_train_state

N, G, TP, TN, V = 2, 4, 5, 6, 64


def _batch(seed: int = 0) -> GroupBatch:
    rng = np.random.default_rng(seed)
    prompt_mask = np.ones((N, TP), bool)
    prompt_mask[0, :2] = False  # left padding
    lengths = rng.integers(1, TN + 1, (N, G))
    response_mask = np.arange(TN)[None, None] < lengths[..., None]
    correct = np.array([[1, 0, 1, 0], [0, 0, 1, 1]], np.float32)
    return GroupBatch(
        prompt_tokens=jnp.asarray(rng.integers(1, V, (N, TP)), jnp.int32),
        prompt_mask=jnp.asarray(prompt_mask),
        tokens=jnp.asarray(rng.integers(1, V, (N, G, TN)), jnp.int32),
        response_mask=jnp.asarray(response_mask),
        logp_old=jnp.asarray(rng.normal(np.log(1 / V), 0.05, (N, G, TN)), jnp.float32),
        rewards=jnp.asarray(correct),
        correct=jnp.asarray(correct),
        lengths=jnp.asarray(lengths, jnp.int32),
        truncated=jnp.zeros((N, G), bool),
        prompt_index=jnp.arange(N, dtype=jnp.int32),
    )


def _models(teacher_seed: int):
    cfg = get_preset("tiny-qwen2", vocab_size=V)
    return init_model(cfg, seed=0), init_model(cfg.replace(num_layers=1), seed=teacher_seed)


def _step_cfg(ra: bool = False, recompute: bool = False, **opd) -> UpdateConfig:
    return UpdateConfig(
        group_size=G,
        mini_batch_prompts=1,
        micro_batch_prompts=0,
        num_iterations=1,
        loss=LossConfig(eps_high=0.2, agg="token-mean"),
        adv=AdvantageConfig(),
        daa=None,
        overlong=OverlongConfig(max_len=TN),
        recompute_logp_old=recompute,
        opd=OPDConfig(**opd),
        ra_opd=RAOPDConfig() if ra else None,
    )


def _update(student, teacher_params, teacher_graphdef, cfg, batch, valid=None):
    tx = optax.sgd(0.1)
    graphdef, state = init_train_state(student, tx, 0)
    valid = jnp.ones(N, bool) if valid is None else valid
    step = jax.jit(rl_update, static_argnames="program")
    new, metrics = step(
        UpdateProgram(graphdef, tx, cfg, teacher_graphdef=teacher_graphdef),
        state,
        UpdateBatch(batch, valid),
        FrozenModels(teacher_params=teacher_params),
    )
    return state, new, {k: float(v) for k, v in metrics.items()}


def _direct_teacher_logprobs(teacher, batch: GroupBatch) -> np.ndarray:
    """log softmax of the teacher's full logits, read at each response token: [N * G, TN]."""
    pt = jnp.repeat(batch.prompt_tokens, G, axis=0)
    pm = jnp.repeat(batch.prompt_mask, G, axis=0)
    toks = batch.tokens.reshape(N * G, TN)
    rm = batch.response_mask.reshape(N * G, TN)
    full, attn = jnp.concatenate([pt, toks], 1), jnp.concatenate([pm, rm], 1)
    logits, _ = teacher(full, positions_from_mask(attn), attn)
    logp = jax.nn.log_softmax(logits[:, TP - 1 : TP - 1 + TN], axis=-1)
    return np.asarray(jnp.take_along_axis(logp, toks[..., None], -1)[..., 0])


def test_teacher_logprobs_equal_a_direct_forward():
    """The step's reverse KL and distillation returns match a direct teacher forward (a
    different architecture from the student: one layer)."""
    student, teacher = _models(teacher_seed=7)
    tg, tp = nnx.split(teacher)
    batch = _batch()
    _, _, met = _update(student, tp, tg, _step_cfg(), batch)
    lt = _direct_teacher_logprobs(teacher, batch)
    m = np.asarray(batch.response_mask.reshape(N * G, TN))
    lo = np.asarray(batch.logp_old.reshape(N * G, TN))
    k = np.where(m, lo - lt, 0.0)
    d = -k.sum(-1)
    np.testing.assert_allclose(met["opd/reverse_kl"], k.sum() / m.sum(), rtol=1e-5)
    np.testing.assert_allclose(met["opd/return_mean"], d.mean(), rtol=1e-5)
    np.testing.assert_allclose(met["opd/return_std"], d.std(), rtol=1e-4)
    np.testing.assert_allclose(
        [met["opd/return_min"], met["opd/return_max"]], [d.min(), d.max()], rtol=1e-5
    )
    # the advantages fed to the loss are -k per token (coef 1, gamma 0)
    np.testing.assert_allclose(met["opd/adv_token_mean"], -k.sum() / m.sum(), rtol=1e-5)
    assert np.isfinite(met["loss/total"]) and met["optim/grad_norm"] > 0


@pytest.mark.parametrize("ra", [False, True])
def test_teacher_equal_to_student_gives_zero_update(ra):
    """teacher = student and recomputed old log-probs: k = 0 exactly, so OPD's advantages
    and gradient vanish, and RA-OPD (D = 0 is aligned with neither verdict) keeps nothing;
    no NaN anywhere."""
    student, _ = _models(teacher_seed=7)
    sg, sp = nnx.split(student)
    sp = jax.tree.map(jnp.copy, sp)  # the state's own buffers are donated by nothing here
    state, new, met = _update(student, sp, sg, _step_cfg(ra=ra, recompute=True), _batch())
    assert all(np.isfinite(v) for v in met.values()), met
    assert abs(met["opd/reverse_kl"]) < 1e-6
    assert met["loss/total"] == 0.0 and met["optim/grad_norm"] == 0.0
    if ra:
        assert met["ra_opd/kept_frac"] == 0.0 and met["loss/num_tokens"] == 0.0
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(new.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fully_filtered_batch_gives_zero_loss_and_gradient():
    student, teacher = _models(teacher_seed=7)
    tg, tp = nnx.split(teacher)
    for cfg in (_step_cfg(), _step_cfg(ra=True, gamma=0.9, with_outcome=True)):
        _, _, met = _update(student, tp, tg, cfg, _batch(), valid=jnp.zeros(N, bool))
        assert all(np.isfinite(v) for v in met.values()), met
        assert met["loss/total"] == 0.0 and met["optim/grad_norm"] == 0.0
        assert met["loss/num_tokens"] == 0.0 and met["opd/reverse_kl"] == 0.0


def test_ra_opd_filter_in_the_step_matches_the_rule():
    """The step keeps exactly the trajectories with (c = 1, D > 0) or (c = 0, D < 0)."""
    student, teacher = _models(teacher_seed=7)
    tg, tp = nnx.split(teacher)
    batch = _batch(1)
    _, _, met = _update(student, tp, tg, _step_cfg(ra=True), batch)
    lt = _direct_teacher_logprobs(teacher, batch)
    m = np.asarray(batch.response_mask.reshape(N * G, TN))
    d = np.where(m, lt - np.asarray(batch.logp_old.reshape(N * G, TN)), 0.0).sum(-1)
    c = np.asarray(batch.correct).reshape(-1) > 0
    keep = np.where(c, d > 0, d < 0)
    assert met["ra_opd/kept_frac"] == pytest.approx(keep.mean())
    assert met["ra_opd/aligned_frac_correct"] == pytest.approx(keep[c].mean())
    assert met["ra_opd/aligned_frac_incorrect"] == pytest.approx(keep[~c].mean())
    assert met["loss/num_tokens"] == (m * keep[:, None]).sum()


# ----------------------------------------------------------------- tokenizer / loading
@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    texts = corpus(200, seed=0, template="tiny")
    build_bpe_tokenizer(str(root / "a"), texts, vocab_size=265)
    build_bpe_tokenizer(str(root / "same"), texts, vocab_size=265)
    build_bpe_tokenizer(str(root / "bigger"), texts, vocab_size=270)
    build_bpe_tokenizer(str(root / "other"), corpus(200, seed=5, template="dapo"), vocab_size=265)
    return root


def test_tokenizer_check(tokenizers):
    student = Tokenizer.load(str(tokenizers / "a"))
    check_same_tokenizer(student, str(tokenizers / "same"))  # identical: no error
    with pytest.raises(ValueError, match=r"has vocab size 2\d\d, the student's has 2\d\d"):
        check_same_tokenizer(student, str(tokenizers / "bigger"))
    other = Tokenizer.load(str(tokenizers / "other"))
    assert other.vocab_size == student.vocab_size  # same size, different merges
    with pytest.raises(ValueError, match="differs from the student's|encodes"):
        check_same_tokenizer(student, str(tokenizers / "other"))


def test_load_teacher_checks_tokenizer_and_vocab(tokenizers, tmp_path):
    tok = Tokenizer.load(str(tokenizers / "a"))
    student = init_model(get_preset("tiny-qwen2", vocab_size=512))

    def cfg_for(path):
        return resolve_settings(micro_config("opd", **{"teacher.path": path}))

    small = str(tmp_path / "small")  # the tokenizer matches, the embedding is too small
    save_model(
        init_model(get_preset("tiny-qwen2", vocab_size=280)),
        small,
        tokenizer_dir=str(tokenizers / "a"),
    )
    with pytest.raises(ValueError, match="teacher's vocab_size=280 .* smaller than the student"):
        load_teacher(cfg_for(small), tok, student)
    wrong = str(tmp_path / "wrong")
    save_model(student, wrong, tokenizer_dir=str(tokenizers / "other"))
    with pytest.raises(ValueError, match="teacher tokenizer in"):
        load_teacher(cfg_for(wrong), tok, student)
    with pytest.raises(FileNotFoundError, match="config.teacher.path"):
        load_teacher(cfg_for(str(tmp_path / "missing")), tok, student)
    good = str(tmp_path / "good")
    save_model(student, good, tokenizer_dir=str(tokenizers / "a"))
    teacher = load_teacher(cfg_for(good), tok, student)
    assert teacher.config.vocab_size == 512


def test_opd_config_validation():
    cfg = resolve_settings(micro_config("ra_opd", **{"teacher.preset": "tiny-qwen2"}))
    assert (cfg.ds.enable, cfg.daa.enable, cfg.loss.agg) == (False, False, "token-mean")
    assert cfg.loss.eps_high == cfg.loss.eps_low
    with pytest.raises(ValueError, match="config.teacher.path is required"):
        resolve_settings(micro_config("opd"))
    with pytest.raises(ValueError, match=r"config.opd.gamma=1.5 must be in \[0, 1\]"):
        resolve_settings(micro_config("opd", **{"teacher.preset": "x", "opd.gamma": 1.5}))
    with pytest.raises(ValueError, match="config.ra_opd.baseline='median'"):
        resolve_settings(
            micro_config("ra_opd", **{"teacher.preset": "x", "ra_opd.baseline": "median"})
        )
    with pytest.raises(ValueError, match="config.daa.enable=True .*config.opd.with_outcome"):
        resolve_settings(micro_config("opd", **{"teacher.preset": "x", "daa.enable": True}))


# ----------------------------------------------------------------- end to end
@pytest.mark.slow
@pytest.mark.parametrize("algo", ["opd", "ra_opd"])
def test_two_step_smoke(tmp_path, monkeypatch, algo):
    monkeypatch.setattr(context_lib, "RewardScorer", HashScorer)
    workdir = str(tmp_path / algo)
    cfg = micro_config(algo, **{"teacher.preset": "tiny-qwen2", "teacher.seed": 7})
    summary = train(cfg, workdir)
    assert summary["steps"] == 2 and "eval/avg@2" in summary["teacher"]
    rows = [r for r in read_rows(workdir) if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert np.isfinite(r["loss/total"]) and r["ds/prompts"] == 4
        assert r["opd/reverse_kl"] != 0.0  # the teacher (another init) ran
        assert r["opd/return_min"] <= r["opd/return_mean"] <= r["opd/return_max"]
        assert r["opd/return_std"] > 0
        if algo == "ra_opd":  # every response is in the batch (no dynamic sampling)
            acc, kept = r["reward/acc"], r["ra_opd/kept_frac"]
            assert kept == pytest.approx(
                acc * r["ra_opd/aligned_frac_correct"]
                + (1 - acc) * r["ra_opd/aligned_frac_incorrect"]
            )
            assert r["loss/num_tokens"] < r["response/len_mean"] * 16 or kept == 1.0
    ck = Checkpointer(workdir)
    step, host = ck.newest_host()
    assert step == 2 and host["config"]["teacher"] == "preset:tiny-qwen2:seed7"
    ck.close()
    # the teacher is part of the fingerprint: another one cannot resume this run
    other = micro_config(algo, **{"teacher.preset": "tiny-qwen2", "teacher.seed": 8})
    with pytest.raises(CheckpointError, match="teacher: checkpoint"):
        train(other, workdir)
    assert os.path.isfile(os.path.join(workdir, "teacher_eval.json"))
