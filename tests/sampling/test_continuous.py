"""Continuous batching (`generate_continuous`): the same samples as the static sampler,
log-probs against teacher forcing, stop ids and padding with more or fewer prompts than
slots, token frequencies of a model with fixed logits, no recompiles across admissions,
the blockwise `decode_attention` against dense softmax, and 1 vs 8 devices."""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import left_padded_batch
from flax import nnx
from sampling_helpers import chi_square, log_softmax, ref_log_probs, tiny_model
from scipy import stats
from test_sampling_generate import (
    _as_numpy,
    _fixed_logit_model,
    _forward,
    _full_sequences,
    _teacher_forced_logp,
)

from da3po_jax.models.decode_attention import paged_decode_attention
from da3po_jax.models.transformer import decode_attention
from da3po_jax.sampling import GenerateConfig, generate
from da3po_jax.sampling.continuous import SlotConfig, generate_continuous, trace_counts

LENGTHS = (9, 5, 2, 7, 3)  # unequal prompt lengths (left-padded to 9 for the static engine)
G, N = 3, 12
SLOTS = SlotConfig(slots=6, prompt_len=9, steps_per_call=4, block=8)  # 15 rows, 6 slots
GREEDY = GenerateConfig(num_samples=G, max_new_tokens=N, temperature=0.0)
SAMPLED = GenerateConfig(num_samples=G, max_new_tokens=N, temperature=1.0)
TEMPERED = GenerateConfig(num_samples=G, max_new_tokens=N, temperature=0.8, top_k=40, top_p=0.9)


@pytest.fixture(scope="module")
def tiny():
    return tiny_model()


def _keys(seed: int, num: int) -> jax.Array:
    return jax.random.split(jax.random.key(seed), num)


def _as_lists(tokens: np.ndarray, mask: np.ndarray) -> list[list[int]]:
    """Left-padded rows -> the prompts' token id lists."""
    return [row[m].tolist() for row, m in zip(tokens, mask)]


def _stack(groups) -> dict:
    """FinishedGroups (prompt order) -> arrays [P, G, N] / [P, G] like `SampleOutput`."""
    names = ("tokens", "logp", "sample_logp", "mask", "lengths", "truncated")
    return {k: np.stack([getattr(grp, k) for grp in groups]) for k in names}


def _continuous(tiny, prompts, keys, gen, sc=SLOTS) -> dict:
    _, graphdef, state, _ = tiny
    groups, _ = generate_continuous(graphdef, state, prompts, keys, gen, sc)
    assert [grp.tag for grp in groups] == list(range(len(prompts)))
    return _stack(groups)


@pytest.fixture(scope="module")
def shared(tiny):
    """The shared prompts (left-padded and as lists), their keys, and both engines' outputs
    on them by `GenerateConfig`, each computed once."""
    cfg, graphdef, state, _ = tiny
    tokens, mask = left_padded_batch(cfg.vocab_size, LENGTHS, seed=1)
    prompts, keys = _as_lists(tokens, mask), _keys(0, len(LENGTHS))

    @functools.cache
    def continuous(gen):
        return _continuous(tiny, prompts, keys, gen)

    @functools.cache
    def static(gen):
        return _as_numpy(generate(graphdef, state, tokens, mask, keys, gen))

    return dict(tokens=tokens, mask=mask, prompts=prompts, keys=keys, run=continuous, static=static)


def _assert_same_samples(got: dict, want: dict, atol=1e-5):
    for name in ("tokens", "lengths", "truncated", "mask"):
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    for name in ("logp", "sample_logp"):
        np.testing.assert_allclose(got[name], want[name], atol=atol, rtol=0, err_msg=name)


# ------------------------------------------------------------ same samples as static


