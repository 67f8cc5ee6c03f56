"""Decoupled-clip policy-gradient loss of DAPO / DA3PO (docs/algorithms.md, "Policy loss").

Token arrays are `[B, T]` (B responses, T padded response length) with a response mask m.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from da3po_jax.rl._utils import as_float, safe_div
from da3po_jax.rl.fields import (
    above_one,
    below_one,
    check_fields,
    choice,
    non_negative,
    positive,
    setting,
)

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
_RATIO_LEVELS = ("token", "sequence")
_KL_ESTIMATORS = ("k1", "k3")


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Settings of `da3po_loss`, the run's `loss` section (hashable; passed to `jax.jit` as
    a static argument). Each field's meaning is its `setting` doc."""

    eps_low: float = setting(0.2, "lower clip: rho >= 1 - eps_low", below_one)
    eps_high: float = setting(
        0.28, "upper clip: rho <= 1 + eps_high (DAPO clip-higher: 0.28)", non_negative, preset=True
    )
    clip_ratio_c: float = setting(3.0, "dual-clip constant c > 1 for A < 0 (inf: off)", above_one)
    ratio_level: str = setting(
        "token",
        "token (PPO) | sequence (GSPO: masked mean of the log-ratio)",
        choice(*_RATIO_LEVELS),
    )
    agg: str = setting(
        "token-mean", f"loss aggregation: {' | '.join(AGG_MODES)}", choice(*AGG_MODES), preset=True
    )
    kl_coef: float = setting(
        0.0, "coefficient of the per-token KL to the reference (0: off)", non_negative
    )
    kl_estimator: str = setting("k3", "k1 | k3", choice(*_KL_ESTIMATORS))
    log_ratio_clamp: float = setting(
        20.0,
        "clamp of the log-ratios before exp (policy ratio, k3's logp_ref - logp)",
        positive,
        config=False,
    )
    kl_clamp: float = setting(10.0, "clamp of the k3 estimate", positive, config=False)
    tis_cap: float = setting(
        0.0,
        "truncated importance sampling cap C: with `logp_behavior` (log mu of the sampling "
        "distribution) each token's policy loss is multiplied by stop_grad(min(pi_old / mu, "
        "C)); 0: off (the run derives it from rollout.tis_cap)",
        non_negative,
        config=False,
    )
    train_temperature: float = setting(
        0.0,
        "temperature T of the trained policy softmax(logits / T): 0 = the rollout's sampling "
        "temperature (as verl and TRL); 1 = the untempered policy. Read by the update's "
        "forwards and the sampler's log-probs (da3po_loss takes log-probs)",
        non_negative,
    )
    temperature: float = setting(
        1.0,
        "the trained policy's temperature: train_temperature, or the rollout's sampling "
        "temperature where that is 0 (derived by the run)",
        positive,
        config=False,
    )

    def __post_init__(self):
        check_fields(self)


_LOSS_FIELDS = tuple(f.name for f in dataclasses.fields(LossConfig))


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"LossConfig.{name} must be one of {choices}, got {value!r}")


def loss_normalizer(mask: jax.Array, agg: str = "token-mean", axis_name: Any = None) -> jax.Array:
    """Global normaliser of an aggregation mode, from the *whole* optimizer-step mini-batch.

    token-mean: N = sum(m); seq-mean-token-mean and seq-mean-token-sum: B = number of rows
    with at least one token; seq-mean-token-sum-norm: B * T. Compute it once over all
    micro-batches (concatenate their masks, or sum per-micro-batch values: every mode is a
    sum over rows) and pass it to every micro-batch's `da3po_loss` so the summed gradients
    equal the full-batch gradient.

    Args:
      mask: `[B, T]` response mask of the whole mini-batch (or of this device's shard).
      agg: aggregation mode.
      axis_name: if given, the value is `lax.psum`-ed over this mapped axis (data parallel).

    Returns:
      Scalar float normaliser (0 for an empty mask; `da3po_loss` then returns 0).
    """
    _check_choice("agg", agg, AGG_MODES)
    m = jnp.asarray(mask) > 0
    if agg == "token-mean":
        val = m.sum(dtype=jnp.float32)
    else:
        val = m.any(-1).sum(dtype=jnp.float32)
        if agg == "seq-mean-token-sum-norm":
            val = val * m.shape[-1]
    if axis_name is not None:
        val = jax.lax.psum(val, axis_name)
    return val


