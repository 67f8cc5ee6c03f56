"""Partial rollouts on the tiny task: DA3PO through the continuous engine with
`rollout.max_staleness = 1` (groups carried across steps, decoupled objective) against 0
(every step drained), same protocol as `experiments.compare`.

  python -m experiments.staleness --seeds 0 1 2 --steps 100 --eval_every 25
  python -m experiments.staleness --micro --seeds 0 1 --steps 4 --eval_every 2   # smoke

Both variants start from the same SFT warm start with the same seeds. The report is
compare's (held-out avg@k, hard tier, paired per-seed differences with 95% intervals at
equal steps and at equal generated samples) plus, per variant, the mean wall seconds per
RL step and of its collect stage (steps after the first, which compiles), and the share of
trained tokens sampled one version before the step (`stale/token_lag_1`).
"""

from __future__ import annotations

from experiments.compare import timed_study

ENGINE = {"algo": "da3po", "rollout.engine": "continuous", "rollout.slots": 64}
VARIANTS = {
    "sync": {**ENGINE, "rollout.max_staleness": 0},
    "partial": {**ENGINE, "rollout.max_staleness": 1},
}


def main(argv=None) -> None:
    keys = ("time/step", "time/collect", "stale/token_lag_1")
    timed_study(argv, "staleness", VARIANTS, [("partial", "sync")], keys)


if __name__ == "__main__":
    main()
