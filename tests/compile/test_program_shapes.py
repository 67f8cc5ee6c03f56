"""The compile planner's programs take the arguments a real run gives them.

`compile/programs.py: run_programs` traces every jitted program of a run with abstract
arguments built from the settings (through the collector's, the engines' and the
update's own allocation functions). Here a real tiny run records the arguments each
jitted program is called with (their shapes and dtypes, leaf by leaf, as `jit(...).trace`
sees them), and every program the planner traces must take exactly those: the update,
the dynamic-sampling round, and the engine's generate programs, with the continuous
engine with and without partial rollouts, and with the static engine."""

from __future__ import annotations

import os
import sys

import jax
import pytest

import da3po_jax.compile.programs as programs_lib  # bound before the patches below
import da3po_jax.rollout.collector as collector_lib
import da3po_jax.run.build as build_lib
import da3po_jax.sampling.continuous as continuous_lib
import da3po_jax.sampling.sampler as sampler_lib
from da3po_jax.config import resolve_settings
from da3po_jax.parallel import make_mesh
from da3po_jax.run import train
from da3po_jax.update import PolicyUpdate

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from test_train_smoke import hash_scorer, micro_config  # noqa: E402, F401

Signature = tuple[tuple[str, tuple[int, ...], str], ...]


def signature(traced: jax.stages.Traced) -> Signature:
    """(path, shape, dtype) of every array argument of a traced program (static ones are
    not arguments), in the pytree's order."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(traced.args_info)
    return tuple((jax.tree_util.keystr(p), tuple(a.shape), str(a.dtype)) for p, a in leaves)


class Recorder:
    """A jitted function that records the signature of each call, then runs it."""

    def __init__(self, fn, calls: list[Signature]):
        self.fn, self.calls = fn, calls

    def __call__(self, *args, **kwargs):
        self.calls.append(signature(self.fn.trace(*args, **kwargs)))
        return self.fn(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.fn, name)


def run_and_record(monkeypatch, tmp_path, overrides: dict):
    """(program name -> the signatures of its calls, the training engine's sizes, the
    policy's `ModelConfig`, the config) of a run of `micro_config("da3po", **overrides)`."""
    calls: dict[str, list[Signature]] = {
        k: [] for k in ("update", "ds_round", "generate", "admit_groups", "decode_steps")
    }
    engines, model_configs = [], []

    original_call, original_init = PolicyUpdate.__call__, collector_lib.Collector.__init__

    def update_call(self, *args):
        if not isinstance(self.fn, Recorder):
            self.fn = Recorder(self.fn, calls["update"])
        return original_call(self, *args)

    def collector_init(self, engine, *args, **kwargs):
        engines.append(engine)
        original_init(self, engine, *args, **kwargs)

    add_finished, make_engine = collector_lib.jitted_add_finished, build_lib.make_engine

    def recorded_engine(ctx, graphdef, model_config, *args, **kwargs):
        model_configs.append(model_config)  # the policy's (its vocabulary is the tokenizer's)
        return make_engine(ctx, graphdef, model_config, *args, **kwargs)

    monkeypatch.setattr(build_lib, "make_engine", recorded_engine)
    monkeypatch.setattr(PolicyUpdate, "__call__", update_call)
    monkeypatch.setattr(collector_lib.Collector, "__init__", collector_init)
    monkeypatch.setattr(
        collector_lib, "jitted_add_finished", lambda: Recorder(add_finished(), calls["ds_round"])
    )
    for module, name, key in (
        (sampler_lib, "generate_with_cache", "generate"),
        (continuous_lib, "admit_groups", "admit_groups"),
        (continuous_lib, "decode_steps", "decode_steps"),
    ):
        monkeypatch.setattr(module, name, Recorder(getattr(module, name), calls[key]))
    config = micro_config("da3po", **overrides)
    train(config, str(tmp_path))
    (engine,) = engines
    sizes = {
        k: getattr(engine, k)
        for k in ("group_size", "prompt_len", "max_new_tokens", "max_staleness")
        + ("max_in_flight", "return_size")
    }
    return calls, sizes, model_configs[0], config


def planned(config, model_config, prompt_len: int) -> tuple[dict[str, Signature], dict]:
    """(program name -> the signature the planner traces it with, the engine sizes it
    assumes) for the run of `config` with this model and prompt length, on the run's one
    device. (The planner's own `ModelConfig` of a run that builds its tokenizer assumes
    the vocabulary asked for, `tokenizer.vocab_size` rounded up, not the one trained.)"""
    s = resolve_settings(config)
    mesh = make_mesh((1, 1, 1))
    a, progs = programs_lib.run_programs(s, model_config, mesh, prompt_len=prompt_len)
    with programs_lib.lowering_for("cpu", mesh):
        out = {p.name: signature(p.trace()) for p in progs if p.used}
    return out, vars(a.engine)


ONE_STEP = {"train.steps": 1, "train.eval_every": 0, "train.checkpoint_every": 0}
CASES = {
    "continuous": {"rollout.engine": "continuous", "rollout.slots": 8},
    "partial": {
        "rollout.engine": "continuous",
        "rollout.slots": 8,
        "rollout.steps_per_call": 2,
        "rollout.max_new_tokens": 24,
        "rollout.max_staleness": 1,
    },
    # with an eval (the static engine's eval program)
    "static_padded": {"rollout.engine": "static", "rl.packing": False, "train.eval_every": 1},
}


@pytest.mark.parametrize("case", list(CASES))
def test_planned_programs_take_the_arguments_of_a_real_step(
    monkeypatch,
    tmp_path,
    hash_scorer,  # noqa: F811
    case,
):
    calls, sizes, model_config, config = run_and_record(
        monkeypatch, tmp_path, {**ONE_STEP, **CASES[case]}
    )
    monkeypatch.undo()  # the planner traces the unpatched functions
    plan, planned_sizes = planned(config, model_config, sizes["prompt_len"])
    assert planned_sizes == sizes
    static = CASES[case]["rollout.engine"] == "static"
    packed = CASES[case].get("rl.packing", True)
    update = "update_packed" if packed else "update_padded"
    expected = {update, "ds_round"} | (
        {"sampler", "eval_generate"} if static else {"admit_groups", "decode_steps"}
    )
    assert set(plan) == expected
    # one shape for every call of the update and of the dynamic-sampling round
    assert set(calls["update"]) == {plan[update]}, _diff(plan[update], calls["update"])
    assert set(calls["ds_round"]) == {plan["ds_round"]}, _diff(plan["ds_round"], calls["ds_round"])
    # the generate programs: the rollout's (and the static eval's) among the real calls
    real = {
        "sampler": calls["generate"],
        "eval_generate": calls["generate"],
        "admit_groups": calls["admit_groups"],
        "decode_steps": calls["decode_steps"],
    }
    for name in expected - {update, "ds_round"}:
        assert plan[name] in set(real[name]), _diff(plan[name], real[name])


def _diff(planned_sig: Signature, real: list[Signature]) -> str:
    """What the planner's signature has that the first real call's lacks, and back."""
    if not real:
        return "the program was never called"
    a, b = set(planned_sig), set(real[0])
    return f"planned only: {sorted(a - b)}; real only: {sorted(b - a)}"
