"""da3po_jax: JAX-native RL post-training of LLMs on verifiable-reward reasoning tasks.

The top level exports only the pure-`jnp` RL math (`da3po_loss`, `compute_advantages`,
`apply_daa`, ...), so `from da3po_jax import da3po_loss` pulls in neither the models nor
`transformers`/`torch`. Models, sampler and trainer live in their sub-packages.
"""

from da3po_jax import rl as _rl
from da3po_jax.rl import *  # noqa: F403

__version__ = "0.1.0"
__all__ = list(getattr(_rl, "__all__", []))
