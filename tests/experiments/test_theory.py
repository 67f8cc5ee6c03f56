"""Exact amplification analysis (`experiments/theory.py`) against hand values and Monte-Carlo."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `experiments` is a top-level folder, not an installed package
    sys.path.insert(0, str(ROOT))

from experiments import theory  # noqa: E402

SQRT2 = math.sqrt(2.0)


def _rows(group_size: int, ps) -> dict[tuple[float, str], theory.Row]:
    """`analyse` output keyed by (p, method)."""
    return {(r.p, r.method): r for r in theory.analyse(group_size, ps)}


def test_g2_p05_by_hand():
    """G = 2, p = 0.5: only k = 1 is kept (prob 1/2); advantages are +-1 (ddof 0)."""
    rows = _rows(2, [0.5])
    pop, sample, ideal, power = (
        rows[(0.5, m)] for m in ("grpo-pop", "grpo-sample", "ideal", "power")
    )
    assert pop.p_keep == pytest.approx(0.5)
    assert pop.e_k_keep == pytest.approx(1.0)
    # population std of (1, 0) is 1/2: A = +-1
    assert (pop.total_correct, pop.total_incorrect) == pytest.approx((1.0, 1.0), rel=1e-6)
    assert (pop.per_correct, pop.per_incorrect) == pytest.approx((1.0, 1.0), rel=1e-6)
    # sample std is sqrt(1/2): A = +-1/sqrt(2)
    assert (sample.total_correct, sample.total_incorrect) == pytest.approx(
        (1 / SQRT2, 1 / SQRT2), rel=1e-6
    )
    # ideal |R - p| = 1/2 for both
    assert (ideal.total_correct, ideal.total_incorrect) == pytest.approx((0.5, 0.5))
    # mu = 1/2 is not below tau = 1/2: no amplification
    assert power.p_hard_given_keep == 0.0
    assert power.ratio_total == pytest.approx(1.0, rel=1e-6)


def test_g3_p02_by_hand():
    """G = 3, p = 0.2: P(keep) = 0.48, P(k=1 | keep) = 0.8, P(k=2 | keep) = 0.2."""
    rows = _rows(3, [0.2])
    pop = rows[(0.2, "grpo-pop")]
    assert pop.p_keep == pytest.approx(1 - 0.2**3 - 0.8**3)
    assert pop.e_k_keep == pytest.approx(0.8 * 1 + 0.2 * 2)
    # k = 1: std = sqrt(2/9), A_correct = (2/3) / std = sqrt(2), A_incorrect = -1/sqrt(2) (x2);
    # k = 2 mirrors it. Both totals are sqrt(2) for every k.
    assert pop.total_correct == pytest.approx(SQRT2, rel=1e-6)
    assert pop.total_incorrect == pytest.approx(SQRT2, rel=1e-6)
    assert pop.per_correct == pytest.approx(SQRT2 / 1.2, rel=1e-6)
    assert pop.per_incorrect == pytest.approx(SQRT2 / 1.8, rel=1e-6)
    # power: k = 1 (mu = 1/3 < tau) gets lambda = sqrt(odds(1/2) / odds(1/3)) = sqrt(2);
    # k = 2 is not hard. ratio = (0.8 * 2 + 0.2 * sqrt 2) / sqrt 2 (std scale cancels).
    power = rows[(0.2, "power")]
    assert power.ratio_total == pytest.approx(0.8 * SQRT2 + 0.2, rel=1e-6)
    assert power.mean_lambda_hard == pytest.approx(SQRT2, rel=1e-6)
    assert power.p_hard_given_keep == pytest.approx(0.8)
    # ideal on kept groups: E[k|keep](1-p) / (E[G-k|keep] p) = (1 - p^2) / (1 - (1-p)^2)
    ideal = rows[(0.2, "ideal")]
    assert ideal.ratio_total == pytest.approx(0.96 / 0.36)
    assert ideal.per_correct == pytest.approx(0.8)
    assert ideal.per_incorrect == pytest.approx(0.2)


@pytest.mark.parametrize("group_size", [2, 5, 8, 16])
def test_grpo_zero_sum_gives_ratio_one(group_size):
    """Advantages of a group sum to 0, so each k's correct and incorrect totals are equal."""
    for ddof in (0, 1):
        adv = theory.grpo_group_advantages(group_size, ddof)
        np.testing.assert_allclose(adv.sum(-1), 0.0, atol=1e-5)
        correct, _ = theory.kept_groups(group_size)
        np.testing.assert_allclose(
            (adv * correct).sum(-1), -(adv * (1 - correct)).sum(-1), rtol=1e-5
        )
    rows = theory.analyse(group_size, [0.01, 0.1, 0.3, 0.5, 0.8])
    for r in rows:
        if r.method.startswith("grpo"):
            assert r.ratio_total == pytest.approx(1.0, abs=1e-5)