def _log_ratio(logp_new, logp_old, m, config: LossConfig):
    """Token d = clamp(logp_new - logp_old, -c, c) and the d used by the loss.

    The latter is d itself, or its masked row mean broadcast over the row (sequence level).
    """
    d = jnp.clip(logp_new - logp_old, -config.log_ratio_clamp, config.log_ratio_clamp)
    d = jnp.where(m > 0, d, 0.0)
    if config.ratio_level == "sequence":
        seq = safe_div(d.sum(-1), m.sum(-1))
        return d, jnp.broadcast_to(seq[:, None], d.shape)
    return d, d


def _kl_to_ref(logp_new, logp_ref, config: LossConfig):
    """Per-token k1 = logp - logp_ref, or k3 = exp(x) - x - 1 clamped to [-10, 10] with
    x = clamp(ref - logp, -20, 20).

    The clamp of x comes *before* the exp: clamping only the result keeps the forward
    finite but not the gradient (exp(x) overflows to inf in float32 for x > ~88, and
    inf * 0 from the outer clamp's gradient is NaN).
    """
    if config.kl_estimator == "k1":
        return logp_new - logp_ref
    x = jnp.clip(logp_ref - logp_new, -config.log_ratio_clamp, config.log_ratio_clamp)
    return jnp.clip(jnp.exp(x) - x - 1.0, -config.kl_clamp, config.kl_clamp)


def _entropy_from_logits(logits: jax.Array) -> jax.Array:
    """Per-position entropy -sum_v p_v log p_v of softmax(logits), `[B, T, V] -> [B, T]`."""
    logp = jax.nn.log_softmax(as_float(logits), axis=-1)
    p = jnp.exp(logp)
    return -jnp.where(p > 0, p * logp, 0.0).sum(-1)  # -inf logits (masked vocab) give 0


def tis_weights(logp_old: jax.Array, logp_behavior: jax.Array, mask: jax.Array, cap: float):
    """Truncated importance weights w = stop_grad(min(pi_old / mu, C)) per token, 0 off-mask.

    pi_old is the trained policy (at its temperature) that the ratio is taken against and
    mu the distribution the tokens were actually drawn from (temperature, top-k, top-p). Tokens
    that mu could never emit never occur in the samples, so nothing corrects for the
    probability mass pi_old puts on them.
    """
    log_w = jnp.minimum(as_float(logp_old) - as_float(logp_behavior), jnp.log(cap))
    return jax.lax.stop_gradient(jnp.where(mask > 0, jnp.exp(log_w), 0.0))


def _aggregate(tok_loss, m, agg: str, normalizer):
    """sum(m * l) / normalizer, with the per-row token mean for seq-mean-token-mean."""
    if agg == "seq-mean-token-mean":
        total = safe_div((m * tok_loss).sum(-1), m.sum(-1)).sum()
    else:
        total = (m * tok_loss).sum()
    return safe_div(total, normalizer)


