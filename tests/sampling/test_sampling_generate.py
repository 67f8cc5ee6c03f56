"""End-to-end `generate`: cached decoding against full forwards, EOS handling, seeds,
compile counts, cache donation, and token frequencies of a model with fixed logits."""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import left_padded_batch
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from sampling_helpers import chi_square, log_softmax, ref_log_probs, tiny_model
from scipy import stats

from da3po_jax.models import ModelConfig, Transformer, get_preset, positions_from_mask
from da3po_jax.parallel.mesh import BATCH_AXES, make_mesh
from da3po_jax.sampling import GenerateConfig, Sampler, generate, new_cache, trace_count
from da3po_jax.sampling.sampler import cache_length

LENGTHS = (9, 5, 2)  # unequal prompt lengths, left-padded to 9


@pytest.fixture(scope="module")
def tiny():
    return tiny_model()


def _prompts(vocab: int):
    return left_padded_batch(vocab, LENGTHS, seed=1)


def _as_numpy(out) -> dict:
    return {f.name: np.asarray(getattr(out, f.name)) for f in dataclasses.fields(out)}


def _run(tiny, seed=0, **kw) -> dict:
    cfg, graphdef, state, _ = tiny
    tokens, mask = _prompts(cfg.vocab_size)
    out = generate(graphdef, state, tokens, mask, jax.random.key(seed), GenerateConfig(**kw))
    return _as_numpy(out)


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, tokens, mask):
    """Cache-less float32 logits [B, T, V] of a full forward pass."""
    logits, _ = nnx.merge(graphdef, state)(tokens, positions_from_mask(mask), mask)
    return logits


@functools.partial(jax.jit, static_argnums=0)
def _teacher_forced_logp(graphdef, state, tokens, mask):
    """log p(tokens[:, t + 1]) read off position t, by `Transformer.token_logprobs`."""
    targets = jnp.pad(tokens[:, 1:], ((0, 0), (0, 1)))
    model = nnx.merge(graphdef, state)
    return model.token_logprobs(tokens, positions_from_mask(mask), mask, targets)[0]


def _full_sequences(tokens, mask, response):
    """Prompt rows repeated G times with their responses appended: [P*G, Tp + N]."""
    g, n = response.shape[1:]
    seq = np.concatenate([np.repeat(tokens, g, 0), response.reshape(-1, n)], 1)
    full_mask = np.concatenate([np.repeat(mask, g, 0), np.ones((len(seq), n), bool)], 1)
    return seq, full_mask


def test_greedy_equals_step_by_step_argmax_of_full_forward(tiny):
    cfg, graphdef, state, _ = tiny
    n = 12
    out = _run(tiny, num_samples=2, max_new_tokens=n, temperature=0.0)
    prompt, prompt_mask = _prompts(cfg.vocab_size)
    tp = prompt.shape[1]
    # Room for the response on the right, masked until written: causal attention makes
    # the logits at the last written position those of the sequence so far, and one
    # fixed shape means one compile. No cache: every step reruns the whole sequence.
    seq = np.concatenate([prompt, np.zeros((len(prompt), n), np.int32)], 1)
    m = np.concatenate([prompt_mask, np.zeros((len(prompt), n), bool)], 1)
    for i in range(n):
        logits = _forward(graphdef, state, jnp.asarray(seq), jnp.asarray(m))
        seq[:, tp + i] = np.argmax(np.asarray(logits[:, tp + i - 1]), -1)
        m[:, tp + i] = True
    want = seq[:, tp:]
    assert len(np.unique(want)) >= 5, "degenerate model: greedy repeats a few tokens"
    for g in range(2):
        np.testing.assert_array_equal(out["tokens"][:, g], want)
    assert out["mask"].all() and not out["sample_logp"].any()
    np.testing.assert_array_equal(out["lengths"], n)
    assert out["truncated"].all() and int(out["num_steps"]) == n - 1


