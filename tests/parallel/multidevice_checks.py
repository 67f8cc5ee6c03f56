"""Sharded == single-device checks; needs 8 devices, so `test_multidevice.py` runs this
file in a subprocess with `XLA_FLAGS=--xla_force_host_platform_device_count=8`."""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from configs import base  # noqa: E402
from da3po_jax.config import resolve_settings  # noqa: E402
from da3po_jax.models import get_preset, init_model, load_model, positions_from_mask, save_model  # noqa: E402
from da3po_jax.parallel import make_mesh, param_sharding, shard_batch, spec_for  # noqa: E402
from da3po_jax.rl import OverlongConfig  # noqa: E402
from da3po_jax.rollout import GroupBatch  # noqa: E402
from da3po_jax.sampling import GenerateConfig, Sampler  # noqa: E402
from da3po_jax.update import UpdateBatch, UpdateConfig, UpdateProgram, rl_update  # noqa: E402
from da3po_jax.update.state import init_train_state, make_optimizer  # noqa: E402

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (simulated) devices")

MESHES = [(8, 1, 1), (1, 8, 1), (2, 2, 2), (1, 2, 4)]
CFG = get_preset("tiny-qwen2", vocab_size=512)  # 4 heads, 2 KV heads, hidden 64, inter 128
N, G, TP, TN = 8, 2, 8, 6


def _prompts(rng):
    tokens = rng.integers(3, 500, size=(N, TP)).astype(np.int32)
    lengths = rng.integers(3, TP + 1, size=N)
    mask = np.arange(TP)[None, :] >= (TP - lengths)[:, None]
    return np.where(mask, tokens, 0), mask


def _batch():
    rng = np.random.default_rng(0)
    ptok, pmask = _prompts(rng)
    lengths = rng.integers(1, TN + 1, size=(N, G)).astype(np.int32)
    correct = rng.integers(0, 2, size=(N, G)).astype(np.float32)
    correct[:, 0], correct[:, 1] = 1.0, 0.0  # every group mixed
    correct[0] = 0.0  # one all-wrong group (masked by valid below)
    return GroupBatch(
        prompt_tokens=ptok,
        prompt_mask=pmask,
        tokens=rng.integers(3, 500, size=(N, G, TN)).astype(np.int32),
        response_mask=np.arange(TN)[None, None, :] < lengths[..., None],
        logp_old=-rng.uniform(0.5, 8.0, size=(N, G, TN)).astype(np.float32),
        rewards=correct.copy(),
        correct=correct,
        lengths=lengths,
        truncated=np.zeros((N, G), bool),
        prompt_index=np.arange(N, dtype=np.int32),
    ), np.arange(N) > 0


def _step_config():
    c = base.get_config()
    c.tokenizer.build_tiny = True
    cfg = resolve_settings(c)  # da3po: DAA power, token-mean
    return cfg, UpdateConfig(
        group_size=G,
        mini_batch_prompts=4,
        micro_batch_prompts=2,
        num_iterations=1,
        loss=cfg.loss,
        adv=cfg.adv,
        daa=cfg.daa_on,
        overlong=OverlongConfig(max_len=TN, buffer=2, penalty=1.0, filter=True),
    )


