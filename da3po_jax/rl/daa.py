"""Direct Advantage Amplification (DAA), the "DA3PO" part of docs/algorithms.md.

For a kept group g with accuracy mu_g < tau (a *hard* group), the advantages of its correct
responses are multiplied by lambda_g >= 1:

    A'_i = lambda_g * A_i   if c_i = 1 and mu_g < tau,   else A_i.

Why: on a hard prompt (true success rate p << 1/G) the group baseline mu_g >= 1/G over-weights
the incorrect responses relative to the ideal advantage R - p by odds(mu_g) / odds(p); DAA
gives the rare correct response that weight back. Estimators of lambda_g (`DAAConfig.estimator`,
a name in the registry `DAA_RULES` of `DAARule`s):

- `constant`: lambda = factor (the DA3PO paper's rule; factor 2 worked best there; the
             default). `lambda_max` does not apply to it.
- `power`:   lambda = clip((odds(tau) / odds(mu))^beta, 1, lambda_max).
- `bayes`:   lambda = clip(odds(mu) * E_post[(1 - p) / p], 1, lambda_max)^gamma with the
             posterior Beta(a + k, b + n - k) of an empirical-Bayes Beta(a, b) prior, and
             E[(1 - p) / p] = (b + n - k) / max(a + k - 1, 1e-3).
- `history`: as `bayes`, with the prompt's decayed success / failure counts s, f from
             earlier epochs added: Beta(a + k + s, b + n - k + f).
- `none`:    lambda = 1 (no amplification).

A new rule is a function `fn(mu, k, n, config, prior, history) -> lambda [P]` registered as
`DAA_RULES.register("name", DAARule(fn, uses_prior=..., uses_history=...))`.

`apply_to="both"` is the control of docs/algorithms.md: every response of a hard group (both
signs) is multiplied by the same lambda_g, separating "amplify correct responses" from
"weight hard prompts more".

Departures / choices not fixed by docs/algorithms.md: a group counts as hard only if it also has
at least one correct response (0 < mu_g < tau): with mu_g = 0 there is nothing to amplify
and lambda is undefined (`power`) or 1 (`bayes`). n (the group's number of valid
responses) replaces G so masked responses are handled. `tau = 0.5`, `gamma = 0.5` and
`history_decay = 0.5` are this module's choices (the paper's tau is not public).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from da3po_jax.rl._utils import as_float, odds, safe_div, to_groups, valid_or_ones
from da3po_jax.rl.fields import (
    at_least_one,
    check_fields,
    choice,
    open_unit,
    positive,
    setting,
    unit,
)
from da3po_jax.rl.groups import group_accuracy
from da3po_jax.rl.registry import Registry

_APPLY_TO = ("correct", "both")
_TINY = 1e-12


@dataclasses.dataclass(frozen=True)
class DAAConfig:
    """DAA settings, the run's `daa` section (hashable; usable as a static jit argument)."""

    enable: bool = setting(
        True,
        "amplify (the algorithm preset: on for da3po only); off: advantages unchanged",
        preset=True,
    )
    estimator: str = setting(
        "constant",
        "a name in DAA_RULES: constant (lambda = factor, the DA3PO paper's) | power | bayes | "
        "history | none (lambda = 1)",
        lambda v: DAA_RULES.check(v),  # the registry as it is at check time
    )
    tau: float = setting(
        0.5, "hardness threshold: a kept group is hard iff 0 < mu_g < tau", open_unit
    )
    factor: float = setting(
        2.0, "lambda of the constant rule (the DA3PO paper's best: 2; >= 1)", at_least_one
    )
    beta: float = setting(0.5, "exponent of the power rule", positive)
    lambda_max: float = setting(
        4.0, "cap on lambda of the power / bayes / history rules (>= 1)", at_least_one
    )
    gamma: float = setting(
        0.5, "exponent of the bayes / history rules (1 equalises in expectation)", positive
    )
    prior_ema: float = setting(0.9, "EMA decay of the Beta-prior moments across steps", unit)
    history_decay: float = setting(
        0.5, "decay of the per-prompt success / failure counts per epoch", unit
    )
    apply_to: str = setting(
        "correct",
        "correct (DAA) | both (control: every response of a hard group)",
        choice(*_APPLY_TO),
    )
    denom_min: float = setting(
        1e-3, "clamp of the posterior denominator a + k - 1", positive, config=False
    )

    def __post_init__(self):
        check_fields(self)

    @property
    def uses_prior(self) -> bool:
        """Whether the estimator's rule needs a `BetaPrior` (the trainer then carries one)."""
        return DAA_RULES.get(self.estimator).uses_prior

    @property
    def uses_history(self) -> bool:
        """Whether the estimator's rule needs a `PromptHistory` (per-prompt counts)."""
        return DAA_RULES.get(self.estimator).uses_history