@pytest.mark.parametrize(
    "kw", [dict(temperature=1.0), dict(temperature=0.8, top_k=40, top_p=0.9)], ids=str
)
def test_log_probs_equal_teacher_forced_recompute(tiny, kw):
    cfg, graphdef, state, _ = tiny
    n, g = 10, 3
    out = _run(tiny, seed=4, num_samples=g, max_new_tokens=n, **kw)
    tokens, mask = _prompts(cfg.vocab_size)
    seq, m = (jnp.asarray(a) for a in _full_sequences(tokens, mask, out["tokens"]))
    tp = tokens.shape[1]
    logp = np.asarray(_teacher_forced_logp(graphdef, state, seq, m))
    want = logp[:, tp - 1 : tp - 1 + n].reshape(-1, g, n)
    np.testing.assert_allclose(out["logp"], want, atol=1e-5, rtol=0)
    logits = np.asarray(_forward(graphdef, state, seq, m))[:, tp - 1 : tp - 1 + n]  # [R, N, V]
    ref = ref_log_probs(logits, kw["temperature"], kw.get("top_k", 0), kw.get("top_p", 1.0))
    resp = out["tokens"].reshape(-1, n)
    want_s = np.take_along_axis(ref, resp[..., None], -1)[..., 0].reshape(-1, g, n)
    np.testing.assert_allclose(out["sample_logp"], want_s, atol=1e-5, rtol=0)
    if kw["temperature"] == 1.0:
        np.testing.assert_allclose(out["sample_logp"], out["logp"], atol=1e-6)


def test_top_k_one_equals_greedy(tiny):
    greedy = _run(tiny, num_samples=2, max_new_tokens=8, temperature=0.0)
    top1 = _run(tiny, seed=5, num_samples=2, max_new_tokens=8, temperature=1.3, top_k=1)
    np.testing.assert_array_equal(top1["tokens"], greedy["tokens"])
    np.testing.assert_allclose(top1["logp"], greedy["logp"], atol=1e-6)


def test_same_seed_same_samples_different_seed_different(tiny):
    kw = dict(num_samples=4, max_new_tokens=8, temperature=1.0)
    a, b, c = _run(tiny, seed=7, **kw), _run(tiny, seed=7, **kw), _run(tiny, seed=8, **kw)
    np.testing.assert_array_equal(a["tokens"], b["tokens"])
    np.testing.assert_array_equal(a["logp"], b["logp"])
    assert np.mean(a["tokens"] != c["tokens"]) > 0.5
    # the G samples of one prompt are independent draws, not copies
    assert np.mean(a["tokens"][:, 0] != a["tokens"][:, 1]) > 0.5


def test_samples_are_keyed_by_prompt_not_by_batch_row(tiny):
    """With one key per prompt, a prompt's G samples are the same alone, in another batch
    and at another row (keys per (prompt, sample, position), not per row or call)."""
    cfg, graphdef, state, _ = tiny
    tokens, mask = _prompts(cfg.vocab_size)
    config = GenerateConfig(num_samples=3, max_new_tokens=8, temperature=1.0)
    keys = jax.random.split(jax.random.key(3), 3)
    whole = _as_numpy(generate(graphdef, state, tokens, mask, keys, config))
    order = np.array([2, 0, 1])
    shuffled = _as_numpy(generate(graphdef, state, tokens[order], mask[order], keys[order], config))
    alone = _as_numpy(generate(graphdef, state, tokens[1:2], mask[1:2], keys[1:2], config))
    for name in ("tokens", "lengths"):
        np.testing.assert_array_equal(shuffled[name], whole[name][order])
        np.testing.assert_array_equal(alone[name][0], whole[name][1])
    np.testing.assert_allclose(alone["logp"][0], whole["logp"][1], atol=1e-6)
    assert np.mean(whole["tokens"][:, 0] != whole["tokens"][:, 1]) > 0.5