def test_greedy_equals_static_engine_and_step_by_step_argmax(tiny, shared):
    """Greedy rows equal the static engine's and a cache-less full forward's argmax, step
    by step, for every sample of every prompt."""
    _, graphdef, state, _ = tiny
    out = shared["run"](GREEDY)
    _assert_same_samples(out, shared["static"](GREEDY))
    prompt, prompt_mask = shared["tokens"], shared["mask"]
    tp = prompt.shape[1]
    seq = np.concatenate([prompt, np.zeros((len(prompt), N), np.int32)], 1)
    m = np.concatenate([prompt_mask, np.zeros((len(prompt), N), bool)], 1)
    for i in range(N):
        logits = _forward(graphdef, state, jnp.asarray(seq), jnp.asarray(m))
        seq[:, tp + i] = np.argmax(np.asarray(logits[:, tp + i - 1]), -1)
        m[:, tp + i] = True
    want = seq[:, tp:]
    assert len(np.unique(want)) >= 5, "degenerate model: greedy repeats a few tokens"
    for g in range(G):
        np.testing.assert_array_equal(out["tokens"][:, g], want)
    assert out["mask"].all() and out["truncated"].all() and not out["sample_logp"].any()
    np.testing.assert_array_equal(out["lengths"], N)


def test_sampled_equals_static_engine_for_the_same_keys(shared):
    """At temperature 1, the same per-prompt keys give the static engine's samples; the G
    samples of a prompt differ (independent draws, not copies)."""
    out = shared["run"](SAMPLED)
    _assert_same_samples(out, shared["static"](SAMPLED))
    assert np.mean(out["tokens"][:, 0] != out["tokens"][:, 1]) > 0.5


# --------------------------------------------------------------------- log-probs


@pytest.mark.parametrize("gen", [SAMPLED, TEMPERED], ids=["t1", "tempered"])
def test_log_probs_equal_teacher_forced_recompute(tiny, shared, gen):
    """`logp` is the temperature-1 log-prob of a teacher-forced recompute on prompt +
    response (`Transformer.token_logprobs`); `sample_logp` is the reference warper's
    log-prob of the same logits."""
    _, graphdef, state, _ = tiny
    out = shared["run"](gen)
    tokens, mask = shared["tokens"], shared["mask"]
    seq, m = (jnp.asarray(a) for a in _full_sequences(tokens, mask, out["tokens"]))
    tp = tokens.shape[1]
    logp = np.asarray(_teacher_forced_logp(graphdef, state, seq, m))
    want = logp[:, tp - 1 : tp - 1 + N].reshape(-1, G, N)
    np.testing.assert_allclose(out["logp"], want, atol=1e-5, rtol=0)
    logits = np.asarray(_forward(graphdef, state, seq, m))[:, tp - 1 : tp - 1 + N]
    ref = ref_log_probs(logits, gen.temperature, gen.top_k, gen.top_p)
    resp = out["tokens"].reshape(-1, N)
    want_s = np.take_along_axis(ref, resp[..., None], -1)[..., 0].reshape(-1, G, N)
    np.testing.assert_allclose(out["sample_logp"], want_s, atol=1e-5, rtol=0)
    if gen.temperature == 1.0 and gen.top_k == 0 and gen.top_p == 1.0:
        np.testing.assert_allclose(out["sample_logp"], out["logp"], atol=1e-6)
    else:
        assert np.abs(out["sample_logp"] - out["logp"]).max() > 1e-2


# ------------------------------------------------------- stop ids, padding, slots


@pytest.fixture(scope="module")
def stopping(tiny, shared):
    """7 prompts x G=2 through 8 slots (groups wait for slots), with stop ids chosen from
    the stop-free samples so that one row stops at its first token and one mid-way, and a
    pad id."""
    cfg = tiny[0]
    free = shared["run"](SAMPLED)["tokens"]  # [5, 3, N]; samples 0, 1 are the G=2 samples
    gen = GenerateConfig(
        num_samples=2,
        max_new_tokens=N,
        temperature=1.0,
        stop_ids=(int(free[0, 0, 0]), int(free[2, 1, 5])),
        pad_id=511,
    )
    extra, extra_mask = left_padded_batch(cfg.vocab_size, (4, 8), seed=2)
    prompts = shared["prompts"] + _as_lists(extra, extra_mask)
    keys = jnp.concatenate([shared["keys"], _keys(9, 2)])
    sc = SlotConfig(slots=8, prompt_len=9, steps_per_call=4, block=8)
    out = _continuous(tiny, prompts, keys, gen, sc)
    return dict(prompts=prompts, keys=keys, gen=gen, sc=sc, out=out)


