"""Exact amplification analysis of docs/algorithms.md ("DA3PO = DAPO + DAA", section "Why").

For a prompt with true success rate p and a group of G responses, the number of correct
responses is k ~ Binomial(G, p). Dynamic sampling (by accuracy) keeps the group iff
0 < k < G, with probability P(keep) = 1 - p^G - (1 - p)^G. For every kept k the script builds
the group's binary rewards, computes its advantages with the library's own
`grpo_advantages` (population std, ddof 0, and sample std, ddof 1) and `apply_daa`, and sums
the exact binomial weights over k = 1..G-1 (no Monte-Carlo):

    E[T_c | keep] = sum_k w_k * sum_{i: c_i = 1} |A_i(k)|,  w_k = C(G,k) p^k (1-p)^(G-k) / P(keep)

and likewise T_i for the incorrect responses. The per-response weights are
E[|A| | correct, keep] = E[T_c | keep] / E[k | keep] and E[|A| | incorrect, keep] =
E[T_i | keep] / E[G - k | keep] (a response drawn uniformly from the kept responses of that
sign). `ratio_total` = E[T_c] / E[T_i], `ratio_per_response` = the ratio of the per-response
weights.

Methods (DAA always on top of the sample-std advantages, the trainer's default; the
correct/incorrect ratios do not depend on the std):

- `grpo-pop`, `grpo-sample`: GRPO, std with ddof 0 / 1, eps = 0 (kept groups never have
  zero variance).
- `power`: DAA defaults tau = 0.5, beta = 0.5, lambda_max = 4.
- `bayes-tier`: `bayes` (gamma = 0.5, cap 4) with the prior the trainer fits to a step
  whose prompts all have success rate p: the accuracy moments are then mean p and variance
  p (1 - p) / G (pure binomial noise), so `beta_prior_from_moments` returns its upper clip
  a + b = 1e6, i.e. Beta(1e6 p, 1e6 (1 - p)) (p is known exactly).
- `bayes-pop`: `bayes` with the fixed prior Beta(0.5, 4.5) (mean 0.1, a + b = 5), what the
  trainer's moment fit converges to when the step's prompt success rates are themselves
  Beta(0.5, 4.5) distributed (a hard-prompt population).
- `history`: `bayes-pop`'s prior plus the prompt's decayed counts at their stationary
  expectation as the trainer keeps them, from every generated group (filtered ones
  included): s = G p / (1 - d), f = G (1 - p) / (1 - d), d = history_decay = 0.5.
- `history-kept`: as `history` but with counts from *kept* groups only,
  s = E[k | keep] / (1 - d), f = E[G - k | keep] / (1 - d): what the trainer did before it
  counted filtered groups; shows the selection bias that choice carries.
- `oracle`: `bayes-tier` with gamma = 1 and no cap (lambda = odds(mu) / odds(p) up to the
  posterior-mean approximation), the rule that equalises the two signs' amplification.
- `ideal`: the ideal centred advantage |R - p| restricted to kept groups (no std).

Run: `python -m experiments.theory --out docs/figures`.
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TAU = 0.5
HISTORY_DECAY = 0.5
POP_PRIOR = (0.5, 4.5)
TIER_PRIOR_STRENGTH = 1e6
REPRESENTATIVE_P = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75)
METHODS = (
    "grpo-pop",
    "grpo-sample",
    "power",
    "bayes-tier",
    "bayes-pop",
    "history",
    "history-kept",
    "oracle",
    "ideal",
)
CSV_FIELDS = (
    "G",
    "p",
    "method",
    "p_keep",
    "tau",
    "p_below_tau",
    "p_hard_given_keep",
    "e_k_keep",
    "total_correct",
    "total_incorrect",
    "ratio_total",
    "per_correct",
    "per_incorrect",
    "ratio_per_response",
    "mean_lambda_hard",
)


@dataclass(frozen=True)
class Row:
    """Exact expectations of one (G, p, method), conditioned on the group being kept."""

    G: int
    p: float
    method: str
    p_keep: float
    tau: float
    p_below_tau: bool
    p_hard_given_keep: float
    e_k_keep: float
    total_correct: float
    total_incorrect: float
    ratio_total: float
    per_correct: float
    per_incorrect: float
    ratio_per_response: float
    mean_lambda_hard: float


def default_p_grid(n: int = 34) -> np.ndarray:
    """Geometric grid from 0.005 to 0.9 merged with `REPRESENTATIVE_P` (about 40 points)."""
    grid = np.concatenate([np.geomspace(0.005, 0.9, n), np.asarray(REPRESENTATIVE_P)])
    return np.unique(np.round(grid, 6))


def keep_probability(p: np.ndarray, group_size: int) -> np.ndarray:
    """P(0 < k < G) for k ~ Binomial(G, p): 1 - p^G - (1 - p)^G."""
    p = np.asarray(p, dtype=np.float64)
    return 1.0 - p**group_size - (1.0 - p) ** group_size


def kept_weights(p: np.ndarray, group_size: int) -> np.ndarray:
    """Binomial weights of k = 1..G-1 conditioned on keeping the group.

    Args:
      p: `[N]` success probabilities in (0, 1).
      group_size: G >= 2.

    Returns:
      `[N, G-1]` weights P(k | keep), each row summing to 1.
    """
    p = np.asarray(p, dtype=np.float64)[:, None]
    k = np.arange(1, group_size)
    comb = np.array([math.comb(group_size, int(j)) for j in k], dtype=np.float64)
    w = comb * p**k * (1.0 - p) ** (group_size - k)
    return w / keep_probability(p[:, 0], group_size)[:, None]


def kept_groups(group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Correctness of the G-1 kept group types: row k-1 has k correct responses first.

    Returns:
      `(correct [G-1, G] float, k [G-1])`.
    """
    k = np.arange(1, group_size)
    correct = (np.arange(group_size)[None, :] < k[:, None]).astype(np.float64)
    return correct, k