def test_stop_ids_set_lengths_masks_padding_and_truncation(tiny):
    n, pad = 10, 511
    free = _run(tiny, num_samples=1, max_new_tokens=n, temperature=0.0)["tokens"][:, 0]
    stop = int(free[0, 4])
    assert stop not in free[1] or stop not in free[2], "need a row that never stops"
    out = _run(
        tiny, num_samples=1, max_new_tokens=n, temperature=0.0, stop_ids=(stop, 510), pad_id=pad
    )
    tok = out["tokens"][:, 0]
    for r in range(len(LENGTHS)):
        hits = np.flatnonzero(np.isin(free[r], (stop, 510)))
        length = hits[0] + 1 if len(hits) else n
        assert out["lengths"][r, 0] == length
        assert out["truncated"][r, 0] == (len(hits) == 0)
        np.testing.assert_array_equal(tok[r, :length], free[r, :length])
        np.testing.assert_array_equal(tok[r, length:], pad)
        np.testing.assert_array_equal(out["mask"][r, 0], np.arange(n) < length)
        assert not out["logp"][r, 0, length:].any()
        assert np.all(out["logp"][r, 0, :length] < 0)
    assert out["lengths"][0, 0] <= 5 and out["truncated"].any()


def test_loop_exits_early_when_every_row_stopped(tiny):
    n = 16
    free = _run(tiny, num_samples=2, max_new_tokens=n, temperature=0.0)
    assert int(free["num_steps"]) == n - 1
    stops = tuple(int(t) for t in np.unique(free["tokens"][:, :, :3]))
    out = _run(tiny, num_samples=2, max_new_tokens=n, temperature=0.0, stop_ids=stops)
    assert not out["truncated"].any()
    assert out["lengths"].max() <= 3
    assert int(out["num_steps"]) == out["lengths"].max() - 1


def test_sampler_reuses_donated_cache_without_recompiling(tiny):
    cfg, graphdef, state, _ = tiny
    sampler = Sampler(graphdef, cfg, GenerateConfig(num_samples=2, max_new_tokens=6))
    tokens, mask = _prompts(cfg.vocab_size)
    before = trace_count()
    first = sampler.generate(state, tokens, mask, seed=0)
    assert trace_count() == before + 1
    (cache,) = sampler._caches.values()
    pointer = cache.k[0].unsafe_buffer_pointer()
    other, other_mask = left_padded_batch(cfg.vocab_size, (3, 9, 4), seed=2)
    second = sampler.generate(state, other, other_mask, seed=1)
    assert trace_count() == before + 1, "second call with the same bucket recompiled"
    assert cache.k[0].is_deleted(), "the cache was not donated"
    (cache2,) = sampler._caches.values()
    assert cache2.k[0].unsafe_buffer_pointer() == pointer, "the cache buffer was reallocated"
    assert not np.array_equal(np.asarray(first.tokens), np.asarray(second.tokens))
    longer, longer_mask = left_padded_batch(cfg.vocab_size, (12, 3, 4), seed=3)
    sampler.generate(state, longer, longer_mask, seed=1)  # a new bucket compiles once
    assert trace_count() == before + 2 and len(sampler._caches) == 1
    assert cache2.k[0].is_deleted(), "the previous bucket's cache was not freed"


def _fixed_logit_model(target: np.ndarray):
    """A 1-layer model whose logits are the same at every position, whatever the input:
    every weight is zero except the attention output bias (so each layer input is a
    constant), the final norm and the output head."""
    vocab = len(target)
    cfg = ModelConfig(
        model_type="llama",
        vocab_size=vocab,
        hidden_size=8,
        intermediate_size=8,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=4,
        attention_bias=True,
        o_bias=True,
    )
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    nnx.update(model, jax.tree.map(jnp.zeros_like, nnx.state(model)))
    model.final_norm.weight.value = jnp.ones((8,))
    model.layers[0].attn.o_bias.value = jnp.eye(8)[0]
    model.lm_head.value = jnp.zeros((8, vocab)).at[0].set(jnp.asarray(target))
    return cfg, model


