"""`reward.verifier = "math_verify"`: configuration, the missing-package error, scoring through
the worker pool, and the agreement of the built-in verifier with Math-Verify on the labelled
cases of `recall_cases.py` and `format_cases.py` (skipped where Math-Verify is not
installed)."""

from __future__ import annotations

import importlib.util

import pytest
from format_cases import CASES as FORMAT_CASES
from format_cases import MATH_VERIFY_DISAGREEMENTS
from recall_cases import CASES
from recall_cases import MATH_VERIFY_DISAGREEMENTS as RECALL_DISAGREEMENTS

from da3po_jax.rewards import RewardScorer, math_verify_backend
from da3po_jax.rewards.normalize import squash_whitespace

# Labelled cases on which Math-Verify 0.9.0 itself contradicts the label (29 of 224, each in
# `recall_cases.MATH_VERIFY_DISAGREEMENTS` with the reason), so they are left out of the
# "built-in never accepts what Math-Verify rejects" check:
# * it accepts answers the project scores wrong: `\{1, 2\}` for `(1, 2)` (set vs tuple),
#   `28\%` for `0.28` and `50\%` for `0.5` (a percentage is not the fraction), `1,22` for
#   `(1, 22)`, `\sqrt{2}` for `1.41421356` (a decimal is not the exact irrational);
# * it rejects right answers: inequalities against their intervals (`x > 3` for
#   `(3, \infty)`, `-1 \leq x < 2` for `[-1, 2)`, `x<1 or x>3` for the union; 8 cases),
#   decimal commas (`1,22` for `1.22`; 4), rounded decimals (`0.3333` for `\frac{1}{3}`,
#   `(0.6,2.6667]` for `(\frac{3}{5},\frac{8}{3}]`; 9), `12.5\text{ percent}` for `12.5\%`,
#   `x = 5` for `2x = 10`, `e^{i\pi}` for `-1`. (`Answer: The answer is Monday.` against
#   `Monday` agrees since the scorer reads the statement after `The answer is` for both.)
# The built-in verifier agrees with the label on all of them, which is why the agreement on
# these cases is below 90%: every disagreement is one where Math-Verify is wrong.
MIN_AGREEMENT = 0.85


def test_unknown_verifier_is_rejected():
    with pytest.raises(ValueError, match="verifier must be one of"):
        RewardScorer(verifier="sympy")


def test_missing_package_names_the_field_and_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "math_verify" else real(name)
    )
    with pytest.raises(ImportError) as info:
        RewardScorer(verifier="math_verify")
    assert "reward.verifier=math_verify" in str(info.value)
    assert "pip install" in str(info.value) and "math-verify" in str(info.value)
    RewardScorer(verifier="builtin").close()  # the built-in verifier does not need it


def _score_both(scorer):
    """The recall cases, then the format cases, as two batches of one (warm) scorer."""
    return [
        scorer.score_batch([c[1] for c in cases], [c[2] for c in cases])
        for cases in (CASES, FORMAT_CASES)
    ]


@pytest.fixture(scope="module")
def all_batches():
    pytest.importorskip("math_verify")
    with RewardScorer(num_workers=2, timeout_s=30.0) as scorer:
        builtin = _score_both(scorer)
    with RewardScorer(num_workers=2, timeout_s=30.0, verifier="math_verify") as scorer:
        assert scorer.verify_fn is math_verify_backend.math_verify_equivalent
        mv = _score_both(scorer)
        restarts = scorer._pool.restarts
    return builtin, mv, restarts


@pytest.fixture(scope="module")
def batches(all_batches):
    builtin, mv, restarts = all_batches
    return builtin[0], mv[0], restarts


@pytest.fixture(scope="module")
def format_batches(all_batches):
    builtin, mv, _ = all_batches
    return builtin[1], mv[1]


def test_math_verify_scores_through_the_worker_pool(batches):
    _, mv, restarts = batches
    answered = {(r.extracted, c[2]) for r, c in zip(mv.results, CASES) if r.extracted}
    exact = {(a, ref) for a, ref in answered if squash_whitespace(a) == squash_whitespace(ref)}
    assert exact and mv.stats["symbolic"] == len(answered - exact)  # the rest went to a worker
    assert mv.stats["timeout"] == 0 and mv.stats["error"] == 0 and restarts == 0
    verdicts = {(c[1], c[2]): r.correct for c, r in zip(CASES, mv.results)}
    assert verdicts[(r"\boxed{\frac{1}{2}}", "0.5")] is True
    assert verdicts[(r"\boxed{3}", "4")] is False
    assert verdicts[(r"\boxed{y=-\frac{1}{2}x+\frac{3}{4}}", "2x+4y-3=0")] is True
    assert verdicts[(r"The roots are $\boxed{1}$ and $\boxed{2}$.", "1, 2")] is True


def test_builtin_agrees_with_math_verify(batches):
    builtin, mv, _ = batches
    pairs = list(zip(CASES, builtin.correct, mv.correct))
    agreement = sum(b == m for _, b, m in pairs) / len(pairs)
    print(f"built-in vs Math-Verify agreement: {agreement:.1%} on {len(pairs)} labelled cases")
    assert agreement >= MIN_AGREEMENT
    mv_right = [(case, b, m) for case, b, m in pairs if m == case[3]]
    lenient = [case for case, b, m in mv_right if b and not m]
    assert not lenient, f"built-in accepts what Math-Verify rightly rejects: {lenient}"
    # Every disagreement is a case where Math-Verify contradicts the label, and is listed.
    assert all(b == case[3] for case, b, m in pairs if b != m)
    disagree = {(case[1], case[2]) for case, b, m in pairs if b != m}
    assert disagree == set(RECALL_DISAGREEMENTS)


def test_every_disagreement_on_the_format_cases_is_labelled(format_batches):
    builtin, mv = format_batches
    disagree = {}
    for case, b, m in zip(FORMAT_CASES, builtin.correct, mv.correct):
        if b != m:
            disagree[(case[1], case[2])] = (case[3], b)
    print(f"format cases: {len(disagree)} disagreements in {len(FORMAT_CASES)}")
    assert set(disagree) == set(MATH_VERIFY_DISAGREEMENTS)
    for key, (label, b) in disagree.items():
        right = MATH_VERIFY_DISAGREEMENTS[key].split(":")[0]
        assert (b == label) is (right == "builtin"), key
    assert mv.stats["timeout"] == 0 and mv.stats["error"] == 0