class BetaPrior(NamedTuple):
    """Beta(a, b) prior over a prompt's success rate p (scalars)."""

    a: jax.Array  # []
    b: jax.Array  # []


class PriorState(NamedTuple):
    """EMA of the accuracy moments across steps (carried in the train state)."""

    mean: jax.Array  # [] EMA of the mean group accuracy
    var: jax.Array  # [] EMA of the variance of group accuracies
    initialized: jax.Array  # [] bool: False until the first update


class PromptHistory(NamedTuple):
    """Decayed per-prompt counts from earlier epochs, gathered from the host table."""

    success: jax.Array  # [P] decayed number of correct responses
    failure: jax.Array  # [P] decayed number of incorrect responses


def accuracy_moments(
    group_acc: jax.Array, valid: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """Mean and unbiased variance of group accuracies over valid groups.

    Args:
      group_acc: `[M]` accuracies k_g / G of *all* groups generated in the step's rounds,
        including the all-wrong and all-correct groups that dynamic sampling filtered out.
      valid: optional `[M]` mask of generated groups.

    Returns:
      `(mean, var)` scalars; var = sum v (x - mean)^2 / max(n - 1, 1).
    """
    x = as_float(group_acc)
    v = valid_or_ones(valid, x)
    n = v.sum()
    mean = safe_div(jnp.where(v, x, 0).sum(), n)
    var = jnp.where(v, (x - mean) ** 2, 0).sum() / jnp.maximum(n - 1, 1)
    return mean, var


def beta_prior_from_moments(
    mean: jax.Array, var: jax.Array, group_size: int, *, s_min: float = 1e-2, s_max: float = 1e6
) -> BetaPrior:
    """Beta-binomial method-of-moments fit of Beta(a, b) from accuracy moments.

    Group accuracies k / G are beta-binomial, so their variance includes binomial noise:
    Var(k / G) = m (1 - m) (s + G) / (G (s + 1)) with m = a / s, s = a + b. Solving with
    r = G Var / (m (1 - m)) gives s = (G - r) / (r - 1), a = m s, b = (1 - m) s. s is
    clipped to [s_min, s_max] (r <= 1: no over-dispersion, s -> s_max; r >= G: s -> s_min).
    (A plain Beta moment fit to k / G would ignore the binomial noise and be biased.)

    Args:
      mean: mean accuracy m.
      var: variance of accuracies.
      group_size: G.
      s_min: lower clip of a + b.
      s_max: upper clip of a + b.

    Returns:
      The fitted `BetaPrior`.
    """
    m = jnp.clip(as_float(mean), 1e-6, 1 - 1e-6)
    r = group_size * as_float(var) / (m * (1 - m))
    s = (group_size - r) / jnp.maximum(r - 1, _TINY)
    s = jnp.where(r >= group_size, s_min, jnp.clip(s, s_min, s_max))
    return BetaPrior(a=m * s, b=(1 - m) * s)


def fit_beta_prior(
    group_acc: jax.Array, group_size: int, valid: jax.Array | None = None
) -> BetaPrior:
    """Fits the empirical-Bayes Beta(a, b) prior to the accuracies of all generated groups.

    Args:
      group_acc: `[M]` accuracies of all groups of the step (filtered ones included).
      group_size: G.
      valid: optional `[M]` mask.

    Returns:
      `BetaPrior` from `beta_prior_from_moments(*accuracy_moments(...))`.
    """
    return beta_prior_from_moments(*accuracy_moments(group_acc, valid), group_size)


def init_prior_state() -> PriorState:
    """An empty `PriorState` (the first update takes the batch moments as they are)."""
    return PriorState(mean=jnp.zeros(()), var=jnp.zeros(()), initialized=jnp.zeros((), bool))


def update_prior_state(
    state: PriorState, group_acc: jax.Array, valid: jax.Array | None = None, decay: float = 0.9
) -> PriorState:
    """EMA of the accuracy moments: x <- decay * x + (1 - decay) * x_batch (first: x_batch).

    A batch with no valid group leaves the state unchanged.

    Args:
      state: the carried `PriorState`.
      group_acc: `[M]` accuracies of all groups generated this step.
      valid: optional `[M]` mask.
      decay: `DAAConfig.prior_ema`.

    Returns:
      The new `PriorState`; turn it into a prior with `prior_from_state`.
    """
    mean, var = accuracy_moments(group_acc, valid)
    has = valid_or_ones(valid, jnp.asarray(group_acc)).any()
    mix = lambda old, new: jnp.where(state.initialized, decay * old + (1 - decay) * new, new)
    return PriorState(
        mean=jnp.where(has, mix(state.mean, mean), state.mean),
        var=jnp.where(has, mix(state.var, var), state.var),
        initialized=state.initialized | has,
    )


def prior_from_state(state: PriorState, group_size: int) -> BetaPrior:
    """`BetaPrior` fitted to the EMA-smoothed moments of a `PriorState`."""
    return beta_prior_from_moments(state.mean, state.var, group_size)


def update_history(
    history: PromptHistory,
    correct: jax.Array,
    group_size: int,
    decay: float,
    valid: jax.Array | None = None,
) -> PromptHistory:
    """Decays a prompt's counts and adds this epoch's: s <- decay s + k, f <- decay f + n - k.

    Call it *after* computing lambda for the step (history holds earlier epochs only). The
    host scatters the result back into its table keyed by prompt id.

    Args:
      history: counts of the P prompts of the batch.
      correct: `[P * G]` or `[P, G]` correctness.
      group_size: G.
      decay: `DAAConfig.history_decay`.
      valid: optional per-response mask.

    Returns:
      Updated `PromptHistory`.
    """
    _, k, n = group_accuracy(correct, group_size, valid)
    return PromptHistory(
        success=decay * as_float(history.success) + k,
        failure=decay * as_float(history.failure) + (n - k),
    )


@dataclasses.dataclass(frozen=True)
class DAARule:
    """One lambda rule of `DAA_RULES`.

    Attributes:
      fn: `fn(mu, k, n, config, prior, history) -> [P]` lambda in [1, lambda_max] (clipping
        and any exponent included); `mu`, `k`, `n` are `[P]` group accuracy, number correct
        and number of valid responses; `config` is the `DAAConfig`.
      uses_prior: the rule reads `prior` (`daa_lambda` refuses `prior=None`).
      uses_history: the rule reads `history` (`daa_lambda` refuses `history=None`).
    """

    fn: Callable[..., jax.Array]
    uses_prior: bool = False
    uses_history: bool = False


DAA_RULES: Registry[DAARule] = Registry("DAA rule")


def _odds_mu(mu: jax.Array) -> jax.Array:
    return jnp.maximum(odds(jnp.clip(mu, 0.0, 1 - 1e-6)), _TINY)


def _none_lambda(mu, k, n, config, prior, history):
    del k, n, config, prior, history
    return jnp.ones_like(mu)


def _constant_lambda(mu, k, n, config, prior, history):
    del k, n, prior, history
    return jnp.full(jnp.shape(mu), config.factor, jnp.float32)


def _power_lambda(mu, k, n, config, prior, history):
    del k, n, prior, history
    lam = (odds(jnp.asarray(min(config.tau, 1 - 1e-6))) / _odds_mu(mu)) ** config.beta
    return jnp.clip(lam, 1.0, config.lambda_max)


def _posterior_lambda(mu, alpha, beta_, config):
    e_inv_odds = beta_ / jnp.maximum(alpha - 1, config.denom_min)
    return jnp.clip(_odds_mu(mu) * e_inv_odds, 1.0, config.lambda_max) ** config.gamma


def _bayes_lambda(mu, k, n, config, prior, history):
    del history
    return _posterior_lambda(mu, prior.a + k, prior.b + n - k, config)


def _history_lambda(mu, k, n, config, prior, history):
    alpha = prior.a + k + as_float(history.success)
    beta_ = prior.b + n - k + as_float(history.failure)
    return _posterior_lambda(mu, alpha, beta_, config)


DAA_RULES.register("none", DAARule(_none_lambda))
DAA_RULES.register("constant", DAARule(_constant_lambda))
DAA_RULES.register("power", DAARule(_power_lambda))
DAA_RULES.register("bayes", DAARule(_bayes_lambda, uses_prior=True))
DAA_RULES.register("history", DAARule(_history_lambda, uses_prior=True, uses_history=True))


def daa_lambda(
    mu: jax.Array,
    k: jax.Array,
    n: jax.Array,
    config: DAAConfig,
    prior: BetaPrior | None = None,
    history: PromptHistory | None = None,
) -> jax.Array:
    """Per-group amplification lambda_g (before hardness gating); see the module docstring.

    Dispatches to `DAA_RULES.get(config.estimator).fn`.

    Args:
      mu: `[P]` group accuracy k / n.
      k: `[P]` number of correct responses.
      n: `[P]` number of valid responses.
      config: `DAAConfig`.
      prior: `BetaPrior`, required by rules with `uses_prior` (`bayes`, `history`).
      history: `PromptHistory`, required by rules with `uses_history` (`history`).

    Returns:
      `[P]` lambda: `factor` for `"constant"`, 1 for `"none"`, else in [1, lambda_max].
    """
    rule = DAA_RULES.get(config.estimator)
    if rule.uses_prior and prior is None:
        raise ValueError(f"DAA estimator {config.estimator!r} needs a BetaPrior (prior=...)")
    if rule.uses_history and history is None:
        raise ValueError(f"DAA estimator {config.estimator!r} needs a PromptHistory (history=...)")
    return rule.fn(mu, k, n, config, prior, history)


def apply_daa(
    advantages: jax.Array,
    correct: jax.Array,
    group_size: int,
    *,
    config: DAAConfig | None = None,
    valid: jax.Array | None = None,
    group_valid: jax.Array | None = None,
    prior: BetaPrior | None = None,
    history: PromptHistory | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Amplifies the advantages of correct responses in hard kept groups.

    A'_i = lambda_g A_i if c_i = 1 (or any c_i with `apply_to="both"`) and 0 < mu_g < tau
    and group g is kept; A'_i = A_i otherwise. Incorrect responses are never changed under
    `apply_to="correct"`. lambda_g >= 1 from `daa_lambda`.

    Args:
      advantages: `[P * G]` or `[P, G]` per-response advantages (before token broadcast).
      correct: correctness c_i in {0, 1}, same shape.
      group_size: G.
      config: `DAAConfig` (default `constant`, factor 2, tau 0.5); with `enable` False
        nothing is amplified.
      valid: optional per-response mask.
      group_valid: optional `[P]` mask of kept groups (default: groups with 0 < mu_g < 1,
        i.e. those that dynamic sampling by accuracy keeps).
      prior: `BetaPrior` for `bayes` / `history`.
      history: `PromptHistory` for `history`.

    Returns:
      `(advantages', metrics)`: metrics `daa/frac_hard` (hard among kept groups),
      `daa/lambda_mean` and `daa/lambda_max` (over hard groups; 1 if none),
      `daa/pos_share_before` and `daa/pos_share_after` (sum A+ / sum |A| over valid responses).
    """
    config = config or DAAConfig()
    shape = jnp.shape(advantages)
    adv = to_groups(as_float(advantages), group_size)
    c = to_groups(jnp.asarray(correct), group_size) > 0
    v = to_groups(valid_or_ones(valid, jnp.asarray(advantages)), group_size)
    mu, k, n = group_accuracy(c, group_size, v)
    if group_valid is None:  # default: the groups accuracy-based dynamic sampling keeps
        kept = (mu > 0) & (mu < 1)
    else:
        kept = jnp.asarray(group_valid, bool) & (n > 0)
    hard = kept & (mu > 0) & (mu < config.tau) & (config.estimator != "none") & config.enable
    lam = jnp.where(hard, daa_lambda(mu, k, n, config, prior, history), 1.0)
    target = v & (c if config.apply_to == "correct" else True)
    new = jnp.where(target, lam[:, None] * adv, adv)
    metrics = {
        "daa/frac_hard": safe_div(hard.sum(), kept.sum()),
        "daa/lambda_mean": safe_div(jnp.where(hard, lam, 0).sum(), hard.sum(), 1.0),
        "daa/lambda_max": jnp.where(hard, lam, 1.0).max(),
        "daa/pos_share_before": _positive_share(adv, v),
        "daa/pos_share_after": _positive_share(new, v),
    }
    return new.reshape(shape), metrics


def _positive_share(adv: jax.Array, valid: jax.Array) -> jax.Array:
    """sum(max(A, 0)) / sum(|A|) over valid responses (0 when all advantages are 0)."""
    pos = jnp.where(valid, jnp.maximum(adv, 0), 0).sum()
    return safe_div(pos, jnp.where(valid, jnp.abs(adv), 0).sum())
