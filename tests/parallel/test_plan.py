"""The memory planner (`da3po_jax.plan`): exact sharded parameter bytes, agreement with live
buffers on one device, the CLI, the recipes' verdicts and mesh errors."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import jax
import pytest

from da3po_jax.plan import (
    abstract_mesh,
    abstract_params,
    plan_memory,
    plan_settings,
    tree_nbytes,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_config(name: str):
    path = os.path.join(ROOT, "configs", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_plan_cfg_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def tiny_hand_bytes(f: int, t: int) -> int:
    """tiny-qwen2 (V=512, H=64, I=128, 2 layers, 4 heads, 2 KV heads, head_dim 16, tied,
    q/k/v bias, f32) per device, by hand from the rules table."""
    kv_t = t if 2 % t == 0 else 1  # 2 KV heads: tensor dropped when it does not divide
    layer = (
        64 * 4 * 16 // (f * t)  # q [fsdp, tensor, -]
        + 2 * (64 * 2 * 16 // (f * kv_t))  # k, v
        + 4 * 16 * 64 // (t * f)  # o [tensor, -, fsdp]
        + 4 * 16 // t  # q_bias [tensor]
        + 2 * (2 * 16 // kv_t)  # k_bias, v_bias
        + 2 * (64 * 128 // (f * t))  # gate, up [fsdp, tensor]
        + 128 * 64 // (t * f)  # down [tensor, fsdp]
        + 2 * 64  # two norms, replicated
    )
    return 4 * (2 * layer + 512 * 64 // (t * f) + 64)  # + embed [tensor, fsdp] + final norm


@pytest.mark.parametrize(
    "shape", [(1, 1, 1), (8, 1, 1), (1, 4, 1), (1, 1, 2), (2, 2, 2), (1, 2, 4)]
)
def test_param_bytes_exact(shape):
    from da3po_jax.models import get_preset

    params = abstract_params(get_preset("tiny-qwen2"))
    assert tree_nbytes(params, abstract_mesh(shape)) == tiny_hand_bytes(shape[1], shape[2])


def tiny_cfg():
    c = load_config("tiny_math")
    c.eval.prompts_per_call = 4  # keep the rollout cache the larger one
    c.mesh.shape = (1, 1, 1)
    c.rollout.engine = "static"  # the sampler's cache (the slots': the tests below)
    return c


def test_plan_matches_live_buffers_on_one_device():
    from da3po_jax.models import get_preset, init_model
    from da3po_jax.parallel import make_mesh, param_sharding, shard_batch
    from da3po_jax.sampling.sampler import GenerateConfig, new_cache
    from da3po_jax.update.state import init_train_state, make_optimizer

    cfg = tiny_cfg()
    plan = plan_memory(plan_settings(cfg), num_devices=1)
    mesh = make_mesh((1, 1, 1), jax.devices()[:1])
    model = init_model(get_preset("tiny-qwen2", vocab_size=512), sharding=param_sharding(mesh))
    tx, _ = make_optimizer(cfg.optim, cfg.train.steps)
    _, state = init_train_state(model, tx, 0, mesh)

    def live(tree):
        return sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(tree))

    assert plan.params == pytest.approx(live(state.params), rel=0.1)
    assert plan.optimizer == pytest.approx(live(state.opt_state), rel=0.1)

    p, tp = cfg.rollout.prompts_per_round, max(cfg.rollout.prompt_buckets)
    prompts = shard_batch(jax.numpy.zeros((p, tp), jax.numpy.int32), mesh)
    gen = GenerateConfig(num_samples=cfg.rollout.group_size, max_new_tokens=48)
    cache = new_cache(model.config, prompts, gen)
    assert plan.kv_cache == pytest.approx(live(cache), rel=0.1)
    assert plan.info["rollout_rows"] == p * cfg.rollout.group_size


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "da3po_jax.plan", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_table_and_json():
    base = ["--config=configs/tiny_math.py", "--config.mesh.shape=1,1,1", "--num_devices=1"]
    out = run_cli(*base, "--device=v5e")
    assert out.returncode == 0, out.stderr
    assert "PEAK" in out.stdout and "kv_cache" in out.stdout and "fits: True" in out.stdout
    out = run_cli(*base, "--device_gib=0.001", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["fits"] is False and data["params"] > 0 and data["info"]["mesh"] == [1, 1, 1]


@pytest.mark.parametrize(
    "name, device, devices",
    [
        ("qwen_math_7b_v5p8", "v5p", 4),
        ("qwen_math_7b_8xh100", "h100", 8),
        ("qwen_math_1p5b_v5e8", "v5e", 8),
        ("qwen_math_1p5b_h200", "h200", 1),
        ("qwen_math_1p5b_h100", "h100", 1),
    ],
)
def test_recipes_fit_their_devices(name, device, devices):
    plan = plan_memory(plan_settings(load_config(name)), num_devices=devices, device=device)
    assert plan.fits, plan.table()


def test_the_h200_recipe_does_not_fit_one_h100():
    """Why the one-H100 recipe exists: the H200 one's 16-row micro-batches plan past 80 GiB."""
    plan = plan_memory(
        plan_settings(load_config("qwen_math_1p5b_h200")), num_devices=1, device="h100"
    )
    assert not plan.fits, plan.table()


