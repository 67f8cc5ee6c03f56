"""The sampling distribution itself: truncation, log-probs, draws and their frequencies."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sampling_helpers import chi_square, log_softmax, ref_log_probs
from scipy import stats

from da3po_jax.sampling import SamplingParams, draw, sampling_logits
from da3po_jax.sampling.distribution import argmax, inverse_cdf, truncation_threshold

SETTINGS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.6),
    SamplingParams(temperature=1.7),
    SamplingParams(temperature=1.0, top_k=5),
    SamplingParams(temperature=0.8, top_k=1),
    SamplingParams(temperature=1.0, top_p=0.8),
    SamplingParams(temperature=0.7, top_p=0.5),
    SamplingParams(temperature=1.3, top_k=7, top_p=0.9),
    SamplingParams(temperature=1.0, top_k=40, top_p=0.3),
]


def _logits(rows: int, vocab: int, seed: int = 0, scale: float = 2.0) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).normal(0, scale, (rows, vocab)), jnp.float32)


@pytest.mark.parametrize("params", SETTINGS, ids=str)
def test_sampling_logits_match_reference(params):
    x = _logits(8, 300)
    got = np.asarray(jax.nn.log_softmax(sampling_logits(x, params), axis=-1))
    want = ref_log_probs(np.asarray(x), params.temperature, params.top_k, params.top_p)
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    np.testing.assert_allclose(got[np.isfinite(want)], want[np.isfinite(want)], atol=1e-5)


@pytest.mark.parametrize("params", SETTINGS, ids=str)
def test_draw_returns_policy_and_sampling_log_probs(params):
    x = _logits(64, 300, seed=1)
    d = jax.jit(draw, static_argnums=2)(jax.random.key(3), x, params)
    tok = np.asarray(d.token)
    rows = np.arange(len(tok))
    want_policy = log_softmax(np.asarray(x))[rows, tok]
    want_sample = ref_log_probs(np.asarray(x), params.temperature, params.top_k, params.top_p)
    assert np.all(np.isfinite(want_sample[rows, tok])), "drew a token outside the kept set"
    np.testing.assert_allclose(np.asarray(d.logp), want_policy, atol=1e-5)
    np.testing.assert_allclose(np.asarray(d.sample_logp), want_sample[rows, tok], atol=1e-5)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.6, policy_temperature=0.6),
        SamplingParams(temperature=1.3, top_k=7, policy_temperature=1.3),
        SamplingParams(temperature=0.7, policy_temperature=1.0),
        SamplingParams(temperature=0.0, policy_temperature=0.8),
    ],
    ids=str,
)
def test_draw_records_the_log_prob_of_the_trained_policy_temperature(params):
    """`Draw.logp` is log softmax(x / T')[token] with T' = policy_temperature (the policy the
    trainer trains); when T' is the sampling temperature and nothing truncates, it is the
    sampling log-prob itself (on-policy: no importance correction)."""
    x = _logits(64, 300, seed=2)
    d = jax.jit(draw, static_argnums=2)(jax.random.key(5), x, params)
    tok = np.asarray(d.token)
    rows = np.arange(len(tok))
    want = log_softmax(np.asarray(x, np.float64) / params.policy_temperature)[rows, tok]
    np.testing.assert_allclose(np.asarray(d.logp), want, atol=1e-5)
    if params.is_policy(300):
        np.testing.assert_array_equal(np.asarray(d.logp), np.asarray(d.sample_logp))
    elif not params.greedy:
        assert np.abs(np.asarray(d.logp) - np.asarray(d.sample_logp)).max() > 1e-2


def test_policy_temperature_must_be_positive():
    with pytest.raises(ValueError, match="policy_temperature=0"):
        SamplingParams(policy_temperature=0.0)


def test_draw_on_a_vocabulary_without_small_divisors():
    """1031 is prime: the blocked sampler pads to whole blocks, never drawing padding."""
    x = _logits(512, 1031, seed=8, scale=0.3)
    d = draw(jax.random.key(2), x, SamplingParams(temperature=1.0))
    tok = np.asarray(d.token)
    assert tok.min() >= 0 and tok.max() < 1031 and len(np.unique(tok)) > 300
    want = log_softmax(np.asarray(x))[np.arange(512), tok]
    np.testing.assert_allclose(np.asarray(d.logp), want, atol=1e-5)
    np.testing.assert_allclose(np.asarray(d.sample_logp), want, atol=1e-5)


def test_greedy_is_argmax_with_zero_sampling_log_prob():
    x = _logits(16, 600, seed=2)
    d = draw(jax.random.key(0), x, SamplingParams(temperature=0.0))
    np.testing.assert_array_equal(np.asarray(d.token), np.argmax(np.asarray(x), -1))
    np.testing.assert_array_equal(np.asarray(d.sample_logp), 0.0)
    rows = np.arange(16)
    want = log_softmax(np.asarray(x))[rows, np.argmax(np.asarray(x), -1)]
    np.testing.assert_allclose(np.asarray(d.logp), want, atol=1e-5)


@pytest.mark.parametrize("vocab", [7, 512, 1031, 151936])
def test_blocked_argmax_matches_first_maximum(vocab):
    x = np.array(_logits(4, vocab, seed=vocab))
    x[1, [3, vocab - 1]] = 100.0  # a tie: the first index wins, as jnp.argmax
    x[2, :] = 0.0  # all tied
    x[3, vocab // 2 :] = 50.0  # tie across blocks
    np.testing.assert_array_equal(np.asarray(argmax(jnp.asarray(x))), np.argmax(x, -1))


def test_top_k_one_is_greedy():
    x = _logits(32, 500, seed=4)
    d = draw(jax.random.key(1), x, SamplingParams(temperature=0.9, top_k=1))
    np.testing.assert_array_equal(np.asarray(d.token), np.argmax(np.asarray(x), -1))
    np.testing.assert_allclose(np.asarray(d.sample_logp), 0.0, atol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_disabled_truncation_leaves_distribution_unchanged(temperature):
    vocab = 300
    x = _logits(64, vocab, seed=5)
    plain = SamplingParams(temperature=temperature)
    for off in (
        SamplingParams(temperature=temperature, top_p=1.0, top_k=0),
        SamplingParams(temperature=temperature, top_k=vocab),
    ):
        assert truncation_threshold(x, off) is None
        np.testing.assert_array_equal(sampling_logits(x, off), sampling_logits(x, plain))
        a, b = draw(jax.random.key(9), x, off), draw(jax.random.key(9), x, plain)
        np.testing.assert_array_equal(np.asarray(a.token), np.asarray(b.token))
        np.testing.assert_array_equal(np.asarray(a.sample_logp), np.asarray(b.sample_logp))


@pytest.mark.parametrize(
    "params", [SamplingParams(top_p=0.9), SamplingParams(0.5, 20, 0.95)], ids=str
)
def test_top_p_bisection_fallback_equals_sorted_nucleus(params):
    """A flat distribution's nucleus is far larger than 4 candidates: the exact bisection
    branch runs and must keep exactly the reference's set."""
    x = _logits(6, 1000, seed=6, scale=0.5)
    fallback = truncation_threshold(x, params, candidates=4)
    fast = truncation_threshold(x, params, candidates=1000)
    np.testing.assert_array_equal(np.asarray(fallback), np.asarray(fast))
    want = ref_log_probs(np.asarray(x), params.temperature, params.top_k, params.top_p)
    kept = np.asarray(x) >= np.asarray(fallback)[:, None]
    np.testing.assert_array_equal(kept, np.isfinite(want))
    assert kept.sum(-1).min() > 4


def test_inverse_cdf_edges_stay_in_support():
    vocab = 768  # three blocks of 256
    z = np.full((5, vocab), -np.inf, np.float32)
    z[:, [300, 301, 700]] = [0.0, 1.0, -1.0]  # block 0 and most of 1-2 have no mass
    u = jnp.asarray([0.0, 1.0 - 2**-24, 0.5, 0.999, 1e-9], jnp.float32)
    tok, lse = inverse_cdf(jnp.asarray(z), u)
    np.testing.assert_array_equal(np.asarray(tok)[[0, 1, 4]], [300, 700, 300])
    assert set(np.asarray(tok).tolist()) <= {300, 301, 700}
    np.testing.assert_allclose(np.asarray(lse), np.log(1 + np.e + np.exp(-1)), rtol=1e-6)


def test_same_key_same_tokens_different_keys_differ():
    x = _logits(256, 300, seed=7, scale=0.5)
    p = SamplingParams(temperature=1.0, top_p=0.95)
    a = np.asarray(draw(jax.random.key(1), x, p).token)
    b = np.asarray(draw(jax.random.key(1), x, p).token)
    c = np.asarray(draw(jax.random.key(2), x, p).token)
    np.testing.assert_array_equal(a, b)
    assert np.mean(a != c) > 0.9


FREQ_SETTINGS = [
    SamplingParams(temperature=0.6),
    SamplingParams(temperature=1.5),
    SamplingParams(temperature=1.0, top_k=6),
    SamplingParams(temperature=1.0, top_p=0.7),
    SamplingParams(temperature=1.3, top_k=12, top_p=0.8),
]


@pytest.mark.parametrize("params", FREQ_SETTINGS, ids=str)
def test_token_frequencies_match_target(params):
    """100k draws over a 512-token vocabulary (two blocks) whose mass sits on 24 tokens
    spread over both blocks; Pearson's chi-square must stay below its 99.9% quantile for
    the target distribution and exceed it for the untempered, untruncated one."""
    rng = np.random.default_rng(11)
    vocab, rows, rounds = 512, 25_000, 4
    logits = np.full(vocab, -40.0, np.float32)
    live = rng.choice(vocab, 24, replace=False)
    logits[live] = rng.normal(0.0, 1.2, 24)
    x = jnp.broadcast_to(jnp.asarray(logits), (rows, vocab))
    sample = jax.jit(lambda k, x: draw(k, x, params).token)  # x an argument: no constant folding
    tokens = np.concatenate([np.asarray(sample(jax.random.key(i), x)) for i in range(rounds)])
    counts = np.bincount(tokens, minlength=vocab)
    target = np.exp(ref_log_probs(logits, params.temperature, params.top_k, params.top_p))
    assert counts[target < 1e-12].sum() == 0, "sampled outside the kept set"
    stat, df = chi_square(counts, target)
    bound = stats.chi2.ppf(0.999, df)
    assert stat < bound, (stat, bound)
    wrong_stat, wrong_df = chi_square(counts, np.exp(log_softmax(logits)))
    assert wrong_stat > 10 * stats.chi2.ppf(0.999, wrong_df), "the test has no power"