def _run_all(mesh):
    """(logits, greedy tokens, step metrics, new params) with everything on `mesh`."""
    sharding = param_sharding(mesh) if mesh is not None else None
    model = init_model(CFG, seed=0, sharding=sharding)
    graphdef, params = nnx.split(model)
    ptok, pmask = _prompts(np.random.default_rng(1))
    tokens, mask = shard_batch((ptok, pmask), mesh) if mesh else (ptok, pmask)
    logits, _ = jax.jit(lambda p, t, m: nnx.merge(graphdef, p)(t, positions_from_mask(m), m))(
        params, tokens, mask
    )
    gen = GenerateConfig(num_samples=2, max_new_tokens=5, temperature=0.0, stop_ids=(1,), pad_id=0)
    out = Sampler(graphdef, CFG, gen).generate(params, jnp.asarray(tokens), jnp.asarray(mask), 0)
    cfg, step_cfg = _step_config()
    # plain SGD with lr 1: the parameter change is exactly the accumulated gradient, so
    # comparing updated parameters compares gradients (AdamW's first step is ~lr * sign(g)
    # and would turn float-rounding noise in near-zero gradients into lr-sized changes)
    tx = optax.sgd(1.0)
    graphdef, state = init_train_state(model, tx, 0, mesh)
    batch, valid = _batch()
    if mesh is not None:
        batch, valid = shard_batch((batch, valid), mesh)
    shardings = jax.tree.map(lambda x: x.sharding, state) if mesh else None
    update = jax.jit(
        rl_update, static_argnames="program", out_shardings=(shardings, None) if mesh else None
    )
    program = UpdateProgram(graphdef, tx, step_cfg)
    new_state, metrics = update(program, state, UpdateBatch(batch, valid))
    return (
        np.asarray(logits),
        np.asarray(out.tokens),
        np.asarray(out.logp),
        {k: float(v) for k, v in metrics.items()},
        new_state,
    )


@pytest.fixture(scope="module")
def reference():
    return _run_all(None)


@pytest.mark.parametrize("shape", MESHES)
def test_sharded_equals_single_device(shape, reference):
    mesh = make_mesh(shape)
    logits, tokens, logp, metrics, state = _run_all(mesh)
    ref_logits, ref_tokens, ref_logp, ref_metrics, ref_state = reference
    np.testing.assert_allclose(logits, ref_logits, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(tokens, ref_tokens)
    np.testing.assert_allclose(logp, ref_logp, atol=1e-5, rtol=1e-5)
    assert metrics.keys() == ref_metrics.keys()
    for k in ref_metrics:
        np.testing.assert_allclose(metrics[k], ref_metrics[k], atol=1e-5, rtol=1e-5, err_msg=k)
    assert ref_metrics["loss/num_tokens"] > 0 and ref_metrics["optim/grad_norm"] > 0
    flat = dict(nnx.to_flat_state(state.params))
    for path, var in nnx.to_flat_state(ref_state.params):
        got = flat[path].get_value() if hasattr(flat[path], "get_value") else flat[path].value
        want = var.get_value() if hasattr(var, "get_value") else var.value
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, err_msg=str(path))
        # updated parameters keep the rules' layout (out_shardings of the step)
        assert got.sharding.spec == spec_for(path, got.shape, mesh), path


def _spec(x):
    return tuple(x.sharding.spec)


def test_parameters_and_moments_follow_the_rules():
    mesh = make_mesh((1, 2, 4))  # fsdp 2, tensor 4
    model = init_model(CFG, seed=0, sharding=param_sharding(mesh))
    layer = model.layers[0]
    assert _spec(model.embed[...]) == ("tensor", "fsdp")
    assert _spec(layer.attn.q[...]) == ("fsdp", "tensor")  # 4 heads over tensor=4
    assert _spec(layer.attn.k[...]) == ("fsdp",)  # 2 KV heads do not divide tensor=4
    assert _spec(layer.attn.o[...]) == ("tensor", None, "fsdp")
    assert _spec(layer.mlp.gate[...]) == ("fsdp", "tensor")
    assert _spec(layer.mlp.down[...]) == ("tensor", "fsdp")
    assert _spec(layer.input_norm.weight[...]) == ()
    # per-device pieces really are slices: [64, 4, 16] -> [32, 1, 16]
    assert {s.data.shape for s in layer.attn.q[...].addressable_shards} == {(32, 1, 16)}
    cfg, _ = _step_config()
    tx, _ = make_optimizer(cfg.optim, 10)
    _, state = init_train_state(model, tx, 0, mesh)
    mu = state.opt_state[1][0].mu
    assert mu["layers"][0]["attn"]["q"].sharding == layer.attn.q[...].sharding
    assert mu["embed"].sharding == model.embed[...].sharding


