"""da3po_jax: JAX-native RL post-training of LLMs on verifiable-reward reasoning tasks.

The top level exports the pure-`jnp` RL math (`da3po_loss`, `compute_advantages`,
`apply_daa`, ...; see `da3po_jax.rl.__all__`), so `from da3po_jax import da3po_loss` pulls
in neither the models nor `transformers`/`torch`. The exports are resolved lazily (PEP 562):
importing a sub-package that needs no JAX (e.g. the reward workers' `da3po_jax.rewards`)
does not import JAX either.
"""

import importlib

__version__ = "0.1.0"


def __getattr__(name: str):
    rl = importlib.import_module("da3po_jax.rl")

    if name == "__all__":
        return list(rl.__all__)
    if name in rl.__all__:
        return getattr(rl, name)
    raise AttributeError(f"module 'da3po_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *importlib.import_module("da3po_jax.rl").__all__])
