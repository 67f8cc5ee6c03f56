"""The verifiers registry (`rewards/verifiers.py: VERIFIERS`): the shipped names, a new
verifier as one factory + registration that the scorer runs in its workers and the
settings accept, and the errors for an unknown or repeated name."""

from __future__ import annotations

import pytest

from da3po_jax.config import default_config, resolve_settings
from da3po_jax.rewards import RewardScorer, Verifier, register_verifier, unregister_verifier
from da3po_jax.rewards.verifiers import VERIFIERS, verifier_names


def same_text(answer: str, reference: str) -> bool:
    """A verifier that accepts only the reference's exact text (module level: picklable)."""
    return answer == reference


@pytest.fixture
def same_text_verifier():
    register_verifier("same_text", lambda: Verifier(same_text, exact_first=False, warm_up=False))
    try:
        yield "same_text"
    finally:
        unregister_verifier("same_text")


def test_the_shipped_verifiers_are_registered():
    assert verifier_names() == ("builtin", "math_verify")
    assert VERIFIERS["builtin"]() == Verifier(None)


def test_a_registered_verifier_scores_in_the_workers(same_text_verifier):
    responses = ["so \\boxed{1/2}", "so \\boxed{0.5}", "so \\boxed{2}"]
    with RewardScorer(num_workers=1, timeout_s=20.0, verifier=same_text_verifier) as scorer:
        result = scorer.score_batch(responses, ["1/2", "1/2", "2"])
    # the builtin verifier accepts 0.5 for 1/2; this one decides alone, on the text
    assert result.correct == [True, False, True]
    with RewardScorer(num_workers=1, timeout_s=20.0) as scorer:
        assert scorer.score_batch(responses[1:2], ["1/2"]).correct == [True]


def test_the_settings_accept_a_registered_verifier_and_name_the_choices(same_text_verifier):
    config = default_config()
    config.reward.verifier = "same_text"
    assert resolve_settings(config, inputs=False).reward.verifier == "same_text"
    config.reward.verifier = "sympy"
    with pytest.raises(ValueError, match=r"reward.verifier='sympy' must be one of .*'same_text'"):
        resolve_settings(config, inputs=False)


def test_unknown_and_repeated_names_are_refused(same_text_verifier):
    names = r"\('builtin', 'math_verify', 'same_text'\)"
    with pytest.raises(ValueError, match=f"verifier must be one of {names}"):
        RewardScorer(num_workers=1, verifier="sympy")
    with pytest.raises(ValueError, match="already registered"):
        register_verifier("same_text", lambda: Verifier(same_text))
    with pytest.raises(ValueError, match="unknown verifier 'nope'"):
        unregister_verifier("nope")
