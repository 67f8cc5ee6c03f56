"""The DA3PO paper's recipes (`configs/da3po_qwen3_{4b,8b}.py`): every variant, the paper's
unsized setup and each hardware's, resolves to DA3PO with G = 16 on DAPO-Math-17K, the
seven benchmark suites and their k, fits the model's 32768 positions, and, sized, fits
its hardware by the planner; the hardware argument passes through the command line."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from da3po_jax.config import resolve_settings
from da3po_jax.models import get_preset
from da3po_jax.plan import plan_memory, plan_settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = ("4b", "8b")
# hardware name -> (the planner's device, its devices)
HARDWARE = {"v5p-8": ("v5p", 4), "v6e-8": ("v6e", 8), "8xh100": ("h100", 8)}
SUITES = {
    "aime2024": 32,
    "aime2025": 32,
    "aime2026": 32,
    "amc23": 32,
    "minerva": 4,
    "olympiadbench": 4,
    "math500": 4,
}


def recipe(size: str):
    path = os.path.join(ROOT, "configs", f"da3po_qwen3_{size}.py")
    spec = importlib.util.spec_from_file_location(f"_da3po_recipe_{size}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("hardware", ["", *HARDWARE])
@pytest.mark.parametrize("size", SIZES)
def test_every_variant_is_the_papers_setup(size, hardware):
    settings = resolve_settings(recipe(size).get_config(hardware), inputs=False)
    assert settings.algo == "da3po" and settings.model.preset == f"qwen3-{size}"
    assert settings.rollout.group_size == 16
    # DAPO's recipe, through the da3po preset, and DAA's constant lambda = 2
    assert (settings.loss.eps_low, settings.loss.eps_high, settings.loss.agg) == (
        0.2,
        0.28,
        "token-mean",
    )
    assert settings.ds.enable and (settings.reward.correct, settings.reward.incorrect) == (1, -1)
    assert settings.overlong.buffer == settings.rollout.max_new_tokens // 5
    assert settings.daa_on is not None
    assert (settings.daa.estimator, settings.daa.factor) == ("constant", 2.0)
    optim = settings.optim
    assert (optim.lr, optim.warmup_steps, optim.schedule) == (1e-6, 10, "constant")
    assert (optim.weight_decay, optim.grad_clip) == (0.1, 1.0)
    assert settings.rl.mini_batch_prompts == 32
    assert (settings.model.param_dtype, settings.model.dtype) == ("float32", "bfloat16")
    # DAPO-Math-17K's rows, read as its benchmark format reads them
    data = settings.data
    assert (data.source, data.template, data.dedupe) == ("parquet", "raw", True)
    assert (data.prompt_field, data.answer_field) == ("prompt", "reward_model.ground_truth")
    assert data.eval_path == ""
    # the seven benchmarks, k = 32 on AIME and AMC, 4 on the rest
    assert {s.name: s.k for s in settings.eval_suites} == SUITES
    assert settings.eval_sample_counts == (4, 32)
    assert (settings.eval.temperature, settings.eval.top_p) == (1.0, 0.7)
    assert settings.rollout.slots >= 32  # the largest k's group
    # prompt bucket + response cap within Qwen3-Base's positions
    assert get_preset(f"qwen3-{size}").max_position_embeddings == 32768
    assert max(settings.rollout.prompt_buckets) + settings.eval_max_new_tokens <= 32768
    if not hardware:
        assert settings.rl.train_prompts == 512 and settings.rollout.max_new_tokens == 20480


@pytest.mark.parametrize("hardware", list(HARDWARE))
@pytest.mark.parametrize("size", SIZES)
def test_sized_variants_fit_their_hardware(size, hardware):
    device, devices = HARDWARE[hardware]
    settings = plan_settings(recipe(size).get_config(hardware))
    plan = plan_memory(settings, num_devices=devices, device=device)
    assert plan.fits, plan.table()
    assert plan.info["mesh"][0] * plan.info["mesh"][1] * plan.info["mesh"][2] == devices


@pytest.mark.parametrize("size", SIZES)
def test_an_unknown_hardware_is_refused_naming_the_known_ones(size):
    with pytest.raises(ValueError, match="unknown hardware 'v5e-8'.*v5p-8, v6e-8, 8xh100"):
        recipe(size).get_config("v5e-8")


@pytest.mark.parametrize(
    "overrides",
    [
        {"algo": "dapo"},
        {"algo": "grpo"},
        {
            "algo": "dapo",
            "loss.ratio_level": "sequence",
            "loss.eps_low": 3e-4,
            "loss.eps_high": 4e-4,
        },
    ],
    ids=["dapo", "grpo", "gspo"],
)
def test_the_baselines_resolve(overrides):
    config = recipe("8b").get_config("v5p-8")
    for key, value in overrides.items():
        section, _, field = key.rpartition(".")
        setattr(config[section] if section else config, field, value)
    settings = resolve_settings(config, inputs=False)
    assert settings.daa_on is None and settings.rollout.group_size == 16
    assert settings.ds.enable == (settings.algo == "dapo")


def test_the_presets_are_the_base_models_config_json():
    """Qwen3-4B-Base and Qwen3-8B-Base's config.json: hidden, layers, heads, KV heads,
    tied embeddings, 32768 positions, rope_theta 1e6."""
    expected = {
        "qwen3-4b": (2560, 9728, 36, 32, 8, True),
        "qwen3-8b": (4096, 12288, 36, 32, 8, False),
    }
    for name, (hidden, inter, layers, heads, kv, tied) in expected.items():
        m = get_preset(name)
        got = (m.hidden_size, m.intermediate_size, m.num_layers, m.num_heads, m.num_kv_heads)
        assert got == (hidden, inter, layers, heads, kv), name
        assert (m.tie_word_embeddings, m.max_position_embeddings, m.rope_theta) == (
            tied,
            32768,
            1e6,
        )
        assert (m.head_dim, m.vocab_size, m.qk_norm) == (128, 151936, True)


def test_the_planner_command_passes_the_hardware_through():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "da3po_jax.plan",
            "--config=configs/da3po_qwen3_8b.py:v6e-8",
            "--device=v6e",
            "--num_devices=8",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["fits"] and plan["info"]["mesh"] == [1, 1, 8]