def grpo_group_advantages(group_size: int, ddof: int) -> np.ndarray:
    """`[G-1, G]` GRPO advantages of the kept group types (library `grpo_advantages`)."""
    from da3po_jax.rl import grpo_advantages

    correct, _ = kept_groups(group_size)
    adv = grpo_advantages(correct, group_size, norm="std", std_ddof=ddof, eps=0.0)
    return np.asarray(adv, dtype=np.float64)


def daa_group_advantages(
    base: np.ndarray, p: np.ndarray, group_size: int, method: str
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages after DAA for every (p, kept k), via the library's `apply_daa`.

    Args:
      base: `[G-1, G]` GRPO advantages of the kept group types.
      p: `[N]` success probabilities.
      group_size: G.
      method: one of the DAA methods of the module docstring.

    Returns:
      `(adv [N, G-1, G], lam [N, G-1])` with lam the applied factor (1 outside hard groups).
    """
    import jax.numpy as jnp

    from da3po_jax.rl import BetaPrior, DAAConfig, PromptHistory, apply_daa

    correct, k = kept_groups(group_size)
    n_p, n_k = len(p), len(k)
    adv = np.broadcast_to(base, (n_p, n_k, group_size)).reshape(-1, group_size)
    c = np.broadcast_to(correct, (n_p, n_k, group_size)).reshape(-1, group_size)
    pp = np.repeat(np.asarray(p, dtype=np.float64), n_k)
    prior = history = None
    if method == "power":
        cfg = DAAConfig(estimator="power", tau=TAU)
    elif method in ("bayes-tier", "oracle"):
        gamma, cap = (1.0, 1e12) if method == "oracle" else (0.5, 4.0)
        cfg = DAAConfig(estimator="bayes", tau=TAU, gamma=gamma, lambda_max=cap)
        prior = BetaPrior(
            jnp.asarray(TIER_PRIOR_STRENGTH * pp), jnp.asarray(TIER_PRIOR_STRENGTH * (1 - pp))
        )
    else:
        a, b = POP_PRIOR
        prior = BetaPrior(jnp.asarray(a), jnp.asarray(b))
        if method == "bayes-pop":
            cfg = DAAConfig(estimator="bayes", tau=TAU)
        else:
            s, f = history_counts(p, group_size, kept_only=(method == "history-kept"))
            cfg = DAAConfig(estimator="history", tau=TAU, history_decay=HISTORY_DECAY)
            history = PromptHistory(jnp.asarray(np.repeat(s, n_k)), jnp.asarray(np.repeat(f, n_k)))
    new, _ = apply_daa(
        jnp.asarray(adv), jnp.asarray(c), group_size, config=cfg, prior=prior, history=history
    )
    new = np.asarray(new, dtype=np.float64).reshape(n_p, n_k, group_size)
    lam = new[:, :, 0] / base[None, :, 0]  # response 0 is always correct
    return new, lam


def history_counts(
    p: np.ndarray, group_size: int, kept_only: bool, decay: float = HISTORY_DECAY
) -> tuple[np.ndarray, np.ndarray]:
    """Stationary expectation of the decayed per-prompt counts (s, f) under success rate p.

    s <- d s + k each update has fixed point E[k] / (1 - d). With `kept_only` (the trainer's
    table, updated from kept groups only) E[k] = E[k | keep], else E[k] = G p.
    """
    p = np.asarray(p, dtype=np.float64)
    if kept_only:
        ek = expected_k_kept(p, group_size)
    else:
        ek = group_size * p
    return ek / (1 - decay), (group_size - ek) / (1 - decay)


def expected_k_kept(p: np.ndarray, group_size: int) -> np.ndarray:
    """E[k | 0 < k < G] = G (p - p^G) / P(keep)."""
    p = np.asarray(p, dtype=np.float64)
    return group_size * (p - p**group_size) / keep_probability(p, group_size)


def ideal_group_advantages(p: np.ndarray, group_size: int) -> np.ndarray:
    """`[N, G-1, G]` ideal centred advantages R - p of the kept group types."""
    correct, _ = kept_groups(group_size)
    return correct[None] - np.asarray(p, dtype=np.float64)[:, None, None]


def expectations(
    adv: np.ndarray, p: np.ndarray, group_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Exact kept-conditional totals and per-response |advantage| of each sign.

    Args:
      adv: `[N, G-1, G]` (or `[G-1, G]`, shared by all p) advantages of the kept group types.
      p: `[N]` success probabilities.
      group_size: G.

    Returns:
      `(total_correct, total_incorrect, per_correct, per_incorrect)`, each `[N]`.
    """
    correct, _ = kept_groups(group_size)
    w = kept_weights(p, group_size)
    absa = np.abs(np.broadcast_to(adv, (len(p), group_size - 1, group_size)))
    tot_c = np.einsum("nk,nkg->n", w, absa * correct)
    tot_i = np.einsum("nk,nkg->n", w, absa * (1 - correct))
    ek = expected_k_kept(p, group_size)
    return tot_c, tot_i, tot_c / ek, tot_i / (group_size - ek)


def hard_probability(p: np.ndarray, group_size: int, tau: float = TAU) -> np.ndarray:
    """P(0 < k/G < tau | keep): the chance a kept group is hard for DAA."""
    _, k = kept_groups(group_size)
    return kept_weights(p, group_size) @ (k / group_size < tau).astype(np.float64)


def analyse(group_size: int, p: Sequence[float]) -> list[Row]:
    """All methods' exact expectations for one G over the grid p."""
    p = np.asarray(p, dtype=np.float64)
    if np.any((p <= 0) | (p >= 1)):
        raise ValueError("p must lie in (0, 1)")
    _, k = kept_groups(group_size)
    hard = (k / group_size) < TAU
    w = kept_weights(p, group_size)
    p_hard = hard_probability(p, group_size)
    sample = grpo_group_advantages(group_size, ddof=1)
    rows = []
    for method in METHODS:
        lam = np.ones((len(p), len(k)))
        if method == "grpo-pop":
            adv = grpo_group_advantages(group_size, ddof=0)
        elif method == "grpo-sample":
            adv = sample
        elif method == "ideal":
            adv = ideal_group_advantages(p, group_size)
        else:
            adv, lam = daa_group_advantages(sample, p, group_size, method)
        tc, ti, pc, pi = expectations(adv, p, group_size)
        lam_hard = np.where(p_hard > 0, (w * lam * hard).sum(1) / np.maximum(p_hard, 1e-300), 1.0)
        for j, pj in enumerate(p):
            rows.append(
                Row(
                    G=group_size,
                    p=float(pj),
                    method=method,
                    p_keep=float(keep_probability(pj, group_size)),
                    tau=TAU,
                    p_below_tau=bool(pj < TAU),
                    p_hard_given_keep=float(p_hard[j]),
                    e_k_keep=float(expected_k_kept(pj, group_size)),
                    total_correct=float(tc[j]),
                    total_incorrect=float(ti[j]),
                    ratio_total=float(tc[j] / ti[j]),
                    per_correct=float(pc[j]),
                    per_incorrect=float(pi[j]),
                    ratio_per_response=float(pc[j] / pi[j]),
                    mean_lambda_hard=float(lam_hard[j]),
                )
            )
    return rows


def write_csv(rows: Sequence[Row], path: Path) -> None:
    """Writes rows (one per p and method) to a CSV file."""
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_FIELDS)
        for r in rows:
            writer.writerow(
                [
                    f"{v:.6g}" if isinstance(v, float) else v
                    for v in (getattr(r, name) for name in CSV_FIELDS)
                ]
            )