@pytest.mark.extended
def test_generated_token_frequencies_match_target_distribution():
    params = dict(temperature=0.8, top_k=6, top_p=0.85)
    cfg, model = _fixed_logit_model(np.array([1.5, 1.0, 0.3, -0.2, 0.8, -1.0, 0.5, 0.0]))
    tokens, mask = left_padded_batch(cfg.vocab_size, (5, 2), seed=0)
    logits = np.asarray(
        model(jnp.asarray(tokens), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask))[0]
    )
    target_logits = logits[0, -1]
    np.testing.assert_allclose(logits[:, -1], np.broadcast_to(target_logits, (2, 8)), atol=1e-6)
    graphdef, state = nnx.split(model)
    config = GenerateConfig(num_samples=2500, max_new_tokens=4, **params)
    out = _as_numpy(generate(graphdef, state, tokens, mask, jax.random.key(0), config))
    assert out["tokens"].shape == (2, 2500, 4)
    counts = np.bincount(out["tokens"].ravel(), minlength=8)
    target_logp = ref_log_probs(target_logits, **params)
    target = np.exp(target_logp)
    assert counts[target == 0].sum() == 0
    stat, df = chi_square(counts, target)
    assert stat < stats.chi2.ppf(0.999, df), (stat, counts, target)
    np.testing.assert_allclose(out["sample_logp"], target_logp[out["tokens"]], atol=1e-5)
    np.testing.assert_allclose(out["logp"], log_softmax(target_logits)[out["tokens"]], atol=1e-5)


def test_decode_weights_gathers_over_the_batch_axes_in_the_compute_dtype():
    from jax.sharding import AbstractMesh, AxisType
    from jax.sharding import PartitionSpec as P

    from da3po_jax.parallel import AXES, spec_for
    from da3po_jax.sampling.sampler import decode_weights

    cfg, _, state, _ = tiny_model(param_dtype="float32", dtype="bfloat16")
    assert decode_weights(state, cfg) is state  # no mesh: the weights as they are
    mesh = AbstractMesh((1, 4, 2), AXES, axis_types=(AxisType.Auto,) * 3)
    with jax.sharding.use_abstract_mesh(mesh):
        jaxpr = jax.make_jaxpr(lambda s: decode_weights(s, cfg))(state).jaxpr
        out = jax.eval_shape(lambda s: decode_weights(s, cfg), state)
    # the weights leave through one optimization barrier, each from its last constraint
    (barrier,) = [e for e in jaxpr.eqns if e.primitive.name == "optimization_barrier"]
    made_by = {id(v): e for e in jaxpr.eqns for v in e.outvars}
    specs = [made_by[id(v)].params["sharding"].spec for v in barrier.invars]
    leaves = jax.tree_util.tree_leaves_with_path(state)
    assert len(specs) == len(leaves)
    batch_split = 0
    for (path, x), spec, y in zip(leaves, specs, jax.tree.leaves(out)):
        want = tuple(spec_for(path, x.shape, mesh))
        batch_split += "fsdp" in want
        want += (None,) * (x.ndim - len(want))
        assert spec == P(*[None if a == "fsdp" else a for a in want]), path
        assert y.dtype == (jnp.bfloat16 if x.ndim >= 2 else jnp.float32), path
    assert batch_split > 0  # the mesh splits some weights over fsdp: they are gathered


