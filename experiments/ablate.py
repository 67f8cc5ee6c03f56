"""Ablations of DA3PO on the tiny task, same protocol as `experiments.compare`.

  python -m experiments.ablate --quick           # 2 seeds, 60 steps
  python -m experiments.ablate --only estimators # or: caps, ds

Groups of variants (each compared with its first entry; runs named like compare's, e.g.
`dapo` and `da3po` = the default constant rule, are shared with `experiments.compare`):
- estimators: constant (factor 2), power beta 0.5 / 1 (cap 4), bayes gamma 0.5 / 1,
  history, and the control that amplifies both signs in hard groups;
- caps: power beta 0.5 with lambda_max 2, 4, 8;
- ds: DA3PO with and without dynamic sampling.
"""

from __future__ import annotations

import logging

from experiments.compare import parse, study

GROUPS = {
    "estimators": {
        "dapo": {"algo": "dapo"},
        "da3po": {"algo": "da3po"},  # the default: constant, factor 2
        "power_b0.5": {"algo": "da3po", "daa.estimator": "power"},  # beta 0.5, cap 4
        "power_b1": {"algo": "da3po", "daa.estimator": "power", "daa.beta": 1.0},
        "bayes_g0.5": {"algo": "da3po", "daa.estimator": "bayes", "daa.gamma": 0.5},
        "bayes_g1": {"algo": "da3po", "daa.estimator": "bayes", "daa.gamma": 1.0},
        "history": {"algo": "da3po", "daa.estimator": "history"},
        "both_signs": {"algo": "da3po", "daa.apply_to": "both"},
    },
    "caps": {
        "dapo": {"algo": "dapo"},
        "cap2": {"algo": "da3po", "daa.estimator": "power", "daa.lambda_max": 2.0},
        "power_b0.5": {"algo": "da3po", "daa.estimator": "power"},  # cap 4
        "cap8": {"algo": "da3po", "daa.estimator": "power", "daa.lambda_max": 8.0},
    },
    "ds": {
        "da3po": {"algo": "da3po"},  # dynamic sampling on
        "da3po_no_ds": {"algo": "da3po", "ds.enable": False},
    },
}


def main(argv=None) -> None:
    import argparse

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--only", choices=sorted(GROUPS), nargs="+", default=sorted(GROUPS))
    known, rest = extra.parse_known_args(argv)
    args = parse(rest, default_prefix="ablate")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for group in known.only:
        study(
            GROUPS[group],
            args.seeds,
            args.steps,
            args.eval_every,
            args.workdir,
            args.out,
            f"{args.prefix}_{group}",
            args.micro,
        )


if __name__ == "__main__":
    main()
