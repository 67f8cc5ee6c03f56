"""DA3PO loss on toy arrays: rewards -> advantages (+DAA) -> decoupled-clip token-level loss.

Run: python examples/da3po_loss_example.py
Uses only the pure-jnp public API of `da3po_jax` (no model, no trainer).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from da3po_jax import (
    DAAConfig,
    LossConfig,
    OverlongConfig,
    apply_overlong,
    compute_advantages,
    da3po_loss,
    ds_group_metrics,
    ds_keep_mask,
    fit_beta_prior,
    group_accuracy,
    loss_normalizer,
)


def main() -> None:
    """Builds 3 prompts x 4 responses, computes advantages with DAA and the loss."""
    group_size, seq_len = 4, 6
    correct = jnp.array([1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0], jnp.float32)  # [P * G]
    lengths = jnp.array([3, 6, 6, 5, 2, 4, 6, 3, 6, 6, 6, 6])  # tokens per response
    truncated = lengths >= seq_len
    mask = (jnp.arange(seq_len)[None] < lengths[:, None]).astype(jnp.float32)  # [B, T]

    rewards, mask = apply_overlong(
        correct, lengths, truncated, mask, OverlongConfig(max_len=seq_len, buffer=2)
    )
    keep = ds_keep_mask(correct, rewards, group_size)
    ds_metrics = {k: round(float(v), 4) for k, v in ds_group_metrics(correct, group_size).items()}
    print("kept groups:", np.asarray(keep), ds_metrics)

    acc, _, _ = group_accuracy(correct, group_size)
    prior = fit_beta_prior(acc, group_size)  # all generated groups, filtered ones included
    daa = DAAConfig(estimator="power", tau=0.5, beta=0.5, lambda_max=4.0)
    adv, adv_metrics = compute_advantages(
        rewards, correct, group_size, daa=daa, group_valid=keep, prior=prior
    )
    print("advantages:", np.round(np.asarray(adv), 3))
    print("advantage metrics:", {k: round(float(v), 4) for k, v in adv_metrics.items()})

    key_new, key_old = jax.random.split(jax.random.key(0))
    logp_old = -jnp.abs(jax.random.normal(key_old, mask.shape))
    logp_new = logp_old + 0.1 * jax.random.normal(key_new, mask.shape)
    loss_config = LossConfig(eps_low=0.2, eps_high=0.28, agg="token-mean")
    normalizer = loss_normalizer(mask, loss_config.agg)  # over the whole mini-batch
    (loss, metrics), grad = jax.value_and_grad(
        lambda lp: da3po_loss(lp, logp_old, adv, mask, config=loss_config, normalizer=normalizer),
        has_aux=True,
    )(logp_new)
    print("loss:", float(loss))
    print("loss metrics:", {k: round(float(v), 4) for k, v in metrics.items()})
    print("grad norm:", float(jnp.linalg.norm(grad)))


if __name__ == "__main__":
    main()
