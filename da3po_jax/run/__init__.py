"""Run assembly: settings -> the parts of a run, the RL loop, the SFT warm start, the
teacher, held-out evaluation and a run's folder as the commands read it.

`train(config, workdir)` is the library call behind `python -m da3po_jax.main`.
"""

from da3po_jax.run.job import train

__all__ = ["train"]