def _metrics(d, rho, adv, m, config: LossConfig, pg_loss, kl, entropy, amplified, is_weights):
    """Token metrics over this batch's valid tokens (stop-gradient); d is the token log-ratio."""
    n = m.sum()
    mean = lambda x: safe_div((m * x).sum(), n)
    low = (adv < 0) & (rho < 1 - config.eps_low)
    high = (adv > 0) & (rho > 1 + config.eps_high)
    out = {
        "loss/pg": pg_loss,
        "loss/clipfrac_low": mean(low),
        "loss/clipfrac_high": mean(high),
        "loss/clipfrac_dual": mean((adv < 0) & (rho > config.clip_ratio_c)),
        "loss/approx_kl": mean(jnp.expm1(d) - d),
        "loss/ratio_mean": mean(rho),
        "loss/ratio_max": jnp.where(n > 0, jnp.where(m > 0, rho, -jnp.inf).max(), 0.0),
        "loss/num_tokens": n,
    }
    if kl is not None:
        out["loss/kl_ref"] = mean(kl)
    if entropy is not None:
        out["loss/entropy"] = mean(entropy)
    if amplified is not None:
        am = m * jnp.broadcast_to(amplified.reshape(amplified.shape[0], -1), m.shape)
        out["loss/clipfrac_high_amplified"] = safe_div((am * high).sum(), am.sum())
        out["loss/num_amplified_tokens"] = am.sum()
    if is_weights is not None:
        out["loss/tis_weight_mean"] = mean(is_weights)
        out["loss/tis_capped_frac"] = mean(is_weights >= config.tis_cap * (1 - 1e-6))
    return jax.tree.map(jax.lax.stop_gradient, out)