def test_keep_probability_and_weights():
    p = np.array([0.01, 0.3, 0.9])
    for g in (2, 8, 16):
        w = theory.kept_weights(p, g)
        np.testing.assert_allclose(w.sum(1), 1.0, rtol=1e-12)
        keep = theory.keep_probability(p, g)
        np.testing.assert_allclose(keep, 1 - p**g - (1 - p) ** g)
        k = np.arange(1, g)
        np.testing.assert_allclose(w @ k, theory.expected_k_kept(p, g), rtol=1e-12)


def _mc_power_totals(group_size: int, p: float, n: int, seed: int = 0):
    """Monte-Carlo of kept groups (independent numpy code): per-group totals after power DAA."""
    rng = np.random.default_rng(seed)
    c = (rng.random((n, group_size)) < p).astype(np.float64)
    k = c.sum(1)
    c, k = c[(k > 0) & (k < group_size)], k[(k > 0) & (k < group_size)]
    mu = k / group_size
    std = np.sqrt(mu * (1 - mu) * group_size / (group_size - 1))
    adv = (c - mu[:, None]) / std[:, None]
    odds = mu / (1 - mu)
    lam = np.where(mu < 0.5, np.clip((1.0 / odds) ** 0.5, 1.0, 4.0), 1.0)
    adv = np.where(c > 0, lam[:, None] * adv, adv)
    tot_c = (np.abs(adv) * c).sum(1)
    tot_i = (np.abs(adv) * (1 - c)).sum(1)
    return tot_c, tot_i, k


@pytest.mark.parametrize("p", [0.05, 0.3])
def test_exact_matches_monte_carlo(p):
    """Exact sums vs a 200k-group simulation; tolerance 5 standard errors (~1 in 3.5e6)."""
    g = 8
    tot_c, tot_i, k = _mc_power_totals(g, p, 200_000)
    exact = {r.method: r for r in theory.analyse(g, [p])}
    assert len(k) / 200_000 == pytest.approx(exact["power"].p_keep, abs=5 * 0.5 / math.sqrt(2e5))
    for x, want in (
        (tot_c, exact["power"].total_correct),
        (tot_i, exact["power"].total_incorrect),
        (k, exact["power"].e_k_keep),
    ):
        se = x.std(ddof=1) / math.sqrt(len(x))
        assert abs(x.mean() - want) < 5 * se, (x.mean(), want, se)
    # grpo-sample's incorrect totals are untouched by DAA
    assert exact["grpo-sample"].total_incorrect == pytest.approx(
        exact["power"].total_incorrect, rel=1e-6
    )


def test_power_amplifies_hard_prompts_and_fades_above_tau():
    """power: ratio > 1 for p < tau; DAA gates on mu_g, not p, so above tau it is > 1 but
    shrinks to 1 as P(mu_g < tau | keep) vanishes."""
    grid = theory.default_p_grid()
    for g in (8, 16):
        rows = sorted(
            (r for r in theory.analyse(g, grid) if r.method == "power"), key=lambda r: r.p
        )
        below = [r for r in rows if r.p < theory.TAU]
        above = [r for r in rows if r.p >= theory.TAU]
        assert all(r.ratio_total > 1.05 for r in below)
        assert all(r.ratio_total >= 1.0 for r in above)
        ratios = [r.ratio_total for r in above]
        assert ratios == sorted(ratios, reverse=True)
        assert above[0].ratio_total < 1.2 and above[-1].ratio_total < 1 + 1e-3
        # ratio - 1 = E[(lambda - 1) T_c 1{hard}] / E[T_i] <= (cap - 1) P(hard | keep) * const
        for r in rows:
            assert r.mean_lambda_hard <= 4.0 + 1e-6
    # G = 2: mu = 1/2 is never below tau
    for r in theory.analyse(2, [0.01, 0.2]):
        if r.method == "power":
            assert r.ratio_total == pytest.approx(1.0, abs=1e-6)