def test_stop_ids_padding_truncation_with_more_prompts_than_slots(shared, stopping):
    """Lengths, truncation, mask, pad_id / zero log-probs past the end (a row stopping at
    token 0 has length 1), and the stop-free rows (same keys) cut at their first stop id."""
    out, gen = stopping["out"], stopping["gen"]
    free = shared["run"](SAMPLED)
    for p in range(len(stopping["prompts"])):
        for g in range(gen.num_samples):
            tok, length = out["tokens"][p, g], out["lengths"][p, g]
            hits = np.flatnonzero(np.isin(tok, gen.stop_ids))
            assert length == (hits[0] + 1 if len(hits) else N), (p, g)
            assert out["truncated"][p, g] == (len(hits) == 0), (p, g)
            np.testing.assert_array_equal(out["mask"][p, g], np.arange(N) < length)
            np.testing.assert_array_equal(tok[length:], gen.pad_id)
            for name in ("logp", "sample_logp"):
                assert not out[name][p, g, length:].any(), (name, p, g)
                assert np.all(out[name][p, g, :length] < 0), (name, p, g)
            if p < len(LENGTHS):  # the stop-free row, cut at its first stop id
                np.testing.assert_array_equal(tok[:length], free["tokens"][p, g, :length])
                np.testing.assert_allclose(
                    out["logp"][p, g, :length], free["logp"][p, g, :length], atol=1e-5
                )
    lengths = out["lengths"]
    assert lengths[0, 0] == 1 and not out["truncated"][0, 0], "no row stopped at token 0"
    assert out["truncated"].any() and (lengths == N).any(), "no row hit the cap"
    assert ((lengths > 1) & (lengths < N)).any(), "no row stopped mid-way"
    assert (lengths[:, 0] != lengths[:, 1]).any(), "no group with rows of different lengths"


def test_fewer_prompts_than_slots_and_prompt_order(tiny, shared):
    """One prompt (G=3 of 6 slots) and the prompts in another order give each prompt the
    samples it gets in the shared run: samples follow the prompt's key, not its slot."""
    whole = shared["run"](SAMPLED)
    prompts, keys = shared["prompts"], shared["keys"]
    alone = _continuous(tiny, prompts[3:4], keys[3:4], SAMPLED)
    order = [4, 2, 0, 3, 1]
    shuffled = _continuous(tiny, [prompts[i] for i in order], keys[jnp.array(order)], SAMPLED)
    for name in ("tokens", "lengths", "truncated"):
        np.testing.assert_array_equal(alone[name][0], whole[name][3], err_msg=name)
        np.testing.assert_array_equal(shuffled[name], whole[name][order], err_msg=name)
    np.testing.assert_allclose(alone["logp"][0], whole["logp"][3], atol=1e-6)
    np.testing.assert_allclose(shuffled["logp"], whole["logp"][order], atol=1e-6)


# -------------------------------------------------------------------- recompiles


def _other_prompts(vocab: int):
    """Prompts of other lengths and tokens (as many as the shared ones) and other keys."""
    tokens, mask = left_padded_batch(vocab, (1, 8, 4, 9, 6), seed=5)
    return _as_lists(tokens, mask), _keys(11, 5)


