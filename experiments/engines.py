"""The default engine's learning: DA3PO on the embedded demo task through the continuous
engine (the default since it came to every config) against the static engine it
replaced, same protocol as `experiments.compare`.

  python -m experiments.engines --seeds 0 1 2 --steps 150 --eval_every 50
  python -m experiments.engines --micro --seeds 0 1 --steps 4 --eval_every 2   # smoke

Both variants start from the same SFT warm start with the same seeds and the demo's
settings (`configs/tiny_math.py`; the continuous engine with its default 64 slots). They
sample the same prompts with the same keys, but the continuous engine hands finished
groups back in another order, so dynamic sampling keeps other groups and the runs part
after the first step: the comparison is statistical (held-out avg@k, hard tier, paired
per-seed differences with 95% intervals), plus the mean wall seconds per RL step and of
its collect stage (steps after the first, which compiles).
"""

from __future__ import annotations

from experiments.compare import timed_study

VARIANTS = {
    "static": {"algo": "da3po", "rollout.engine": "static"},
    "continuous": {"algo": "da3po", "rollout.engine": "continuous", "rollout.slots": 64},
}


def main(argv=None) -> None:
    keys = ("time/step", "time/collect")
    timed_study(argv, "engines", VARIANTS, [("continuous", "static")], keys)


if __name__ == "__main__":
    main()