def test_kv_cache_split_over_batch_and_kv_heads():
    from da3po_jax.sampling.sampler import cache_length, new_cache

    mesh = make_mesh((4, 1, 2))
    ptok, _ = _prompts(np.random.default_rng(0))
    gen = GenerateConfig(num_samples=2, max_new_tokens=4, temperature=0.0, stop_ids=(1,), pad_id=0)
    cache = new_cache(CFG, shard_batch(ptok, mesh), gen)
    assert tuple(cache.k[0].sharding.spec) == (("data", "fsdp"), "tensor")
    slots = cache_length(TP, 4)  # TP + 3, rounded up
    assert {s.data.shape for s in cache.k[0].addressable_shards} == {(4, 1, slots, 16)}


def test_loading_safetensors_places_only_shards(tmp_path):
    model = init_model(CFG, seed=3)
    save_model(model, str(tmp_path / "m"))
    mesh = make_mesh((1, 8, 1))
    loaded = load_model(str(tmp_path / "m"), sharding=param_sharding(mesh))
    for path, var in nnx.to_flat_state(nnx.state(loaded)):
        x = var.get_value() if hasattr(var, "get_value") else var.value
        spec = spec_for(path, x.shape, mesh)
        want = tuple(
            d // (8 if a == "fsdp" else 1) for d, a in zip(x.shape, tuple(spec) + (None,) * x.ndim)
        )
        assert {s.data.shape for s in x.addressable_shards} == {want}, path
        assert len({s.device for s in x.addressable_shards}) == 8
    np.testing.assert_array_equal(np.asarray(loaded.embed[...]), np.asarray(model.embed[...]))
    assert _spec(loaded.embed[...]) == (None, "fsdp")


@pytest.mark.parametrize("shape", [(8, 1, 1), (1, 2, 4)])
def test_packed_scanned_update_on_a_mesh_equals_the_single_device_one(shape, reference):
    """The update with packed micro-batches (split over the batch axes) on a model with
    stacked layers, through `PolicyUpdate` (host plan, placement): the unpacked, unscanned
    single-device step's metrics and parameters."""
    import dataclasses

    from da3po_jax.update import PackConfig, PolicyUpdate

    mesh = make_mesh(shape)
    model = init_model(CFG.replace(scan_layers=True), seed=0, sharding=param_sharding(mesh))
    tx = optax.sgd(1.0)
    graphdef, state = init_train_state(model, tx, 0, mesh)
    _, step_cfg = _step_config()
    step_cfg = dataclasses.replace(step_cfg, micro_batch_prompts=0, pack=PackConfig(0, 8))
    shardings = jax.tree.map(lambda x: x.sharding, state)
    update = PolicyUpdate(
        graphdef, tx, lambda _: 1.0, step_cfg, state_shardings=shardings, mesh=mesh
    )
    batch, valid = shard_batch(_batch(), mesh)
    new_state, metrics = update(state, batch, valid, None)
    *_, ref_metrics, ref_state = reference
    for k in ref_metrics:
        np.testing.assert_allclose(
            float(metrics[k]), ref_metrics[k], atol=1e-5, rtol=1e-5, err_msg=k
        )
    ref = ref_state.params
    got = new_state.params
    for i in range(CFG.num_layers):
        want_i = jax.tree.leaves(ref["layers"][i])
        got_i = jax.tree.leaves(jax.tree.map(lambda a, i=i: a[i], got["layers"]))
        for x, y in zip(got_i, want_i, strict=True):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(got["embed"].get_value()), np.asarray(ref["embed"].get_value()), atol=1e-5
    )
    q = got["layers"]["attn"]["q"].get_value()
    assert q.sharding.spec == spec_for("layers/attn/q", q.shape, mesh)