def test_no_retrace_after_warm_up(tiny, shared):
    """After a first call, one with other prompts (same slot config, prompt length and
    sampling settings, many admissions) traces none of the jitted functions again."""
    warm = shared["run"](SAMPLED)
    before = trace_counts()
    assert {"admit_groups", "decode_steps", "read_rows"} <= before.keys()
    prompts, keys = _other_prompts(tiny[0].vocab_size)
    _, graphdef, state, _ = tiny
    groups, decoder = generate_continuous(graphdef, state, prompts, keys, SAMPLED, SLOTS)
    assert trace_counts() == before, (before, trace_counts())
    assert decoder.decode_steps > N  # several rounds of admissions
    other = _stack(groups)
    assert not np.array_equal(other["tokens"], warm["tokens"])


def test_no_xla_compile_after_warm_up(tiny, caplog):
    """A second call with warm shapes compiles nothing at all (XLA compile log), not only
    none of the traced-and-counted functions."""
    prompts, keys = _other_prompts(tiny[0].vocab_size)
    _, graphdef, state, _ = tiny
    generate_continuous(graphdef, state, prompts, keys, SAMPLED, SLOTS)  # warm-up
    prompts, keys = prompts[::-1], keys[::-1]
    caplog.clear()
    with caplog.at_level(logging.WARNING), jax.log_compiles(True):
        generate_continuous(graphdef, state, prompts, keys, SAMPLED, SLOTS)
    compiled = [r.getMessage() for r in caplog.records if "Finished XLA compilation" in r.message]
    assert not compiled, (
        "a warm generate_continuous call compiled again (jit(init): init_slots wraps a new "
        f"closure in jax.jit on every call): {compiled}"
    )


# ------------------------------------------------------------ sampling frequencies


@pytest.fixture(scope="module")
def fixed_logits():
    """A model whose logits are the same at every position (`_fixed_logit_model`) and
    those logits, read off a full forward."""
    cfg, model = _fixed_logit_model(np.array([1.5, 1.0, 0.3, -0.2, 0.8, -1.0, 0.5, 0.0]))
    graphdef, state = nnx.split(model)
    tokens, mask = left_padded_batch(cfg.vocab_size, (5, 2), seed=0)
    logits = np.asarray(_forward(graphdef, state, jnp.asarray(tokens), jnp.asarray(mask)))
    np.testing.assert_allclose(logits[:, -1], np.broadcast_to(logits[0, -1], (2, 8)), atol=1e-6)
    return (cfg, graphdef, state, model), logits[0, -1]


@pytest.mark.parametrize(
    "params",
    [dict(temperature=0.7), dict(temperature=1.5, top_k=4, top_p=0.9)],
    ids=str,
)
def test_generated_token_frequencies_match_target_distribution(fixed_logits, params):
    """Tokens of a model with the same logits everywhere follow the warped distribution
    (chi-square over every position of groups admitted into reused slots); both log-probs
    match the reference."""
    model, target_logits = fixed_logits
    num_prompts, g, n = 32, 64, 8
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 8, size=rng.integers(1, 6)).tolist() for _ in range(num_prompts)]
    gen = GenerateConfig(num_samples=g, max_new_tokens=n, **params)
    sc = SlotConfig(slots=4 * g, prompt_len=5, steps_per_call=n, block=8)
    out = _continuous(model, prompts, _keys(3, num_prompts), gen, sc)
    assert out["tokens"].shape == (num_prompts, g, n) and out["mask"].all()
    counts = np.bincount(out["tokens"].ravel(), minlength=8)
    target_logp = ref_log_probs(target_logits, **params)
    target = np.exp(target_logp)
    for name in ("top_k", "top_p"):  # each truncation binds: without it the support differs
        if name in params:
            rest = {k: v for k, v in params.items() if k != name}
            assert (np.exp(ref_log_probs(target_logits, **rest)) > 0).sum() > (target > 0).sum()
    assert counts[target == 0].sum() == 0
    stat, df = chi_square(counts, target)
    assert stat < stats.chi2.ppf(0.999, df), (stat, counts, target)
    np.testing.assert_allclose(out["sample_logp"], target_logp[out["tokens"]], atol=1e-5)
    np.testing.assert_allclose(out["logp"], log_softmax(target_logits)[out["tokens"]], atol=1e-5)


