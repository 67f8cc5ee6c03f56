"""`resolve_settings` rejects every bad field value up front, naming the field, the value and
the rule (instead of a `range()` / `KeyError` / NaN deep inside training)."""

from __future__ import annotations

import importlib.util
import os
import re

import pytest
from ml_collections import config_flags  # noqa: F401  (config files import ml_collections)

from da3po_jax.config import resolve_settings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(**overrides):
    """configs/tiny_math.py (valid as written) with dotted-key overrides."""
    spec = importlib.util.spec_from_file_location(
        "tiny_math", os.path.join(ROOT, "configs", "tiny_math.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config()
    for key, value in overrides.items():
        node = c
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c


# (overrides, words the message must contain); the first key is the field named.
BAD = [
    # added checks
    ({"eval.prompts_per_call": 0}, "config.eval.prompts_per_call=0 must be >= 1"),
    ({"eval.prompts_per_call": -1}, "config.eval.prompts_per_call=-1 must be >= 1"),
    ({"seed": -1}, "config.seed=-1 must be >= 0"),
    (
        {"reward.verifier": "sympy"},
        "config.reward.verifier='sympy' must be one of ['builtin', 'math_verify']",
    ),
    (
        {"reward.fallback": "last_number"},
        "config.reward.fallback='last_number' must be one of ['last_expression', 'none']",
    ),
    ({"tokenizer.vocab_size": -5}, "config.tokenizer.vocab_size=-5 must be > 0"),
    ({"data.answer_mode": "latex"}, "config.data.answer_mode='latex' must be one of"),
    ({"data.synthetic_train": -1}, "config.data.synthetic_train=-1 must be >= 0"),
    ({"data.synthetic_eval": -1}, "config.data.synthetic_eval=-1 must be >= 0"),
    ({"data.synthetic_sft": -1}, "config.data.synthetic_sft=-1 must be >= 0"),
    ({"data.synthetic_train": 0}, "config.data.synthetic_train=0 must be >= 1 for stage='rl'"),
    (
        {"data.synthetic_sft": 0, "stage": "sft"},
        "config.data.synthetic_sft=0 must be >= 1 for stage='sft'",
    ),
    (
        {"data.template": "fancy"},
        "config.data.template='fancy' must be one of ['boxed', 'dapo', 'raw', 'tiny'] or a "
        "string containing '{problem}'",
    ),
    ({"rollout.prompt_buckets": ()}, "config.rollout.prompt_buckets=() must be a non-empty"),
    ({"rollout.prompt_buckets": (0, 64)}, "config.rollout.prompt_buckets=(0, 64) must be"),
    ({"adv.eps": -1e-3}, "config.adv.eps=-0.001 must be >= 0"),
    ({"daa.tau": 0.0}, "config.daa.tau=0.0 must be in (0, 1]"),
    ({"daa.tau": 1.5}, "config.daa.tau=1.5 must be in (0, 1]"),
    ({"daa.beta": 0.0}, "config.daa.beta=0.0 must be > 0"),
    ({"daa.gamma": -1.0}, "config.daa.gamma=-1.0 must be > 0"),
    ({"overlong.penalty": -1.0}, "config.overlong.penalty=-1.0 must be >= 0"),
    ({"teacher.sft_steps": -1}, "config.teacher.sft_steps=-1 must be >= 0"),
    ({"teacher.sft_stop_acc": 1.5}, "config.teacher.sft_stop_acc=1.5 must be in [0, 1]"),
    (
        {"teacher.preset": "tiny-gpt", "algo": "opd"},
        "config.teacher.preset='tiny-gpt' must be one of",
    ),
    ({"model.preset": "tiny-gpt"}, "config.model.preset='tiny-gpt' must be one of"),
    # da3po: incorrect = -1 (DAPO's reward)
    ({"reward.correct": -1.0}, "config.reward.correct=-1.0 must be > config.reward.incorrect=-1.0"),
    ({"optim.weight_decay": -0.1}, "config.optim.weight_decay=-0.1 must be >= 0"),
    ({"optim.b1": 1.0}, "config.optim.b1=1.0 must be in [0, 1)"),
    ({"optim.b2": 1.0}, "config.optim.b2=1.0 must be in [0, 1)"),
    ({"train.keep_checkpoints": 0}, "config.train.keep_checkpoints=0 must be >= 1"),
    ({"train.max_nonfinite_steps": -1}, "config.train.max_nonfinite_steps=-1 must be >= 0"),
    ({"optim.lr": float("inf")}, "config.optim.lr=inf must be > 0 (and finite)"),
    ({"eval.temperature": -0.5}, "config.eval.temperature=-0.5 must be >= 0"),
    ({"eval.top_p": 0.0}, "config.eval.top_p=0.0 must be in (0, 1]"),
    ({"eval.top_p": 1.5}, "config.eval.top_p=1.5 must be in (0, 1]"),
    ({"eval.max_new_tokens": -1}, "config.eval.max_new_tokens=-1 must be >= 0"),
    ({"sft.lr": 0.0}, "config.sft.lr=0.0 must be > 0"),
    ({"sft.warmup_steps": -1}, "config.sft.warmup_steps=-1 must be >= 0"),
    ({"sft.stop_acc": 1.5}, "config.sft.stop_acc=1.5 must be in [0, 1]"),
    ({"sft.check_every": -1}, "config.sft.check_every=-1 must be >= 0"),
    ({"sft.check_prompts": 0}, "config.sft.check_prompts=0 must be >= 1"),
    ({"mesh.shape": (-1, -1, 1)}, "config.mesh.shape=(-1, -1, 1) must have positive entries"),
    ({"mesh.shape": (0, 1, 1)}, "config.mesh.shape=(0, 1, 1) must have positive entries"),
    # checks that existed before
    ({"rollout.group_size": 1}, "config.rollout.group_size=1 must be >= 2"),
    (
        {"rollout.engine": "vllm"},
        "config.rollout.engine='vllm' must be one of ['static', 'continuous']",
    ),
    ({"rollout.slots": 0}, "config.rollout.slots=0 must be > 0"),
    ({"rollout.steps_per_call": 0}, "config.rollout.steps_per_call=0 must be > 0"),
    ({"ds.max_prompts": 0}, "config.ds.max_prompts=0 must be > 0"),
    (
        {"ds.max_prompts": 8, "rl.train_prompts": 16},
        "config.ds.max_prompts=8 must be >= config.rl.train_prompts=16",
    ),
    (
        {"rollout.engine": "continuous", "rollout.slots": 4},
        "config.rollout.slots=4 must be >= 8 (one group",
    ),
    ({"adv.estimator": "ppo"}, "config.adv.estimator='ppo' must be one of ['grpo', 'rloo']"),
    (
        {"daa.estimator": "none"},
        "config.daa.estimator='none' must be one of ['constant', 'power', 'bayes', 'history']",
    ),
    ({"rollout.top_p": 0.0}, "config.rollout.top_p=0.0 must be in (0, 1]"),
    ({"eval.num_samples": 0}, "config.eval.num_samples=0 must be > 0"),
    ({"eval.max_prompts": -1}, "config.eval.max_prompts=-1 must be >= 0"),
    ({"train.eval_every": -1}, "config.train.eval_every=-1 must be >= 0"),
    ({"reward.timeout_s": 0.0}, "config.reward.timeout_s=0.0 must be > 0"),
    ({"reward.num_workers": -1}, "config.reward.num_workers=-1 must be >= 0"),
    ({"loss.eps_low": 1.0}, "config.loss.eps_low=1.0 must be in [0, 1)"),
    ({"rl.mini_batch_prompts": 3}, "config.rl.mini_batch_prompts=3 must divide"),
    ({"mesh.shape": (1, 1)}, "config.mesh.shape=(1, 1) must have 3 entries"),
]


@pytest.mark.parametrize(
    "overrides, words", BAD, ids=[f"{next(iter(o))}={list(o.values())[0]!r}" for o, _ in BAD]
)
def test_bad_value_is_rejected_naming_the_field(overrides, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        resolve_settings(_config(**overrides))


def test_the_base_recipe_is_valid():
    resolve_settings(_config())


@pytest.mark.parametrize("tau", [1.0, 0.999, 1e-3])
def test_daa_tau_may_be_one(tau):
    """docs/algorithms.md's hardness rule 0 < mu < tau and `power`'s odds(min(tau, 1-1e-6))
    are defined for tau = 1 (every mixed group is hard); `DAAConfig` accepts it too."""
    cfg = resolve_settings(_config(**{"daa.tau": tau}))
    assert cfg.daa_on.tau == tau


@pytest.mark.parametrize(
    "overrides",
    [
        {"eval.prompts_per_call": 1},
        {"eval.max_prompts": 0},  # 0 = every held-out prompt
        {"eval.max_new_tokens": 0},  # 0 = rollout.max_new_tokens
        {"eval.temperature": 0.0},  # greedy
        {"sft.check_every": 0},
        {"train.eval_every": 0, "train.checkpoint_every": 0},
        {"data.synthetic_eval": 0, "data.synthetic_sft": 0},
        {"data.template": "Solve: {problem}"},
        {"model.preset": "TINY-QWEN2"},  # preset names are case-insensitive
        {"optim.b1": 0.0, "optim.weight_decay": 0.0, "overlong.penalty": 0.0},
        {"reward.correct": 1.0, "reward.incorrect": -1.0},
        {"mesh.shape": (1, -1, 1)},
        {"reward.verifier": "math_verify"},
        {"reward.fallback": "none"},
    ],
)
def test_edge_values_that_mean_something_are_accepted(overrides):
    resolve_settings(_config(**overrides))


def test_a_saved_run_from_before_a_field_existed_still_resolves():
    """A run's config.json written before `model.decode_attention` and
    `rollout.gather_weights` existed gets the values that reproduce it; a fresh config
    without such a field is still refused."""
    from da3po_jax.config import with_added_fields

    raw = _config().to_dict()
    del raw["model"]["decode_attention"]
    del raw["rollout"]["gather_weights"]
    with pytest.raises(ValueError, match="config.model.decode_attention is unset"):
        resolve_settings(raw)
    s = resolve_settings(with_added_fields(raw))
    assert s.model.decode_attention == "auto" and s.rollout.gather_weights is True
    del raw["reward"]["fallback"]  # runs before it found no answer without a marker
    assert resolve_settings(with_added_fields(raw)).reward.fallback == "none"
    assert resolve_settings(_config()).reward.fallback == "last_expression"
