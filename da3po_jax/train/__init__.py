"""Training: the RL loop, SFT warm start, evaluation, checkpoints, logging."""

from da3po_jax.train.config import resolve_config
from da3po_jax.train.run import train

__all__ = ["resolve_config", "train"]
