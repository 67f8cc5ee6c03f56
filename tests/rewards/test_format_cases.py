"""The answer formats of real outputs (`format_cases.CASES`), end to end through `RewardScorer`.

Families: answers without a box (Minerva's `Final Answer:` line, `the answer is \\[ 9 \\]`,
display math at the end, the last expression), thousands separators against tuples and
lists, relations and intervals, exact agreement past the size caps, and references that are
worked solutions. Every case is scored in one batch; each family has near-misses that must
stay wrong, and no pair labelled wrong may score correct.
"""

from __future__ import annotations

import collections

import pytest
from format_cases import CASES, FAMILIES

from da3po_jax.rewards import RewardScorer, extract_answer
from da3po_jax.rewards.scorer import MAX_ANSWER_CHARS

IDS = [f"{i}-{family}" for i, (family, *_rest) in enumerate(CASES)]


@pytest.fixture(scope="module")
def scored():
    with RewardScorer(num_workers=2, timeout_s=20.0) as scorer:
        return scorer.score_batch([c[1] for c in CASES], [c[2] for c in CASES])


def test_the_cases_cover_every_family_both_ways():
    assert len(CASES) >= 150
    verdicts = collections.defaultdict(set)
    for family, _, _, correct in CASES:
        verdicts[family].add(correct)
    assert set(verdicts) == set(FAMILIES)
    assert all(v == {True, False} for v in verdicts.values()), dict(verdicts)


@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
def test_case_scores_as_labelled(scored, index):
    family, response, reference, correct = CASES[index]
    result = scored.results[index]
    assert result.correct is correct, (family, response[:200], reference[:200], result)


def test_no_false_positive_and_no_timeout(scored):
    false_positives = [c for c, r in zip(CASES, scored.results) if r.correct and not c[3]]
    assert not false_positives
    assert scored.stats["timeout"] == 0 and scored.stats["error"] == 0


def test_an_answer_past_the_cap_counts_only_when_it_is_the_reference(scored):
    long_cases = [(c, r) for c, r in zip(CASES, scored.results) if c[0] == "exact_long"]
    for (_, _, _, correct), result in long_cases:
        if correct:
            assert result.status == "ok" and len(result.extracted) > MAX_ANSWER_CHARS
        else:
            assert result.status == "no_answer" or len(result.extracted) <= MAX_ANSWER_CHARS


def test_without_the_fallback_a_response_needs_a_marker():
    unmarked = "The sum is therefore\n\\[\n\\frac{7}{2}\n\\]"
    assert extract_answer(unmarked, fallback="none") is None
    with RewardScorer(num_workers=1, fallback="none") as scorer:
        batch = scorer.score_batch(
            [unmarked, "Final Answer: The final answer is $3.5$. I hope it is correct."],
            ["3.5", "7/2"],
        )
        assert scorer._pool.workers == []  # decided in the parent
    assert [r.status for r in batch.results] == ["no_answer", "ok"]
    assert batch.correct == [False, True]
    with pytest.raises(ValueError, match="fallback must be one of"):
        RewardScorer(fallback="last_number")
