"""DAPO's reward, the trained policy's temperature and the context check (docs/algorithms.md:
"Rewards", "Temperature"; docs/design.md: the start's checks).

- `reward.correct` / `reward.incorrect` are algorithm presets: +1 / -1 for dapo and da3po
  (DAPO's rule-based reward), 1 / 0 for grpo and the distillation algorithms; soft
  overlong punishment is added on top of either.
- `loss.train_temperature` (0 = the rollout's sampling temperature) resolves to
  `loss.temperature`; truncated importance sampling is on only where the sampling
  distribution is not that policy.
- A prompt bucket + response cap above the policy's `max_position_embeddings` is refused
  before any weight is read, unless the context is extended explicitly
  (`model.max_position_embeddings`, `model.rope_theta`), which the policy alone gets.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from da3po_jax.config import resolve_settings
from da3po_jax.data import MathProblem
from da3po_jax.models.tokenizer import Tokenizer, build_bpe_tokenizer
from da3po_jax.rl import OverlongConfig, apply_overlong
from da3po_jax.rollout import PromptEncoder
from da3po_jax.run.inputs import Datasets, policy_config
from da3po_jax.run.validate import check_policy_context

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_config_validation import _config  # noqa: E402  (configs/tiny_math.py + overrides)


# ------------------------------------------------------------------------------ rewards
@pytest.mark.parametrize(
    "algo, correct, incorrect",
    [("grpo", 1.0, 0.0), ("dapo", 1.0, -1.0), ("da3po", 1.0, -1.0), ("opd", 1.0, 0.0)],
)
def test_the_reward_is_the_algorithms(algo, correct, incorrect):
    extra = {"teacher.preset": "tiny-qwen2"} if algo == "opd" else {}
    settings = resolve_settings(_config(algo=algo, **extra), inputs=False)
    assert (settings.reward.correct, settings.reward.incorrect) == (correct, incorrect)


def test_an_explicit_reward_wins_over_the_preset():
    settings = resolve_settings(_config(**{"reward.incorrect": 0.0}), inputs=False)
    assert (settings.reward.correct, settings.reward.incorrect) == (1.0, 0.0)


def test_overlong_punishment_is_added_on_top_of_the_plus_minus_one_reward():
    """DAPO: R = +1 / -1, plus R_len = -(L - (L_max - buffer)) / buffer in the buffer.
    L_max = 20, buffer = 4: lengths 10, 18, 20 get 0, -0.5, -1."""
    rewards = np.array([1.0, 1.0, -1.0, -1.0])
    lengths = np.array([10, 18, 18, 20])
    config = OverlongConfig(buffer=4, penalty=1.0, max_len=20)
    shaped, _ = apply_overlong(rewards, lengths, np.zeros(4, bool), np.ones((4, 1)), config)
    np.testing.assert_allclose(shaped, [1.0, 0.5, -1.5, -2.0])


# -------------------------------------------------------------------------- temperature
@pytest.mark.parametrize(
    "rollout, train_temperature, temperature, tis",
    [
        ({"rollout.temperature": 0.7}, 0.0, 0.7, False),  # default: the sampled policy
        ({"rollout.temperature": 0.7}, 1.0, 1.0, True),  # untempered: TIS corrects
        ({"rollout.temperature": 1.0}, 0.0, 1.0, False),
        ({"rollout.temperature": 0.7, "rollout.top_p": 0.9}, 0.0, 0.7, True),  # truncated
        ({"rollout.temperature": 0.0}, 0.0, 1.0, True),  # greedy: the untempered policy
    ],
)
def test_the_trained_temperature_and_when_importance_sampling_is_on(
    rollout, train_temperature, temperature, tis
):
    config = _config(**rollout, **{"loss.train_temperature": train_temperature})
    settings = resolve_settings(config, inputs=False)
    assert settings.loss.temperature == temperature
    assert settings.loss.tis_cap == (settings.rollout.tis_cap if tis else 0.0)


def test_the_default_trains_the_sampling_temperature():
    settings = resolve_settings(_config(**{"rollout.temperature": 0.6}), inputs=False)
    assert settings.loss.train_temperature == 0.0 and settings.loss.temperature == 0.6


# ------------------------------------------------------------------------------ context
@pytest.fixture(scope="module")
def encoder_and_data(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("tok"))
    tokenizer = Tokenizer.load(build_bpe_tokenizer(folder, ["what is 1+1?"] * 8, vocab_size=265))
    problems = [MathProblem(id=str(i), prompt="1+1? " * (i + 1), answer="2") for i in range(3)]
    encoder = PromptEncoder(tokenizer, lambda p: p.prompt, (16, 64, 128))
    return tokenizer, encoder, Datasets(problems, problems[:1], [])


def test_a_response_cap_past_the_context_is_refused_naming_it(encoder_and_data):
    tokenizer, encoder, data = encoder_and_data
    bucket = encoder.bucket(data.train)
    settings = resolve_settings(_config(**{"rollout.max_new_tokens": 1025 - bucket}))
    with pytest.raises(ValueError) as e:
        check_policy_context(settings, tokenizer, data, encoder)
    assert str(e.value).startswith(
        f"config.rollout.max_new_tokens={1025 - bucket} after the {bucket}-token prompt "
        "bucket of the training prompts needs 1025 positions, more than the model's "
        "max_position_embeddings=1024 (preset 'tiny-qwen2')"
    )
    assert "config.model.max_position_embeddings" in str(e.value)
    settings = resolve_settings(_config(**{"rollout.max_new_tokens": 1024 - bucket}))
    check_policy_context(settings, tokenizer, data, encoder)  # exactly fits


def test_the_eval_cap_is_checked_with_the_held_out_prompts(encoder_and_data):
    tokenizer, encoder, data = encoder_and_data
    settings = resolve_settings(_config(**{"eval.max_new_tokens": 1020}))
    with pytest.raises(ValueError, match=r"config.eval.max_new_tokens=1020 after the 16-token"):
        check_policy_context(settings, tokenizer, data, encoder)


def test_an_explicit_extension_is_the_policys_alone(encoder_and_data):
    tokenizer, encoder, data = encoder_and_data
    extended = {
        "rollout.max_new_tokens": 2000,
        "model.max_position_embeddings": 4096,
        "model.rope_theta": 40000.0,
    }
    settings = resolve_settings(_config(**extended))
    check_policy_context(settings, tokenizer, data, encoder)
    policy = policy_config(settings.model, tokenizer)
    assert (policy.max_position_embeddings, policy.rope_theta) == (4096, 40000.0)
    teacher = policy_config(settings.model, tokenizer, teacher=True)
    plain = policy_config(resolve_settings(_config()).model, tokenizer)
    assert (teacher.max_position_embeddings, teacher.rope_theta) == (
        plain.max_position_embeddings,
        plain.rope_theta,
    )
    assert plain.max_position_embeddings == 1024