def test_7b_does_not_fit_one_v5e():
    plan = plan_memory(plan_settings(load_config("qwen_math_7b_v5p8")), (1, 1, 1), 1, device="v5e")
    assert not plan.fits and plan.peak > plan.device_bytes


def last_line(out: subprocess.CompletedProcess) -> str:
    return out.stderr.strip().splitlines()[-1]


def test_bad_mesh_shape_names_the_field():
    with pytest.raises(ValueError, match="config.mesh.shape"):
        plan_memory(plan_settings(tiny_cfg()), (2, 2, 2), num_devices=4)
    out = run_cli("--config=configs/tiny_math.py", "--config.mesh.shape=3,1,1", "--num_devices=8")
    assert out.returncode == 1, out.stderr
    assert last_line(out).startswith("da3po_jax: error: ValueError: config.mesh.shape"), out.stderr


@pytest.mark.parametrize(
    "flags, match",
    [
        (
            (-100, 0.9, 0.0, 8),
            r"^--prompt_len=-100: must be >= 0 \(0 = max\(rollout.prompt_buckets",
        ),
        ((0, 7.0, 0.0, 8), r"^--usable=7.0: must be in \(0, 1\]"),
        ((0, 0.0, 0.0, 8), r"^--usable=0.0: must be in \(0, 1\]"),
        ((0, 0.9, -5.0, 8), r"^--device_gib=-5.0: must be a finite number >= 0 \(0 = the memory"),
        ((0, 0.9, float("inf"), 8), r"^--device_gib=inf: must be a finite number >= 0"),
        ((0, 0.9, 0.0, 0), r"^--num_devices=0: must be >= 1$"),
    ],
)
def test_out_of_range_flags_are_named_with_their_range(flags, match):
    from da3po_jax.plan import check_flags

    with pytest.raises(ValueError, match=match):
        check_flags(*flags)
    check_flags(0, 1.0, 0.0, 1)  # the edges of each range are accepted
    check_flags(4096, 0.5, 80.0, 8)


def test_cli_refuses_out_of_range_flags_on_the_last_line():
    """A prompt length the planner cannot shape and a usable fraction that would give a
    wrong verdict: exit status 1, the last stderr line names the flag and its range."""
    base = ["--config=configs/tiny_math.py", "--config.mesh.shape=1,1,1", "--num_devices=1"]
    out = run_cli(*base, "--prompt_len=-100")
    assert out.returncode == 1, out.stderr
    assert last_line(out) == (
        "da3po_jax: error: ValueError: --prompt_len=-100: must be >= 0 "
        "(0 = max(rollout.prompt_buckets))"
    )
    out = run_cli(*base, "--usable=7")
    assert out.returncode == 1 and "fits" not in out.stdout, out.stdout
    assert last_line(out) == (
        "da3po_jax: error: ValueError: --usable=7.0: must be in (0, 1] (a fraction of the "
        "device memory)"
    )


