"""Shared helpers of the sampler tests: tiny models and an independent numpy reference of
the Hugging Face logits warpers (temperature -> top-k -> top-p)."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from da3po_jax.models import get_preset, init_model


def tiny_model(seed: int = 0, **overrides):
    """tiny-qwen2 with every parameter drawn as in `conftest.randomize_` (weights and
    biases 0.08 * N(0, 1), norm scales 1 + 0.2 * N(0, 1)), so greedy paths vary from step
    to step (the default 0.02-std init makes a 2-layer model repeat one token)."""
    cfg = get_preset("tiny-qwen2", **overrides)
    graphdef, state = nnx.split(init_model(cfg, seed))
    leaves, treedef = jax.tree.flatten_with_path(state)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    new = []
    for (path, x), key in zip(leaves, keys):
        noise = jax.random.normal(key, x.shape, x.dtype)
        is_norm = "norm" in jax.tree_util.keystr(path)
        new.append(1.0 + 0.2 * noise if is_norm else 0.08 * noise)
    state = jax.tree.unflatten(treedef, new)
    return cfg, graphdef, state, nnx.merge(graphdef, state)


def ref_log_probs(x: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0):
    """log mu over the last axis, float64, by sorting (as `transformers`' warpers do).

    Ties at the threshold are kept, matching the sampler's documented convention.
    """
    z = np.asarray(x, np.float64).reshape(-1, np.shape(x)[-1]) / temperature
    out = np.empty_like(z)
    for r, row in enumerate(z):
        keep = np.ones(row.shape, bool)
        if 0 < top_k < row.size:
            keep &= row >= np.sort(row)[::-1][top_k - 1]
        if top_p < 1.0:
            kept = np.where(keep, row, -np.inf)
            p = np.exp(kept - kept.max())
            p /= p.sum()
            order = np.argsort(-p, kind="stable")
            above = np.cumsum(p[order]) - p[order]  # mass strictly before each token
            n = int(np.sum(above < top_p))
            keep &= p >= p[order][n - 1]
        kept = np.where(keep, row, -np.inf)
        m = kept.max()
        out[r] = kept - (m + np.log(np.sum(np.exp(kept - m))))
    return out.reshape(np.shape(x))


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), -1, keepdims=True))


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom over the tokens with probability above
    1e-12 (the rest must have zero counts, checked by the caller); bins expecting fewer
    than 5 draws are pooled into one, as the chi-square approximation needs."""
    support = probs > 1e-12
    expected = counts.sum() * probs[support] / probs[support].sum()
    observed = counts[support].astype(np.float64)
    small = expected < 5
    if small.any():
        expected = np.append(expected[~small], expected[small].sum())
        observed = np.append(observed[~small], observed[small].sum())
    stat = float(np.sum((observed - expected) ** 2 / expected))
    return stat, len(expected) - 1