# over 60 lines: the docstring is the loss's specification (formula, normaliser, departures
# from the papers, every metric); the body is 40 lines. Jitted once, here: the config and
# its keyword overrides are static, the arrays traced.
@functools.partial(jax.jit, static_argnames=("config", *_LOSS_FIELDS))
def da3po_loss(
    logp_new: jax.Array,
    logp_old: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    config: LossConfig | None = None,
    logp_ref: jax.Array | None = None,
    normalizer: jax.Array | float | None = None,
    entropy: jax.Array | None = None,
    logits: jax.Array | None = None,
    amplified: jax.Array | None = None,
    logp_behavior: jax.Array | None = None,
    **overrides: Any,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Decoupled-clip (clip-higher) policy loss of DAPO / DA3PO, jitted.

    Per token, with m the response mask:

        d   = clamp(logp_new - logp_old, -20, 20)       (GSPO: d <- sum_t m d / sum_t m)
        rho = exp(d)
        l   = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high))
        l   = min(l, -A c)                 where A < 0 (dual clip, c = clip_ratio_c)
        l  *= min(pi_old / mu, C)          with logp_behavior = log mu and tis_cap = C > 0
        l  += kl_coef * KL                 KL = k1 = logp - ref, or
                                           k3 = clamp(exp(x) - x - 1, +-10),
                                           x = clamp(ref - logp, +-20)
        loss = sum_{b,t} m l / N                             token-mean (DAPO, default)
             = sum_b (sum_t m l / sum_t m) / B               seq-mean-token-mean (GRPO)
             = sum_{b,t} m l / B                             seq-mean-token-sum
             = sum_{b,t} m l / (B T)                         seq-mean-token-sum-norm (Dr.GRPO)

    N, B (rows with >= 1 token) and T are taken from `normalizer` when given, which should be
    `loss_normalizer(mask_of_whole_minibatch, agg)`: then the sum of the micro-batch (or
    data-parallel shard) gradients equals the full mini-batch gradient. Without it the
    normaliser of this call's `mask` is used. Rows with no valid token contribute 0; an
    empty batch gives loss 0 (not NaN).

    Departures from the papers: the dual clip (Ye et al. 2020) is on by default (c = 3) as in
    verl; DAPO itself does not mention it. GSPO's ratio is the plain masked mean of the
    (clamped) token log-ratios with its full gradient, not GSPO's stop-gradient token form
    (same value; per-token gradients are the sequence gradient spread over the tokens).
    The k3 estimate is clamped to [-10, 10] as in verl. The importance weight (truncated
    importance sampling, as verl and TRL) multiplies the clipped policy term only, not KL.

    Args:
      logp_new: `[B, T]` log-probs of the sampled tokens under the current policy.
      logp_old: `[B, T]` log-probs under the sampling (old) policy.
      advantages: `[B]` (broadcast over tokens) or `[B, T]`.
      mask: `[B, T]` response mask (1 on response tokens).
      config: `LossConfig`; keyword `overrides` (e.g. `eps_high=0.3, agg="token-mean"`)
        replace its fields.
      logp_ref: optional `[B, T]` reference log-probs (KL term, used when kl_coef > 0 or
        for the `loss/kl_ref` metric).
      normalizer: optional global normaliser (see `loss_normalizer`).
      entropy: optional `[B, T]` per-token entropy of the new policy (metric only).
      logits: optional `[B, T, V]` new-policy logits (entropy metric when `entropy` is None).
      amplified: optional `[B]` or `[B, T]` mask of DAA-amplified responses/tokens, for the
        `loss/clipfrac_high_amplified` metric.
      logp_behavior: optional `[B, T]` log-probs of the sampled tokens under the sampling
        distribution mu; with `tis_cap > 0` it turns on truncated importance sampling.
      **overrides: `LossConfig` fields.

    Returns:
      `(loss, metrics)`: scalar loss; metrics `loss/pg` (without KL), `loss/clipfrac_low`
      (A < 0, rho < 1 - eps_low), `loss/clipfrac_high` (A > 0, rho > 1 + eps_high),
      `loss/clipfrac_dual` (A < 0, rho > c), `loss/approx_kl` (k3 estimate of KL(old||new),
      mean of e^d - 1 - d with the token-level d), `loss/ratio_mean`, `loss/ratio_max`,
      `loss/num_tokens`, and when available `loss/kl_ref`, `loss/entropy`,
      `loss/clipfrac_high_amplified` (with its weight `loss/num_amplified_tokens`),
      `loss/tis_weight_mean`, `loss/tis_capped_frac`. Metrics are token means over this
      call's mask.
    """
    config = config or LossConfig()
    if overrides:
        unknown = set(overrides) - set(_LOSS_FIELDS)
        if unknown:
            raise TypeError(f"da3po_loss: unknown LossConfig fields {sorted(unknown)}")
        config = dataclasses.replace(config, **overrides)
    if normalizer is not None:
        normalizer = as_float(normalizer)
    m = (jnp.asarray(mask) > 0).astype(jnp.float32)
    m = m.astype(jnp.promote_types(m.dtype, jnp.asarray(logp_new).dtype))
    # Zero padded positions first so garbage (e.g. -inf) there cannot reach the gradient.
    clean = lambda x: jnp.where(m > 0, as_float(x), 0.0)
    logp_new, logp_old = clean(logp_new), clean(logp_old)
    adv = as_float(advantages)
    adv = clean(jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, m.shape))
    d_tok, d = _log_ratio(logp_new, logp_old, m, config)
    rho = jnp.exp(d)
    clipped = jnp.clip(rho, 1 - config.eps_low, 1 + config.eps_high)
    tok_loss = jnp.maximum(-adv * rho, -adv * clipped)
    tok_loss = jnp.where(adv < 0, jnp.minimum(tok_loss, -adv * config.clip_ratio_c), tok_loss)
    is_weights = None
    if logp_behavior is not None and config.tis_cap > 0:
        is_weights = tis_weights(logp_old, clean(logp_behavior), m, config.tis_cap)
        tok_loss = is_weights * tok_loss
    if normalizer is None:
        normalizer = loss_normalizer(m, config.agg)
    pg_loss = _aggregate(tok_loss, m, config.agg, normalizer)
    kl = None
    if logp_ref is not None:
        kl = _kl_to_ref(logp_new, clean(logp_ref), config)
        tok_loss = tok_loss + config.kl_coef * kl
    loss = _aggregate(tok_loss, m, config.agg, normalizer)
    if entropy is None and logits is not None:
        entropy = _entropy_from_logits(logits)
    metrics = _metrics(
        d_tok,
        rho,
        adv,
        m,
        config,
        pg_loss,
        kl,
        entropy,
        None if amplified is None else jnp.asarray(amplified, jnp.float32),
        is_weights,
    )
    return loss, metrics