def test_reference_and_teacher_copies():
    cfg = tiny_cfg()
    assert plan_memory(plan_settings(cfg), num_devices=1).reference == 0
    cfg.loss.kl_coef = 0.01
    if "teacher" not in cfg:  # the section may come with OPD; plan it either way
        cfg.teacher = {"path": "", "preset": ""}
    cfg.teacher.preset = "tiny-qwen2"
    plan = plan_memory(plan_settings(cfg), num_devices=1)
    assert plan.reference == plan.params and plan.teacher == plan.params > 0


@pytest.mark.parametrize("shape", [(1, 1, 1), (4, 1, 1), (2, 2, 1)])
def test_continuous_engine_cache_is_the_slots_cache(shape):
    """With `rollout.engine = continuous` the counted KV cache is the slot cache
    `init_slots` allocates (S rows split over data x fsdp, Tp + N - 1 rounded up to the
    attention block), for rollout and eval alike, and the surplus is 4 x S / G groups."""
    from da3po_jax.models import get_preset
    from da3po_jax.plan import group_buffer_nbytes
    from da3po_jax.sampling.continuous import SlotConfig
    from da3po_jax.sampling.sampler import GenerateConfig

    cfg = tiny_cfg()
    cfg.mesh.shape = shape
    cfg.rollout.engine, cfg.rollout.slots, cfg.rollout.attention_block = "continuous", 32, 16
    plan = plan_memory(plan_settings(cfg), num_devices=shape[0] * shape[1])
    tp, tn, g = max(cfg.rollout.prompt_buckets), cfg.rollout.max_new_tokens, 8
    mc = get_preset("tiny-qwen2", vocab_size=512)
    from da3po_jax.sampling.continuous import init_slots

    slots = jax.eval_shape(
        lambda: init_slots(mc, GenerateConfig(g, tn), SlotConfig(32, tp, block=16))
    )
    cache = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(slots.cache))
    assert plan.kv_cache == cache // (shape[0] * shape[1])
    assert plan.info["rollout_slots"] == -(-(tp + tn - 1) // 16) * 16
    dev = shape[0] * shape[1]
    batch = group_buffer_nbytes(g, tp, tn, cfg.rl.train_prompts, dev)
    assert plan.batch == batch + group_buffer_nbytes(g, tp, tn, 4 * 32 // g, dev)


def test_partial_rollouts_keep_the_slots_cache_through_the_update():
    """`rollout.partial_kv = "keep"` holds the rows in flight, keys and values included,
    through the update: the train phase gains the slot cache; `"recompute"` frees it. The
    batch buffers hold each token's policy version (int32) under partial rollouts."""
    cfg = tiny_cfg()
    cfg.rollout.engine, cfg.rollout.slots, cfg.rollout.attention_block = "continuous", 32, 16
    base = plan_memory(plan_settings(cfg), num_devices=1)
    cfg.rollout.max_staleness = 1
    keep = plan_memory(plan_settings(cfg), num_devices=1)
    cfg.rollout.partial_kv = "recompute"
    recompute = plan_memory(plan_settings(cfg), num_devices=1)
    assert base.kv_cache > 0
    assert keep.info["train_phase"] == base.info["train_phase"] + base.kv_cache
    assert recompute.info["train_phase"] == base.info["train_phase"]
    g, tn = cfg.rollout.group_size, cfg.rollout.max_new_tokens
    groups = cfg.rl.train_prompts + 4 * 32 // g  # the batch and the surplus
    assert keep.batch == base.batch + groups * g * tn * 4


def test_cudnn_segment_mask_is_counted_on_gpus():
    """`model.attention = auto` resolves per device kind: cuDNN on a GPU (bf16) adds its
    [rows, 1, T, T] segment mask (bool + bf16 bias) to each layer's attention work, the
    TPU's splash kernel and an explicit blockwise choice do not."""
    cfg = tiny_cfg()
    cfg.model.dtype = "bfloat16"
    cfg.model.remat = False
    gpu, tpu = (plan_memory(plan_settings(cfg), num_devices=1, device=d) for d in ("h100", "v5p"))
    assert (gpu.info["attention"], tpu.info["attention"]) == ("cudnn", "splash")
    b, t = gpu.info["micro_rows_per_device"], gpu.info["seq_len"]
    layers = 2  # tiny-qwen2; without remat (L + 1) layers' attention work is counted
    assert gpu.activations - tpu.activations == (layers + 1) * b * t * t * (1 + 2)
    cfg.model.attention = "blockwise"
    assert (
        plan_memory(plan_settings(cfg), num_devices=1, device="h100").activations == tpu.activations
    )


def tiny_elements() -> tuple[int, int, int]:
    """tiny-qwen2's parameter elements, by hand: matrices (q/k/v/o, MLP, embed), the 2-D
    q/k/v biases ([heads, head_dim], split over tensor only) and the norms."""
    matrices = 2 * (64 * 4 * 16 + 2 * 64 * 2 * 16 + 4 * 16 * 64 + 3 * 64 * 128) + 512 * 64
    biases = 2 * (4 * 16 + 2 * 2 * 16)
    norms = 2 * 2 * 64 + 64
    return matrices, biases, norms


@pytest.mark.parametrize("shape", [(1, 4, 1), (2, 2, 1), (1, 4, 2)])
def test_decode_weights_are_the_gathered_compute_dtype_model_and_the_cast_shards(shape):
    """With `rollout.gather_weights` on more than one device a generate call holds every
    2-D weight in the compute dtype (bf16) split over `tensor` only, plus each device's
    shard of it cast to bf16 (the rules' FSDP x tensor split), and the norms in f32; off,
    or on one device, nothing."""
    cfg = tiny_cfg()
    cfg.model.dtype = "bfloat16"
    cfg.mesh.shape = shape
    devices = shape[0] * shape[1] * shape[2]
    plan = plan_memory(plan_settings(cfg), num_devices=devices)
    matrices, biases, norms = tiny_elements()
    f, t = shape[1], shape[2]  # every tiny matrix divides by these, and 2 KV heads by t
    gathered = 2 * (matrices + biases) // t + 4 * norms
    cast_shards = 2 * (matrices // (f * t) + biases // t)
    assert plan.decode_weights == gathered + cast_shards
    assert plan.info["rollout_phase"] == plan.kv_cache + plan.decode_weights + plan.rollout_work
    cfg.rollout.gather_weights = False
    assert plan_memory(plan_settings(cfg), num_devices=devices).decode_weights == 0
    cfg.rollout.gather_weights = True
    cfg.mesh.shape = (1, 1, 1)
    assert plan_memory(plan_settings(cfg), num_devices=1).decode_weights == 0


@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 4, 1), (1, 2, 2)])
def test_update_work_is_the_cast_shards_and_the_unsharded_unembedding_gradient(shape):
    """With f32 parameters and bf16 compute the update holds each device's 2-D weights
    cast to bf16; under FSDP also the f32 gradient of the (tied) unembedding, whole over
    fsdp and split over tensor; f32 compute on one device holds neither."""
    cfg = tiny_cfg()
    cfg.model.param_dtype, cfg.model.dtype = "float32", "bfloat16"
    cfg.mesh.shape = shape
    devices = shape[0] * shape[1] * shape[2]
    plan = plan_memory(plan_settings(cfg), num_devices=devices)
    matrices, biases, _ = tiny_elements()
    f, t = shape[1], shape[2]
    unembedding_grad = 512 * 64 * 4 // t if f > 1 else 0
    assert plan.update_work == 2 * (matrices // (f * t) + biases // t) + unembedding_grad
    assert plan.info["train_phase"] == plan.grads + plan.activations + plan.update_work
    if shape == (1, 1, 1):
        cfg.model.dtype = "float32"
        assert plan_memory(plan_settings(cfg), num_devices=1).update_work == 0