def markdown_table(rows: Sequence[Row], ps: Sequence[float] = REPRESENTATIVE_P) -> str:
    """Two markdown tables at representative p: total ratios, then per-response weights."""
    by = {(r.G, round(r.p, 6), r.method): r for r in rows}
    sizes = sorted({r.G for r in rows})
    grid = sorted({round(r.p, 6) for r in rows})
    chosen = [round(p, 6) for p in ps if round(p, 6) in grid]
    if not chosen:  # a custom grid without the representative values: take a few of its points
        chosen = [grid[i] for i in np.unique(np.linspace(0, len(grid) - 1, 6).astype(int))]
    keys = [(g, p) for g in sizes for p in chosen]
    head = "| G | p | P(keep) | P(mu<tau \\| keep) | " + " | ".join(METHODS) + " |"
    lines = [
        "Correct / incorrect ratio of the expected total |advantage| in kept groups "
        f"(tau = {TAU}; DAA cap 4):",
        "",
        head,
        "|" + "---|" * (4 + len(METHODS)),
    ]
    for g, p in keys:
        r0 = by[(g, p, "ideal")]
        cells = [f"{by[(g, p, m)].ratio_total:.3f}" for m in METHODS]
        lines.append(
            f"| {g} | {p:g} | {r0.p_keep:.4f} | {r0.p_hard_given_keep:.3f} | "
            + " | ".join(cells)
            + " |"
        )
    per = ("grpo-pop", "grpo-sample", "power", "ideal")
    lines += [
        "",
        "Expected per-response |advantage| of a correct / an incorrect response in a kept group "
        "(E[k | keep] = expected number of correct responses):",
        "",
        "| G | p | E[k \\| keep] | "
        + " | ".join(f"{m} correct | {m} incorrect" for m in per)
        + " |",
        "|" + "---|" * (3 + 2 * len(per)),
    ]
    for g, p in keys:
        cells = []
        for m in per:
            r = by[(g, p, m)]
            cells += [f"{r.per_correct:.3f}", f"{r.per_incorrect:.3f}"]
        lines.append(
            f"| {g} | {p:g} | {by[(g, p, 'ideal')].e_k_keep:.3f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[Row], path: Path) -> None:
    """Correct/incorrect total-advantage ratio vs p (log-log), one panel per G."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r.G for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4.5), squeeze=False)
    styles = {"grpo-pop": "-", "grpo-sample": ":", "ideal": "--", "oracle": "-."}
    for ax, g in zip(axes[0], sizes):
        for m in METHODS:
            sel = sorted((r for r in rows if r.G == g and r.method == m), key=lambda r: r.p)
            color = {"grpo-pop": "0.6", "grpo-sample": "black", "ideal": "black"}.get(m)
            ax.plot(
                [r.p for r in sel],
                [r.ratio_total for r in sel],
                styles.get(m, "-"),
                color=color,
                lw=3.5 if m == "grpo-pop" else 1.5,
                label=m,
            )
        ax.axvline(TAU, color="grey", lw=0.8)
        ax.text(TAU, 0.9, " tau", color="grey", va="top")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("success probability p")
        ax.set_ylabel("E[total |A| correct] / E[total |A| incorrect] | kept")
        ax.set_title(f"G = {g}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> list[Row]:
    """CLI: writes theory_G{G}.csv, theory_table.md and theory_amplification.png to --out."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--group-sizes", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--p-grid", type=float, nargs="+", default=None)
    ap.add_argument("--out", type=Path, default=Path("docs/figures"))
    args = ap.parse_args(argv)
    p = np.asarray(args.p_grid) if args.p_grid else default_p_grid()
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    for g in args.group_sizes:
        g_rows = analyse(g, p)
        write_csv(g_rows, args.out / f"theory_G{g}.csv")
        rows += g_rows
    table = markdown_table(rows)
    (args.out / "theory_table.md").write_text(table)
    plot(rows, args.out / "theory_amplification.png")
    print(table)
    return rows


if __name__ == "__main__":
    main()
