"""Scanned layers (`ModelConfig.scan_layers`): the stacked layout gives the unscanned
model's logits, gradients and sampled tokens, round-trips through HF folders either way,
takes the sharding rules with an unsplit leading layer axis, and traces one layer body
whatever the depth."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import left_padded_batch
from flax import nnx
from jax.sharding import AbstractMesh, AxisType, PartitionSpec

from da3po_jax.models import get_preset, init_model, load_model, positions_from_mask, save_model
from da3po_jax.parallel.rules import spec_for
from da3po_jax.sampling import GenerateConfig
from da3po_jax.sampling.continuous import SlotConfig, generate_continuous
from da3po_jax.sampling.sampler import generate

V = 96


def _pair(**overrides):
    cfg = get_preset("tiny-qwen2", vocab_size=V, **overrides)
    return init_model(cfg, seed=3), init_model(cfg.replace(scan_layers=True), seed=3)


def _batch():
    tokens, mask = left_padded_batch(V, lengths=(9, 5, 2), seed=2)
    mask = jnp.asarray(mask)
    return jnp.asarray(tokens), positions_from_mask(mask), mask


def test_stacked_parameters_are_the_unscanned_ones():
    flat, scanned = _pair()
    stacked = nnx.state(scanned.layers)
    assert stacked["attn"]["q"].get_value().shape[0] == flat.config.num_layers
    for i, layer in enumerate(flat.layers):
        got = jax.tree.map(lambda a, i=i: np.asarray(a[i]), stacked)
        want = jax.tree.map(np.asarray, nnx.state(layer))
        for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("remat,policy", [(False, "nothing"), (True, "nothing"), (True, "dots")])
def test_scanned_logits_and_gradients_equal_unscanned(remat, policy):
    flat, scanned = _pair(remat=remat, remat_policy=policy)
    tokens, pos, mask = _batch()
    targets = jnp.roll(tokens, -1, axis=1)

    def loss_and_grads(model):
        graphdef, params = nnx.split(model)

        def loss(p):
            lp, _ = nnx.merge(graphdef, p).token_logprobs(tokens, pos, mask, targets)
            return -(lp * mask).sum()

        return jax.jit(jax.value_and_grad(loss))(params)

    (l_flat, g_flat), (l_scan, g_scan) = loss_and_grads(flat), loss_and_grads(scanned)
    np.testing.assert_allclose(float(l_scan), float(l_flat), rtol=1e-6)
    np.testing.assert_allclose(
        np.asarray(scanned(tokens, pos, mask)[0]),
        np.asarray(flat(tokens, pos, mask)[0]),
        atol=1e-5,
        rtol=1e-5,
    )
    for i in range(flat.config.num_layers):
        want = jax.tree.leaves(g_flat["layers"][i])
        got = jax.tree.leaves(jax.tree.map(lambda a, i=i: a[i], g_scan["layers"]))
        for x, y in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(
        np.asarray(g_scan["embed"].get_value()),
        np.asarray(g_flat["embed"].get_value()),
        atol=1e-5,
        rtol=1e-5,
    )


def test_scanned_model_samples_the_same_tokens():
    """The cached paths (prefill, static decode, continuous slots) run the stacked layers
    one by one: the same greedy tokens and log-probs as the unscanned model."""
    flat, scanned = _pair()
    tokens, _, mask = _batch()
    gen = GenerateConfig(num_samples=2, max_new_tokens=6, temperature=0.0, stop_ids=(), pad_id=0)
    outs = [generate(*nnx.split(m), tokens, mask, jax.random.key(0), gen) for m in (flat, scanned)]
    np.testing.assert_array_equal(np.asarray(outs[0].tokens), np.asarray(outs[1].tokens))
    np.testing.assert_allclose(np.asarray(outs[0].logp), np.asarray(outs[1].logp), atol=1e-5)
    prompts = [row[m].tolist() for row, m in zip(np.asarray(tokens), np.asarray(mask))]
    keys = jax.random.split(jax.random.key(0), len(prompts))
    sc = SlotConfig(slots=4, prompt_len=16, steps_per_call=4, block=8)
    groups = [
        generate_continuous(*nnx.split(m), prompts, keys, gen, sc)[0] for m in (flat, scanned)
    ]
    for a, b in zip(*groups, strict=True):
        np.testing.assert_array_equal(a.tokens, b.tokens)


def test_hf_folders_round_trip_between_layouts(tmp_path):
    """Unscanned export -> scanned load -> export -> unscanned load: the same weights."""
    flat, _ = _pair()
    save_model(flat, str(tmp_path / "a"))
    scanned = load_model(str(tmp_path / "a"), scan_layers=True)
    assert scanned.config.scan_layers
    save_model(scanned, str(tmp_path / "b"))
    back = load_model(str(tmp_path / "b"))
    for x, y in zip(
        jax.tree.leaves(nnx.state(back)), jax.tree.leaves(nnx.state(flat)), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    tokens, pos, mask = _batch()
    np.testing.assert_allclose(
        np.asarray(scanned(tokens, pos, mask)[0]),
        np.asarray(flat(tokens, pos, mask)[0]),
        atol=1e-5,
        rtol=1e-5,
    )


def test_sharding_rules_leave_the_layer_axis_unsplit():
    mesh = AbstractMesh((1, 2, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
    assert spec_for("layers/attn/q", (4, 64, 4, 16), mesh) == PartitionSpec(None, "fsdp", "tensor")
    assert spec_for("layers/3/attn/q", (64, 4, 16), mesh) == PartitionSpec("fsdp", "tensor")
    assert spec_for("opt_state/0/mu/layers/mlp/down", (4, 128, 64), mesh) == PartitionSpec(
        None, "tensor", "fsdp"
    )


def test_scanned_trace_does_not_grow_with_depth():
    """The lowered forward+backward of a scanned model holds one layer body: its size is
    the same at 2 and 6 layers, while the unrolled one grows with the depth."""

    def hlo_size(num_layers: int, scan: bool) -> int:
        cfg = get_preset("tiny-qwen2", vocab_size=V, num_layers=num_layers, scan_layers=scan)
        graphdef, params = nnx.split(nnx.eval_shape(lambda: init_model(cfg, 0)))
        tokens, pos, mask = _batch()

        def loss(p):
            lp, _ = nnx.merge(graphdef, p).token_logprobs(tokens, pos, mask, tokens)
            return lp.sum()

        return len(jax.jit(jax.grad(loss)).lower(params).as_text())

    scanned = hlo_size(2, True), hlo_size(6, True)
    unrolled = hlo_size(2, False), hlo_size(6, False)
    assert scanned[1] < 1.05 * scanned[0]
    assert unrolled[1] > 2 * unrolled[0]