def test_bayes_tier_is_one_above_tau_and_capped_at_sqrt_cap():
    """bayes with the tier prior: posterior p >= tau > mu gives odds(mu)/odds(p) < 1 -> 1; the
    cap applies before gamma, so lambda <= 4 ** 0.5 = 2."""
    rows = theory.analyse(8, [0.005, 0.5, 0.6, 0.9])
    for r in rows:
        if r.method in ("bayes-tier", "oracle") and r.p >= theory.TAU:
            assert r.ratio_total == pytest.approx(1.0, abs=1e-5)
        if r.method == "bayes-tier":
            assert r.mean_lambda_hard <= 2.0 + 1e-5
        if r.method == "bayes-tier" and r.p == 0.005:
            assert r.mean_lambda_hard == pytest.approx(2.0, rel=1e-5)


def test_worked_example_14x():
    """docs/algorithms.md: G = 8, p = 0.01, k = 1 -> incorrect amplified odds(1/8)/odds(p)
    ~ 14x more.
    At small p (k = 1 dominates) the per-response ratio of ideal to GRPO tends to that factor."""
    p = 0.001
    rows = _rows(8, [p])
    gap = rows[(p, "ideal")].ratio_per_response / rows[(p, "grpo-pop")].ratio_per_response
    assert gap == pytest.approx((1 / 7) / (p / (1 - p)), rel=0.02)
    # the oracle (gamma = 1, uncapped) restores the ideal per-response ratio exactly for k = 1
    oracle = rows[(p, "oracle")].ratio_per_response
    assert oracle == pytest.approx(rows[(p, "ideal")].ratio_per_response, rel=0.02)


def test_stated_priors_are_what_the_trainer_fits():
    """bayes-pop's Beta(0.5, 4.5) is the moment fit of a Beta(0.5, 4.5) population; a tier of
    equal p has only binomial noise and fits a + b at the upper clip 1e6 (the tier prior)."""
    from da3po_jax.rl import beta_prior_from_moments

    g = 8
    a, b = theory.POP_PRIOR
    m, s = a / (a + b), a + b
    var = m * (1 - m) * (s + g) / (g * (s + 1))  # beta-binomial variance of k / G
    fit = beta_prior_from_moments(m, var, g)
    assert (float(fit.a), float(fit.b)) == pytest.approx((a, b), rel=1e-3)
    for p in (0.01, 0.1):
        fit = beta_prior_from_moments(p, p * (1 - p) / g, g)
        assert float(fit.a + fit.b) == pytest.approx(theory.TIER_PRIOR_STRENGTH, rel=1e-3)
        assert float(fit.a / (fit.a + fit.b)) == pytest.approx(p, rel=1e-3)


def test_history_counts_stationary():
    p = np.array([0.01, 0.5])
    s, f = theory.history_counts(p, 8, kept_only=False, decay=0.5)
    np.testing.assert_allclose(s, 2 * 8 * p)
    np.testing.assert_allclose(f, 2 * 8 * (1 - p))
    s, f = theory.history_counts(p, 8, kept_only=True, decay=0.5)
    np.testing.assert_allclose(s + f, 16.0)
    assert s[0] > 2 * 8 * 0.01  # kept-only counts inherit dynamic sampling's bias


def test_cli_smoke(tmp_path, capsys):
    ps = ["0.01", "0.1", "0.5"]
    theory.main(["--group-sizes", "4", "8", "--p-grid", *ps, "--out", str(tmp_path)])
    for g in (4, 8):
        with open(tmp_path / f"theory_G{g}.csv") as fh:
            rows = list(csv.DictReader(fh))
        assert len(rows) == len(ps) * len(theory.METHODS)
        assert tuple(rows[0]) == theory.CSV_FIELDS
        assert {r["method"] for r in rows} == set(theory.METHODS)
        assert {int(r["G"]) for r in rows} == {g}
    png = (tmp_path / "theory_amplification.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "theory_table.md").read_text()
    assert "| 8 | 0.01 |" in table and "| 4 | 0.5 |" in table
    assert table in capsys.readouterr().out