# -------------------------------------------------------------- decode attention


_DECODE = {
    "blockwise": jax.jit(decode_attention, static_argnums=4),
    "paged": jax.jit(paged_decode_attention, static_argnums=4),
}


def _dense_attention(q, k, v, lengths):
    """float64 softmax attention of q [S, kvh, g, D] over the first lengths[s] keys."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    out = np.zeros(q.shape)
    for s, n in enumerate(lengths):
        if n:
            sc = np.einsum("kgd,tkd->kgt", q[s], k[s, :n]) / np.sqrt(q.shape[-1])
            p = np.exp(sc - sc.max(-1, keepdims=True))
            out[s] = np.einsum("kgt,tkd->kgd", p / p.sum(-1, keepdims=True), v[s, :n])
    return out


@pytest.mark.parametrize("impl", sorted(_DECODE))
@pytest.mark.parametrize("block", [1, 8, 24])
def test_decode_attention_equals_dense_softmax(block, impl):
    """Ragged lengths (0, inside a block, at a block edge, the full capacity) against
    dense softmax; keys past every length, even NaN beyond the blocks visited, do not
    count (only blocks below the longest length are read)."""
    _decode_attention = _DECODE[impl]
    s, cap, kvh, g, d = 6, 24, 2, 3, 8
    rng = np.random.default_rng(block)
    q = rng.normal(size=(s, kvh, g, d)).astype(np.float32)
    k = 3 * rng.normal(size=(s, cap, kvh, d)).astype(np.float32)
    v = rng.normal(size=(s, cap, kvh, d)).astype(np.float32)
    for lengths in ([0, 1, 5, 8, 17, cap], [0, 3, 0, 2, 1, 4]):
        lengths = np.asarray(lengths, np.int32)
        got = np.asarray(_decode_attention(q, k, v, jnp.asarray(lengths), block))
        assert got.dtype == np.float32 and got.shape == q.shape
        np.testing.assert_allclose(got, _dense_attention(q, k, v, lengths), atol=1e-5, rtol=0)
        assert not got[lengths == 0].any()
    bound = -(-4 // block) * block  # blocks visited for the longest length, 4
    if bound < cap:
        k2, v2 = k.copy(), v.copy()
        k2[:, bound:], v2[:, bound:] = np.nan, np.nan
        got = np.asarray(_decode_attention(q, k2, v2, jnp.asarray(lengths), block))
        np.testing.assert_allclose(got, _dense_attention(q, k, v, lengths), atol=1e-5, rtol=0)


@pytest.mark.parametrize("block", [1, 4, 8])
def test_paged_decode_attention_reads_only_each_slots_live_blocks(block):
    """`paged` visits the live (slot, block) pairs only: a slot's blocks past its own
    length are never read (NaN there changes nothing), where `blockwise` reads every
    slot up to the longest one (NaN reaches the shorter slots' outputs). More slots'
    blocks than slots (several iterations) and slots with no keys between live ones."""
    s, cap, kvh, g, d = 5, 32, 2, 2, 8
    rng = np.random.default_rng(block)
    q = rng.normal(size=(s, kvh, g, d)).astype(np.float32)
    k = rng.normal(size=(s, cap, kvh, d)).astype(np.float32)
    v = rng.normal(size=(s, cap, kvh, d)).astype(np.float32)
    lengths = np.asarray([3, 0, 32, 9, 0], np.int32)
    live = -(-lengths // block) * block  # each slot's live blocks end here
    k2, v2 = k.copy(), v.copy()
    for i, n in enumerate(live):
        k2[i, n:], v2[i, n:] = np.nan, np.nan
    want = _dense_attention(q, k, v, lengths)
    got = np.asarray(_DECODE["paged"](q, k2, v2, jnp.asarray(lengths), block))
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    stale = np.asarray(_DECODE["blockwise"](q, k2, v2, jnp.asarray(lengths), block))
    assert np.isnan(stale[0]).any()  # slot 0 (3 keys) visited up to slot 2's 32


@pytest.mark.parametrize("impl", sorted(_DECODE))
def test_decode_attention_rejects_cache_not_a_multiple_of_block(impl):
    q = jnp.zeros((2, 1, 1, 4))
    kv = jnp.zeros((2, 10, 1, 4))
    fn = decode_attention if impl == "blockwise" else paged_decode_attention
    with pytest.raises(ValueError, match="multiple of the block"):
        fn(q, kv, kv, jnp.array([3, 10], jnp.int32), 4)


# ------------------------------------------------------------------- 8 devices

_SHARDED = textwrap.dedent(
    """
    import jax, numpy as np
    from flax import nnx
    from da3po_jax.models import Transformer, get_preset
    from da3po_jax.parallel import make_mesh, replicated
    from da3po_jax.sampling import GenerateConfig
    from da3po_jax.sampling.continuous import SlotConfig, generate_continuous, init_slots

    assert jax.device_count() == 8, jax.devices()
    ref = np.load({path!r})
    cfg = get_preset("tiny-qwen2")
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    mesh = make_mesh((8, 1, 1))
    leaves = [ref[f"param{{i}}"] for i in range(len(jax.tree.leaves(abstract)))]
    state = jax.device_put(jax.tree.unflatten(jax.tree.structure(abstract), leaves),
                           replicated(mesh))
    prompts = [row[:n].tolist() for row, n in zip(ref["prompts"], ref["prompt_lengths"])]
    keys = jax.random.wrap_key_data(ref["keys"])
    gen, sc = GenerateConfig(**{gen}), SlotConfig(**{sc})
    slots = init_slots(cfg, gen, sc, mesh)
    for x in (slots.tokens, slots.cache.k[0]):
        assert len(x.sharding.device_set) == 8, x.sharding
        assert x.addressable_shards[0].data.shape[0] == sc.slots // 8, x.sharding
    groups, _ = generate_continuous(graphdef, state, prompts, keys, gen, sc, mesh=mesh)
    for name in ("tokens", "lengths", "truncated", "logp", "sample_logp"):
        got = np.stack([getattr(grp, name) for grp in groups])
        if name in ("logp", "sample_logp"):
            np.testing.assert_allclose(got, ref[name], atol=1e-5, rtol=0, err_msg=name)
        else:
            np.testing.assert_array_equal(got, ref[name], err_msg=name)
    print("SHARDED_OK")
    """
)


@pytest.mark.multidevice
def test_eight_devices_equal_one(tiny, stopping, tmp_path):
    """The stop-id run's 8 slots split over 8 simulated CPU devices (parameters
    replicated) give the 1-device samples: same tokens, lengths, truncation, log-probs
    (a subprocess: the device count is fixed when JAX starts)."""
    gen, sc, prompts = stopping["gen"], stopping["sc"], stopping["prompts"]
    padded = np.zeros((len(prompts), sc.prompt_len), np.int32)
    for i, ids in enumerate(prompts):
        padded[i, : len(ids)] = ids
    params = {f"param{i}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(tiny[2]))}
    path = str(tmp_path / "ref.npz")
    names = ("tokens", "lengths", "truncated", "logp", "sample_logp")
    np.savez(
        path,
        prompts=padded,
        prompt_lengths=np.array([len(p) for p in prompts]),
        keys=np.asarray(jax.random.key_data(stopping["keys"])),
        **{k: stopping["out"][k] for k in names},
        **params,
    )
    fields = ("num_samples", "max_new_tokens", "temperature", "stop_ids", "pad_id")
    code = _SHARDED.format(
        path=path,
        gen={f: getattr(gen, f) for f in fields},
        sc=dict(
            slots=sc.slots,
            prompt_len=sc.prompt_len,
            steps_per_call=sc.steps_per_call,
            block=sc.block,
        ),
    )
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and "SHARDED_OK" in proc.stdout, (
        proc.stdout[-3000:] + proc.stderr[-6000:]
    )
