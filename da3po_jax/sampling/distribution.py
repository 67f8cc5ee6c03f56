"""Sampling distributions over float32 logits: greedy, temperature, top-k, top-p.

The sampling distribution of one row of logits `x` [V] is

    mu(i) = exp(x_i / T) / sum_{j in S} exp(x_j / T)   for i in S, else 0,

where T is the temperature and S the kept set: all tokens, or the top-k tokens, and then
the nucleus (the smallest top set of the temperature-scaled, top-k-renormalised
distribution whose mass reaches top_p), in the order of Hugging Face's warpers
(temperature -> top-k -> top-p). Every kept set is "the tokens whose logit is at least a
per-row threshold", so truncation is one threshold per row. Departures from HF: tokens
tied with the threshold are all kept (HF keeps an arbitrary subset of a tie), and the
nucleus boundary is decided in float32.

Costs matter on CPU, where a pass of `exp` over [rows, vocab] costs as much as a good
fraction of the decode step and per-element random numbers are slower still:
- drawing uses the inverse CDF with one uniform per row, in two levels (block sums of
  `exp`, then a cumulative sum inside the one chosen block), so a draw is one fused `exp`
  pass and never materialises [rows, vocab] probabilities or Gumbel noise;
- greedy is a blocked argmax (XLA's variadic argmax reduce is slow on CPU);
- top-k uses `lax.top_k` (a partial sort), never a full-vocabulary sort;
- top-p looks for the nucleus among the top `candidates` logits and only when some row's
  nucleus is larger (`lax.cond`) runs an exact bisection on the probability threshold.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

TOP_P_CANDIDATES = 128  # logits searched for the nucleus before the exact fallback
_MAX_BLOCK = 256


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn from the logits (static: one compile per distinct value).

    Attributes:
      temperature: divides the logits; 0 means greedy (argmax).
      top_k: keep the k largest logits; 0 (or >= vocab) keeps all.
      top_p: keep the nucleus of this mass; 1.0 keeps all.
      policy_temperature: T' of the policy softmax(logits / T') whose log-prob `Draw.logp`
        records (the policy the trainer trains, `loss.train_temperature`).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    policy_temperature: float = 1.0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 = off)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1] (1 = off)")
        if not self.policy_temperature > 0:
            raise ValueError(f"policy_temperature={self.policy_temperature} must be > 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def uses_top_k(self, vocab: int) -> bool:
        return 0 < self.top_k < vocab

    @property
    def uses_top_p(self) -> bool:
        return self.top_p < 1.0

    def is_policy(self, vocab: int) -> bool:
        """Whether the sampling distribution is the recorded policy itself (same
        temperature, no truncation)."""
        return (
            self.temperature == self.policy_temperature
            and not self.uses_top_k(vocab)
            and not self.uses_top_p
        )


@struct.dataclass
class Draw:
    """One sampled token per row.

    Attributes:
      token: [R] int32.
      logp: [R] float32, log-prob of `token` under the policy softmax(x / T'),
        T' = `SamplingParams.policy_temperature` (1 unless the trainer tempers its policy).
      sample_logp: [R] float32, log-prob under the sampling distribution mu (0 for greedy,
        which is deterministic).
    """

    token: jax.Array
    logp: jax.Array
    sample_logp: jax.Array


# --------------------------------------------------------------------------- blocks
def _block_size(vocab: int) -> int:
    """Largest divisor of `vocab` up to 256 (128 for Qwen's 151936), so blocks need no pad."""
    return max(d for d in range(1, min(vocab, _MAX_BLOCK) + 1) if vocab % d == 0)


def _as_blocks(z: jax.Array, fill: float) -> jax.Array:
    """[R, V] -> [R, nb, bk], padding V with `fill` only when it has no usable divisor."""
    r, v = z.shape
    bk = _block_size(v)
    if bk < 16 and v > 1024:  # pathological vocabulary size: pad instead of tiny blocks
        bk = 128
        z = jnp.pad(z, ((0, 0), (0, -v % bk)), constant_values=fill)
    return z.reshape(r, -1, bk)


def _pick_block(zb: jax.Array, blk: jax.Array) -> jax.Array:
    """Row r's block blk[r]: [R, nb, bk], [R] -> [R, bk]."""
    return jnp.take_along_axis(zb, blk[:, None, None], axis=1)[:, 0]


def _last_index_where(cond: jax.Array) -> jax.Array:
    """Largest index along the last axis where `cond` holds (0 if none)."""
    iota = jax.lax.broadcasted_iota(jnp.int32, cond.shape, cond.ndim - 1)
    return jnp.max(jnp.where(cond, iota, 0), axis=-1)


def logsumexp(x: jax.Array) -> jax.Array:
    """log sum exp over the last axis (one max pass and one fused exp-sum pass)."""
    m = jnp.max(x, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    return m[..., 0] + jnp.log(jnp.sum(jnp.exp(x - m), axis=-1))


def argmax(x: jax.Array) -> jax.Array:
    """jnp.argmax(x, -1) for [R, V] (first maximum), as a blocked max + small argmaxes."""
    xb = _as_blocks(x, -jnp.inf)
    blk = jnp.argmax(jnp.max(xb, axis=-1), axis=-1).astype(jnp.int32)
    idx = jnp.argmax(_pick_block(xb, blk), axis=-1).astype(jnp.int32)
    return blk * xb.shape[-1] + idx


def inverse_cdf(z: jax.Array, u: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Draws i ~ softmax(z) per row from uniforms u in [0, 1), by the inverse CDF.

    Level 1 picks the block whose cumulative mass first exceeds u * total; level 2 does the
    same inside that block. The chosen token always has positive probability, also when
    float rounding makes the cumulative sums disagree slightly with the total (the index is
    clamped to the last positive entry).

    Args:
      z: [R, V] float32 logits, -inf for excluded tokens (at least one finite per row).
      u: [R] float32 uniforms in [0, 1).

    Returns:
      (tokens [R] int32, logsumexp(z) [R]).
    """
    m = jnp.max(z, axis=-1, keepdims=True)  # [R, 1]
    zb = _as_blocks(z, -jnp.inf)  # [R, nb, bk]
    block_mass = jnp.sum(jnp.exp(zb - m[..., None]), axis=-1)  # [R, nb]
    cum = jnp.cumsum(block_mass, axis=-1)  # [R, nb]
    total = cum[:, -1]
    target = (u * total)[:, None]  # [R, 1]
    blk = jnp.sum(cum <= target, axis=-1, dtype=jnp.int32)
    blk = jnp.minimum(blk, _last_index_where(block_mass > 0))
    before = jnp.take_along_axis(cum, jnp.maximum(blk - 1, 0)[:, None], axis=-1)
    before = jnp.where(blk[:, None] > 0, before, 0.0)
    w = jnp.exp(_pick_block(zb, blk) - m)  # [R, bk]
    idx = jnp.sum(before + jnp.cumsum(w, axis=-1) <= target, axis=-1, dtype=jnp.int32)
    idx = jnp.minimum(idx, _last_index_where(w > 0))
    return blk * zb.shape[-1] + idx, m[:, 0] + jnp.log(total)


# ----------------------------------------------------------------------- truncation
def _top_p_bisect(x: jax.Array, keep_k: jax.Array, temperature: float, top_p: float):
    """Exact nucleus threshold by bisection on the float32 bits of the probability.

    With e_i = exp(x_i / T - max) in (0, 1] and F(t) = sum_{e_i >= t} e_i (non-increasing
    in t), the nucleus boundary p_(n) is the largest t with F(t) >= top_p * F(0); positive
    floats order like their bit patterns, so 30 halvings of [0, bits(1.0)] find it exactly.
    Materialises e once; each step is a compare-and-sum pass without `exp`.
    """
    z = jnp.where(keep_k, x / temperature, -jnp.inf)
    e = jnp.exp(z - jnp.max(z, axis=-1, keepdims=True))  # [R, V]
    goal = top_p * jnp.sum(e, axis=-1)
    lo = jnp.zeros(x.shape[:1], jnp.int32)  # F(lo) >= goal
    hi = jnp.full(x.shape[:1], jax.lax.bitcast_convert_type(jnp.float32(1.0), jnp.int32) + 1)

    def halve(_, bounds):
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        t = jax.lax.bitcast_convert_type(mid, jnp.float32)[:, None]
        ok = jnp.sum(jnp.where(e >= t, e, 0.0), axis=-1) >= goal
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    lo, _ = jax.lax.fori_loop(0, 31, halve, (lo, hi))
    t = jax.lax.bitcast_convert_type(lo, jnp.float32)[:, None]
    return jnp.min(jnp.where(e >= t, x, jnp.inf), axis=-1)


def truncation_threshold(
    x: jax.Array, params: SamplingParams, candidates: int = TOP_P_CANDIDATES
) -> jax.Array | None:
    """Per-row logit threshold of the kept set (keep x >= thr), or None if nothing is cut.

    Args:
      x: [R, V] float32 logits.
      params: top-k / top-p / temperature.
      candidates: how many top logits the fast top-p path searches; rows whose nucleus is
        larger send the whole batch to the exact bisection (`lax.cond`).

    Returns:
      [R] float32 thresholds, or None.
    """
    v = x.shape[-1]
    use_k, use_p = params.uses_top_k(v), params.uses_top_p
    if not (use_k or use_p):
        return None
    k_cand = min(v, max(params.top_k if use_k else 0, candidates if use_p else 0))
    vals = jax.lax.top_k(x, k_cand)[0]  # [R, K], descending
    thr_k = vals[:, params.top_k - 1] if use_k else jnp.full(x.shape[:1], -jnp.inf)
    if not use_p:
        return thr_k
    t = params.temperature
    in_k = vals >= thr_k[:, None]
    e = jnp.where(in_k, jnp.exp((vals - vals[:, :1]) / t), 0.0)  # [R, K]
    if use_k or k_cand == v:
        mass = jnp.sum(e, axis=-1)  # the candidates hold every top-k token
    else:
        z = jnp.where(x >= thr_k[:, None], (x - vals[:, :1]) / t, -jnp.inf)
        mass = jnp.sum(jnp.exp(z), axis=-1)
    cum = jnp.cumsum(e, axis=-1)
    goal = params.top_p * mass
    n = jnp.sum(cum - e < goal[:, None], axis=-1)  # tokens with mass above them < top_p
    thr_fast = jnp.take_along_axis(vals, (n - 1)[:, None], axis=-1)[:, 0]
    thr_fast = jnp.maximum(thr_fast, thr_k)  # rounding must not reach past the top k
    covered = jnp.all(cum[:, -1] >= goal)
    return jax.lax.cond(
        covered,
        lambda: thr_fast,
        lambda: _top_p_bisect(x, x >= thr_k[:, None], t, params.top_p),
    )


def sampling_logits(x: jax.Array, params: SamplingParams) -> jax.Array:
    """The sampling distribution as logits, -inf outside the kept set: [R, V] -> [R, V].

    Materialises [R, V]; the sampler itself never calls it (tests and analysis do).
    Greedy is the point mass on the argmax.
    """
    if params.greedy:
        hot = jnp.arange(x.shape[-1]) == argmax(x)[:, None]
        return jnp.where(hot, 0.0, -jnp.inf)
    thr = truncation_threshold(x, params)
    z = x / params.temperature
    return z if thr is None else jnp.where(x >= thr[:, None], z, -jnp.inf)


def _uniforms(key: jax.Array, rows: int) -> jax.Array:
    """[rows] float32 uniforms in [0, 1) from one key or from one key per row."""
    if key.ndim == 0:
        return jax.random.uniform(key, (rows,), jnp.float32)
    return jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(key)


def draw(key: jax.Array, x: jax.Array, params: SamplingParams) -> Draw:
    """Samples one token per row of logits x [R, V] and returns both its log-probs.

    Args:
      key: one PRNG key (the R uniforms are drawn from it), or R keys, one per row (each
        row's uniform depends on its own key only, not on the other rows).
      x: [R, V] float32 logits (temperature 1).
      params: the sampling distribution.
    """
    rows, vocab = x.shape
    tp = params.policy_temperature
    xp = x if tp == 1.0 else x / tp  # the recorded policy's logits
    if params.greedy:
        token = argmax(x)
        policy_lse = logsumexp(xp)
        sample_logp = jnp.zeros((rows,), jnp.float32)
    else:
        thr = truncation_threshold(x, params)
        z = x if params.temperature == 1.0 else x / params.temperature
        if thr is not None:
            z = jnp.where(x >= thr[:, None], z, -jnp.inf)
        u = _uniforms(key, rows)
        token, sample_lse = inverse_cdf(z, u)
        z_tok = jnp.take_along_axis(z, token[:, None], axis=-1)[:, 0]
        sample_logp = z_tok - sample_lse
        policy_lse = sample_lse if params.is_policy(vocab) else logsumexp(xp)
    x_tok = jnp.take_along_axis(xp, token[:, None], axis=-1)[:, 0]
    return Draw(token=token, logp=x_tok - policy_lse, sample_logp=sample_logp)
