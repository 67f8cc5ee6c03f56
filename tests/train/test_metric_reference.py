"""The logged metrics of a few fixed-seed RL steps, compared with values recorded by an
earlier version of the trainer (`data/metric_reference.json`): a restructuring of the
trainer must not change what the tiny runs compute.

The same float32 program rounds differently in the last bits on different CPU kinds (the
matmul kernels XLA's CPU backend picks at run time follow the CPU's vector ISA), and the
OPD returns (sums of log-prob differences, with cancellation) carry that to ~3e-6
relative. So a case passes when it matches, at the same tolerance, one of the references
recorded by that earlier trainer on some CPU kind: `metric_reference.json` (the recording
machine), `metric_reference_epyc_avx512.json` (AMD EPYC with AVX-512; recorded by the
trainer of commit 6c60e78, before the trainer was split into rollout/, update/ and run/),
`metric_reference_xeon.json` (Intel Xeon; its three cases recorded by the trainer of commit
bab6624, the one that re-recorded ra_opd on EPYC, checked out and run on that CPU),
`metric_reference_epyc_avx2.json` (AMD EPYC without AVX-512, where no other file's ra_opd
matched; its ra_opd case recorded by the trainer of commit 1b85272, checked out and run
on that CPU).
The ra_opd case of the EPYC file was re-recorded when the KV cache became heads-major
([batch, kv_heads, length, head_dim], for TPU's layout): the attention's float32 sums
changed order and the OPD returns moved by ~6e-6 relative; the ra_opd case of
`metric_reference.json` is from before that change (its CPU kind was not at hand).

The da3po_continuous case (DA3PO through the continuous engine, dynamic sampling as a
stream) was recorded, in the EPYC file only, by the trainer of commit af77d89, before
partial rollouts (`rollout.max_staleness`) were added: their default, 0, must leave the
continuous engine's runs as they were. It runs the blockwise decode attention it was
recorded with (the default became "paged" later, equal to float rounding).

The reference covers the paths that carry state or take a different route through the
step: DA3PO with the history estimator (dynamic-sampling rounds and surplus, prior EMA,
per-prompt table), tempered sampling (truncated importance sampling) and a KL term;
GRPO with micro-batches, two passes, recomputed log-probs and overlong shaping and
filtering; RA-OPD with a random teacher. Every train and eval metric is compared except
wall-clock times and the rates derived from them.

To record the reference (only when a change is *meant* to alter these numbers; say so
in the commit): `python tests/train/test_metric_reference.py [CASE ...]` (all cases, or
only those named; `--to=FILE` records into that reference file instead).
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_train_smoke import HashScorer, micro_config, read_rows  # noqa: E402

import da3po_jax.run.context as context_lib  # noqa: E402
from da3po_jax.run import train  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
REFERENCE = os.path.join(DATA, "metric_reference.json")  # what `_record` writes
REFERENCES = (REFERENCE,) + tuple(
    os.path.join(DATA, f"metric_reference_{kind}.json")
    for kind in ("epyc_avx512", "xeon", "epyc_avx2")
)
TOLERANCE = 1e-6  # absolute, and relative to the reference value's magnitude
# measured wall-clock times and rates derived from them; metrics added after the
# reference was recorded (compile counts, FLOP rates, the generated-token counts of
# `train.token_budget`, which are response/len_mean x samples/generated, both compared)
# are not compared
NOT_COMPARED = ("time/", "throughput/", "compile/", "perf/", "tokens/")

CASES = {
    "da3po_history": dict(
        algo="da3po",
        overrides={
            "daa.estimator": "history",
            "reward.incorrect": 0.0,  # the reward when it was recorded (now dapo's -1)
            "rollout.temperature": 0.8,
            "loss.train_temperature": 1.0,  # the trained policy when it was recorded
            "loss.kl_coef": 0.01,
            "train.steps": 3,
            "train.eval_every": 3,
            "train.checkpoint_every": 0,
        },
    ),
    "grpo_micro": dict(
        algo="grpo",
        overrides={
            "rl.packing": False,
            "rl.micro_batch_prompts": 1,
            "rl.num_iterations": 2,
            "rollout.logp_old": "recompute",
            "overlong.buffer": 4,
            "overlong.filter": True,
            "train.steps": 2,
            "train.eval_every": 0,
            "train.checkpoint_every": 0,
        },
    ),
    "da3po_continuous": dict(
        algo="da3po",
        overrides={
            "rollout.engine": "continuous",
            "daa.estimator": "power",  # the default DAA rule when it was recorded
            "reward.incorrect": 0.0,  # the reward when it was recorded (now dapo's -1)
            "model.decode_attention": "blockwise",  # the decode attention it was recorded with
            "rollout.slots": 8,
            "rollout.steps_per_call": 4,
            "ds.max_prompts": 12,
            "train.steps": 3,
            "train.eval_every": 3,
            "train.checkpoint_every": 0,
        },
    ),
    "ra_opd": dict(
        algo="ra_opd",
        overrides={
            "teacher.preset": "tiny-qwen2",
            "teacher.seed": 7,
            "teacher.eval": False,
            "train.steps": 2,
            "train.eval_every": 2,
            "train.checkpoint_every": 0,
        },
    ),
}


def run_case(name: str, workdir: str) -> list[dict]:
    case = CASES[name]
    train(micro_config(case["algo"], **case["overrides"]), workdir)
    rows = []
    for row in read_rows(workdir):
        kept = {k: v for k, v in row.items() if not k.startswith(NOT_COMPARED)}
        rows.append(kept)
    return rows


def mismatches(expected: list[dict], got: list[dict], name: str) -> list[str]:
    """What differs between a case's recorded rows and this run's (empty: a match)."""
    if [(r["kind"], r["step"]) for r in got] != [(r["kind"], r["step"]) for r in expected]:
        return [f"{name}: the rows (kind, step) differ"]
    out = []
    for want, have in zip(expected, got):
        where = f"{name} {want['kind']} step {want['step']}"
        if sorted(have) != sorted(want):
            out.append(f"{where}: metric names differ")
            continue
        for key, value in want.items():
            if isinstance(value, float):
                close = math.isclose(have[key], value, rel_tol=TOLERANCE, abs_tol=TOLERANCE)
            else:
                close = have[key] == value
            if not close:
                out.append(f"{where}: {key} = {have[key]!r}, reference {value!r}")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_metrics_match_the_reference(name, tmp_path, monkeypatch):
    monkeypatch.setattr(context_lib, "RewardScorer", HashScorer)
    got = run_case(name, str(tmp_path / name))
    found = {}
    for path in REFERENCES:
        with open(path) as f:
            recorded = json.load(f)
        if name in recorded:  # a case added later is recorded on the CPU kinds at hand
            found[os.path.basename(path)] = mismatches(recorded[name], got, name)
    assert found, f"{name}: recorded in none of {REFERENCES}"
    assert any(not m for m in found.values()), "\n".join(
        f"{ref}: {m[:5]}" for ref, m in found.items()
    )


def _record(names: list[str], path: str = REFERENCE) -> None:
    """Records the cases `names` (all when empty) into `path`; the others keep theirs."""
    context_lib.RewardScorer = HashScorer
    out = {}
    if names and os.path.isfile(path):
        with open(path) as f:
            out = json.load(f)
    for name in names or sorted(CASES):
        with tempfile.TemporaryDirectory() as workdir:
            out[name] = run_case(name, workdir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    print(f"wrote {path}: {sum(len(v) for v in out.values())} rows")


if __name__ == "__main__":
    args = sys.argv[1:]
    to = [a.split("=", 1)[1] for a in args if a.startswith("--to=")]
    _record([a for a in args if not a.startswith("--to=")], *to[-1:])