def test_a_weight_split_on_its_last_dimension_is_gathered_along_the_one_before():
    """`gather_steps`: the batch axes move from a weight's last dimension to the one
    before it (when it divides) before the all-gather; other weights go straight there."""
    from jax.sharding import AbstractMesh, AxisType
    from jax.sharding import PartitionSpec as P

    from da3po_jax.parallel import AXES
    from da3po_jax.sampling.sampler import gather_steps

    mesh = AbstractMesh((2, 4, 2), AXES, axis_types=(AxisType.Auto,) * 3)
    down = gather_steps(P(None, "tensor", ("data", "fsdp")), (3, 64, 32), mesh)
    assert down == [P(None, ("tensor", "data", "fsdp"), None), P(None, "tensor", None)]
    embed = gather_steps(P("tensor", "fsdp"), (512, 64), mesh)
    assert embed == [P(("tensor", "fsdp"), None), P("tensor", None)]
    assert gather_steps(P("fsdp", "tensor"), (64, 128), mesh) == [P(None, "tensor")]
    # 12 rows do not divide over tensor x fsdp = 8: gathered where it is
    assert gather_steps(P("tensor", "fsdp"), (12, 64), mesh) == [P("tensor", None)]
    assert gather_steps(P(), (64,), mesh) == [P(None)]


def _compiles(caplog) -> list[str]:
    """The XLA compilations `jax.log_compiles` logged since `caplog` was last cleared."""
    return [r.getMessage() for r in caplog.records if "Finished XLA compilation" in r.message]


def test_a_new_cache_of_shapes_seen_before_compiles_nothing(caplog):
    """The static engine makes its cache anew every RL step (`Sampler.clear` frees it
    before the update): a cache of shapes seen before compiles nothing (before, each call
    wrapped a fresh `functools.partial` in `jax.jit`, whose cache never hit, so every step
    compiled it again). The cache is zeroed, of the generate call's shapes, and placed like
    the prompts, also for prompts split over a mesh."""
    cfg = get_preset("tiny-qwen2", num_layers=1)
    gen = GenerateConfig(num_samples=3, max_new_tokens=5)
    tokens, _ = _prompts(cfg.vocab_size)
    mesh = make_mesh((1, 1, 1), jax.devices()[:1])
    on_mesh = jax.device_put(tokens, NamedSharding(mesh, PartitionSpec(BATCH_AXES)))
    for prompts in (jnp.asarray(tokens), on_mesh):
        first = new_cache(cfg, prompts, gen)
        caplog.clear()
        with caplog.at_level(logging.WARNING), jax.log_compiles(True):
            second = new_cache(cfg, prompts, gen)
        assert not _compiles(caplog), _compiles(caplog)
        rows, slots = len(LENGTHS) * 3, cache_length(tokens.shape[1], 5)
        for cache in (first, second):
            assert len(cache.k) == len(cache.v) == cfg.num_layers
            for x in (*cache.k, *cache.v):
                assert x.shape == (rows, cfg.num_kv_heads, slots, cfg.head_dim)
                assert x.dtype == cfg.jnp_dtype and not np.asarray(x).any()
                assert x.sharding.is_equivalent_to(prompts.sharding, x.ndim)
            assert cache.mask.shape == (rows, slots) and not np.asarray(cache.mask).any()
            assert int(cache.index) == 0
        if isinstance(prompts.sharding, NamedSharding):
            assert first.k[0].sharding.spec == PartitionSpec(BATCH_AXES, None)
            assert first.mask.sharding.spec == PartitionSpec(BATCH_AXES)


def test_sampler_after_clear_compiles_nothing(tiny, caplog):
    """An RL step of the static engine: generate, free the cache for the update
    (`clear`), generate again with the same shapes: no XLA compilation at all."""
    cfg, graphdef, state, _ = tiny
    sampler = Sampler(graphdef, cfg, GenerateConfig(num_samples=2, max_new_tokens=6))
    tokens, mask = _prompts(cfg.vocab_size)
    sampler.generate(state, tokens, mask, seed=0)  # warm-up (compiled already by the test above)
    sampler.clear()
    caplog.clear()
    with caplog.at_level(logging.WARNING), jax.log_compiles(True):
        sampler.generate(state, tokens, mask, seed=1)
    assert not _compiles(caplog), _compiles(caplog)
