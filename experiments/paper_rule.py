"""DA3PO's new default (the paper's rule: a constant lambda = 2 on hard groups, with
DAPO's +1 / -1 reward) against the old default (the `power` rule, 1 / 0 reward) on the
embedded demo task, same protocol as `experiments.compare`.

  python -m experiments.paper_rule --seeds 0 1 2 --steps 150 --eval_every 50
  python -m experiments.paper_rule --micro --seeds 0 1 --steps 4 --eval_every 2   # smoke

Both variants start from the same SFT warm start with the same seeds and the demo's
settings (`configs/tiny_math.py`): held-out avg@k (all and hard tier) at equal steps,
paired per-seed differences with 95% intervals.
"""

from __future__ import annotations

from experiments.compare import parse, run_study

VARIANTS = {
    "da3po_power": {"algo": "da3po", "daa.estimator": "power", "reward.incorrect": 0.0},
    "da3po_constant": {"algo": "da3po"},  # the defaults: constant, factor 2, +1 / -1
}


def main(argv=None) -> None:
    args = parse(argv, default_prefix="paper_rule")
    run_study(args, VARIANTS, [("da3po_constant", "da3po_power")])


if __name__ == "__main__":
    main()
