"""Partial rollouts in the slot decoder: the policy version of every token, keys/values
computed anew under new weights (`refill`) against teacher forcing of the old and new
weights, stale keys/values (`keep`) differing from them, and a dropped cache refilled
giving the same samples as one never dropped."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from sampling_helpers import log_softmax, tiny_model

from da3po_jax.sampling import GenerateConfig
from da3po_jax.sampling.continuous import SlotConfig, SlotDecoder

LENGTHS = (9, 5, 2, 7, 3)
G, N = 3, 12
SLOTS = SlotConfig(slots=6, prompt_len=9, steps_per_call=3, block=8)  # 15 rows, 6 slots
SAMPLED = GenerateConfig(num_samples=G, max_new_tokens=N, temperature=1.0)


@pytest.fixture(scope="module")
def models():
    """Two tiny models of one architecture: the old weights A and the new weights B."""
    cfg, graphdef, a, _ = tiny_model(seed=0)
    _, _, b, _ = tiny_model(seed=5)
    return cfg, graphdef, a, b


def _decoder(models) -> SlotDecoder:
    cfg, graphdef, _, _ = models
    rng = np.random.default_rng(0)
    dec = SlotDecoder(graphdef, cfg, SAMPLED, SLOTS)
    keys = jax.random.split(jax.random.key(3), len(LENGTHS))
    for p, n in enumerate(LENGTHS):
        dec.submit(p, rng.integers(1, cfg.vocab_size, n).tolist(), keys[p])
    return dec


def _finish(dec: SlotDecoder, params, groups: dict) -> dict:
    while dec.busy():
        for gr in dec.step(params):
            groups[gr.tag] = gr
    return groups


def _at_switch(dec: SlotDecoder) -> dict:
    """{(prompt, sample): tokens generated} of the rows in flight, and their prompts."""
    return {(r.group.tag, r.sample): (int(dec._steps[s]), r.prompt) for s, r in dec._owner.items()}


def _teacher_forced(graphdef, params, prompt, tokens, length) -> np.ndarray:
    """log p(tokens[k] | prompt, tokens[:k]) for k < length under `params`, one full
    forward of the whole sequence (no cache)."""
    seq = np.asarray(list(prompt) + list(tokens[:length]), np.int32)[None]
    pos = np.arange(seq.shape[1], dtype=np.int32)[None]
    logits, _ = nnx.merge(graphdef, params)(seq, pos, np.ones_like(seq, bool))
    lp = log_softmax(np.asarray(logits[0]))
    start = len(prompt) - 1
    return lp[start + np.arange(length), tokens[:length]]


def test_every_token_records_the_version_that_sampled_it(models):
    _, _, a, _ = models
    dec = _decoder(models)
    groups = {gr.tag: gr for gr in dec.step(a)}
    switch = _at_switch(dec)
    dec.set_version(1)
    _finish(dec, a, groups)
    assert sorted(groups) == list(range(len(LENGTHS)))
    mixed = 0
    for tag, gr in groups.items():
        for i in range(G):
            n = gr.lengths[i]
            if (tag, i) in switch:  # in flight at the switch: version 0, then 1
                k = switch[tag, i][0]
                want = np.r_[np.zeros(k), np.ones(n - k)]
                mixed += 0 < k < n
            else:  # finished before the switch (0) or admitted after it (1)
                want = np.full(n, gr.start_version)
            np.testing.assert_array_equal(gr.version[i, :n], want, err_msg=f"{tag}/{i}")
    assert mixed > 0 and {gr.start_version for gr in groups.values()} == {0, 1}


@pytest.mark.parametrize("partial_kv", ["recompute", "keep"])
def test_refilled_rows_continue_as_the_new_weights_would(models, partial_kv):
    """Rows in flight when the weights change from A to B: the tokens before the switch
    carry A's log-probs; after it, with `refill`, B's teacher-forced log-probs of the same
    sequence (to float rounding); kept stale keys/values give visibly different ones."""
    cfg, graphdef, a, b = models
    dec = _decoder(models)
    groups = {gr.tag: gr for gr in dec.step(a)}
    switch = _at_switch(dec)
    assert len(switch) >= G  # rows in flight at the switch
    dec.set_version(1)
    if partial_kv == "recompute":
        dec.refill(b)
    _finish(dec, b, groups)
    after_diff = []
    for (tag, i), (k, prompt) in switch.items():
        gr = groups[tag]
        n = int(gr.lengths[i])
        ref_a = _teacher_forced(graphdef, a, prompt, gr.tokens[i], n)
        ref_b = _teacher_forced(graphdef, b, prompt, gr.tokens[i], n)
        np.testing.assert_allclose(gr.logp[i, :k], ref_a[:k], atol=2e-5)
        if partial_kv == "recompute":
            np.testing.assert_allclose(gr.logp[i, k:n], ref_b[k:], atol=2e-5)
        after_diff.append(np.abs(gr.logp[i, k:n] - ref_b[k:]).max(initial=0.0))
    if partial_kv == "keep":
        assert max(after_diff) > 1e-3  # the stale keys/values of A change B's predictions


def test_a_dropped_cache_refilled_gives_the_samples_of_one_never_dropped(models):
    _, _, a, b = models
    out = []
    for drop in (False, True):
        dec = _decoder(models)
        groups = {gr.tag: gr for gr in dec.step(a)}
        dec.set_version(1)
        if drop:
            cache = dec._slots.cache
            dec.drop_cache()
            assert all(x.is_deleted() for x in jax.tree.leaves(cache))
        dec.refill(b)
        out.append(_finish(dec, b, groups))
    for tag in out[0]:
        for name in ("tokens", "logp", "sample_logp", "lengths", "version"):
            np.testing.assert_array_equal(
                getattr(out[0][tag], name), getattr(out[1][tag], name), err_msg=name
            )
