"""The compile planner's programs take the arguments a real run gives them.

`compile/programs.py: run_programs` traces every jitted program of a run with abstract
arguments built from the settings (through the collector's, the engines' and the
update's own allocation functions). `ProgramRecorder` records, during a real run, the
arguments each jitted program is called with (their shapes and dtypes, leaf by leaf, as
`jit(...).trace` sees them); `check_planned_programs` then traces the planner's programs
for the same settings, model and prompt length and requires every one the run uses to
take exactly the arguments of a real call: the update and the dynamic-sampling round
(one shape for all their calls), and the engine's generate programs (the rollout's and,
when the run evaluates, the eval's of each k, among the real calls).

Runs that check it (sharing their training run): the continuous engine
(`tests/train/test_continuous_engine.py: test_da3po_trains_through_the_continuous_engine`),
the continuous engine with partial rollouts (`tests/train/test_partial_rollouts.py:
test_groups_span_versions_within_the_bound[keep-1]`) and the static engine with its eval
(`tests/train/test_train_smoke.py: test_two_step_smoke`, each algorithm).
"""

from __future__ import annotations

import jax

import da3po_jax.compile.programs as programs_lib  # bound before the patches below
import da3po_jax.rollout.collector as collector_lib
import da3po_jax.run.build as build_lib
import da3po_jax.sampling.continuous as continuous_lib
import da3po_jax.sampling.sampler as sampler_lib
from da3po_jax.config import resolve_settings
from da3po_jax.parallel import make_mesh
from da3po_jax.update import PolicyUpdate

Signature = tuple[tuple[str, tuple[int, ...], str], ...]
ENGINE_SIZES = (
    "group_size",
    "prompt_len",
    "max_new_tokens",
    "max_staleness",
    "max_in_flight",
    "return_size",
)


def signature(traced: jax.stages.Traced) -> Signature:
    """(path, shape, dtype) of every array argument of a traced program (static ones are
    not arguments), in the pytree's order."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(traced.args_info)
    return tuple((jax.tree_util.keystr(p), tuple(a.shape), str(a.dtype)) for p, a in leaves)


def _shapes(args, kwargs) -> tuple:
    """A cheap key of a call's array shapes (a new key is traced for its signature)."""
    leaves = jax.tree.leaves((args, kwargs))
    return tuple((getattr(x, "shape", None), str(getattr(x, "dtype", type(x)))) for x in leaves)


class Recorded:
    """A jitted function that records the signature of each differently shaped call."""

    def __init__(self, fn, calls: set[Signature]):
        self.fn, self.calls, self._seen = fn, calls, set()

    def __call__(self, *args, **kwargs):
        key = _shapes(args, kwargs)
        if key not in self._seen:
            self._seen.add(key)
            self.calls.add(signature(self.fn.trace(*args, **kwargs)))
        return self.fn(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.fn, name)


class ProgramRecorder:
    """Records the program calls of the runs made while it is installed (`monkeypatch`
    undoes it), with the training engine's sizes and the policy's `ModelConfig`."""

    def __init__(self, monkeypatch):
        names = ("update", "ds_round", "generate", "admit_groups", "decode_steps")
        self.calls: dict[str, set[Signature]] = {k: set() for k in names}
        self.engine_sizes: dict | None = None
        self.model_config = None
        calls, original_call = self.calls, PolicyUpdate.__call__

        def update_call(update, *args):
            if not isinstance(update.fn, Recorded):
                update.fn = Recorded(update.fn, calls["update"])
            return original_call(update, *args)

        add_finished, make_engine = collector_lib.jitted_add_finished, build_lib.make_engine

        def recorded_engine(ctx, graphdef, model_config, *args, training=False, **kwargs):
            engine = make_engine(ctx, graphdef, model_config, *args, training=training, **kwargs)
            if training:
                self.engine_sizes = {k: getattr(engine, k) for k in ENGINE_SIZES}
                self.model_config = model_config  # its vocabulary is the tokenizer's
            return engine

        monkeypatch.setattr(PolicyUpdate, "__call__", update_call)
        monkeypatch.setattr(build_lib, "make_engine", recorded_engine)
        monkeypatch.setattr(
            collector_lib,
            "jitted_add_finished",
            lambda: Recorded(add_finished(), calls["ds_round"]),
        )
        for module, name, key in (
            (sampler_lib, "generate_with_cache", "generate"),
            (continuous_lib, "admit_groups", "admit_groups"),
            (continuous_lib, "decode_steps", "decode_steps"),
        ):
            monkeypatch.setattr(module, name, Recorded(getattr(module, name), calls[key]))


def planned(config, model_config, prompt_len: int) -> tuple[dict[str, Signature], dict]:
    """(program name -> the signature the planner traces it with, the engine sizes it
    assumes) for the run of `config` with this model and prompt length, on the run's one
    device. (The planner's own `ModelConfig` of a run that builds its tokenizer assumes
    the vocabulary asked for, `tokenizer.vocab_size` rounded up, not the one trained.)"""
    settings = resolve_settings(config)
    mesh = make_mesh((1, 1, 1))
    a, programs = programs_lib.run_programs(settings, model_config, mesh, prompt_len=prompt_len)
    with programs_lib.lowering_for("cpu", mesh):
        out = {p.name: signature(p.trace()) for p in programs if p.used}
    return out, {k: getattr(a.engine, k) for k in ENGINE_SIZES}


def check_planned_programs(recorder: ProgramRecorder, config) -> None:
    """Every program the planner traces for `config`'s run takes the arguments the run's
    calls had (see the module docstring). Call it after the run, with the recorder's
    patches still installed or not."""
    sizes = recorder.engine_sizes
    assert sizes is not None, "the run built no training engine"
    plan, planned_sizes = planned(config, recorder.model_config, sizes["prompt_len"])
    assert planned_sizes == sizes
    calls = recorder.calls
    update = "update_packed" if "update_packed" in plan else "update_padded"
    static = "sampler" in plan
    generate = {"sampler"} if static else {"admit_groups", "decode_steps"}
    evals = {name for name in plan if name.startswith("eval_")}
    assert set(plan) == {update, "ds_round"} | generate | evals
    evaluates = bool(resolve_settings(config).train.eval_every)
    assert bool(evals) == evaluates, sorted(plan)
    # one shape for every call of the update and of the dynamic-sampling round
    assert calls["update"] == {plan[update]}, _diff(plan[update], calls["update"])
    assert calls["ds_round"] == {plan["ds_round"]}, _diff(plan["ds_round"], calls["ds_round"])
    # the generate programs: the rollout's and the eval's among the real calls
    real = {
        "sampler": "generate",
        "eval_generate": "generate",
        "admit_groups": "admit_groups",
        "decode_steps": "decode_steps",
        "eval_admit_groups": "admit_groups",
        "eval_decode_steps": "decode_steps",
    }
    for name in generate | evals:
        key = real[name.partition("@")[0]]
        assert plan[name] in calls[key], _diff(plan[name], calls[key])


def _diff(planned_sig: Signature, real: set[Signature]) -> str:
    """What the planner's signature has that a real call's lacks, and back."""
    if not real:
        return "the program was never called"
    a, b = set(planned_sig), set(next(iter(real)))
    return f"planned only: {sorted(a - b)}; real only: {sorted(b - a)}"
