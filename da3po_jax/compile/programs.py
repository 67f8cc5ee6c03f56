"""The jitted programs of an RL run, lowered for a mesh of devices that need not be here.

Every program is lowered through the function the trainer itself calls, with the run's
static settings and the shardings it places its arguments with; only the arguments are
abstract (`jax.ShapeDtypeStruct`s carrying a `NamedSharding`), so nothing is allocated:

- `update_packed`, `update_padded` (`rl.packing` on / off): `PolicyUpdate`, i.e. `rl_update`
  with advantages, DAA, overlong shaping, the loss, the reference / teacher forwards and
  AdamW inside;
- `ds_round`: `Collector.add_finished`, the dynamic-sampling keep mask and buffer;
- `sampler`, `eval_generate` (`rollout.engine=static`): `sampling.generate_with_cache`,
  prefill and decode loop, for a rollout round and for an eval call;
- `admit_groups`, `decode_steps` (`rollout.engine=continuous`): the continuous engine's
  admission prefill and its K decode steps; `eval_admit_groups`, `eval_decode_steps` the
  same for an evaluation, on the same `rollout.slots`.

An evaluation samples with its own `GenerateConfig` (k samples per problem, the eval
temperature, top-p and length cap), a static argument of the generate programs, so each
distinct k of the run (`Settings.eval_sample_counts`: the held-out set's and each
suite's; `eval.num_samples` when a recipe names neither) is a program of its own:
`eval_generate` etc. when the run has one k, `eval_generate@k32` etc. when it has
several; not `used` when the run never evaluates (`train.eval_every = 0`).

Both update variants and both engines are built for every run; `used` marks the run's
own, which `plan --compile` compiles unless `--programs` names others (or `all`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from da3po_jax.config import Settings
from da3po_jax.models import abstract_model
from da3po_jax.models.attention import compiling_for
from da3po_jax.models.config import ModelConfig
from da3po_jax.parallel import batch_sharding, replicated, tree_shardings
from da3po_jax.parallel.mesh import kernel_mesh
from da3po_jax.rl import init_prior_state, prior_from_state
from da3po_jax.rollout import ENGINES, GroupBatch
from da3po_jax.rollout.collector import (
    empty_pending,
    empty_surplus,
    groups_like,
    jitted_add_finished,
)
from da3po_jax.run.build import collect_config, update_config
from da3po_jax.run.inputs import generate_configs
from da3po_jax.sampling import GenerateConfig, continuous
from da3po_jax.sampling.continuous import admission_arrays
from da3po_jax.sampling.sampler import (
    cache_initializer,
    cache_shardings,
    generate_with_cache,
    prompt_keys,
)
from da3po_jax.update import PackConfig, PolicyUpdate
from da3po_jax.update.packing import empty_plan
from da3po_jax.update.state import TrainState, make_optimizer

# the programs that generate (static and continuous engines), by name before any `@k`:
# each reads its own gathered copy of the weights with `rollout.gather_weights`
# (`sampling.sampler.decode_weights`)
GENERATE_PROGRAMS = (
    "sampler",
    "eval_generate",
    "admit_groups",
    "decode_steps",
    "eval_admit_groups",
    "eval_decode_steps",
)


def generates(name: str) -> bool:
    """Whether the program `name` is one of `GENERATE_PROGRAMS` (an eval one for any k)."""
    return name.partition("@")[0] in GENERATE_PROGRAMS


@dataclasses.dataclass(frozen=True)
class Program:
    """One jitted program of the run: `trace()` traces it (lowering and compiling follow)."""

    name: str
    used: bool
    trace: Callable[[], jax.stages.Traced]
    resident: tuple[str, ...] = ()  # what of the run's resident state it takes as arguments


@dataclasses.dataclass(frozen=True)
class EngineSizes:
    """The sizes of the run's training engine (`rollout/protocol.py: RolloutEngine`),
    from its class's own functions (`max_in_flight_for`, `return_size_for`) given what
    `run/build.py: make_engine` gives it; the collector's buffer functions take it in the
    engine's place."""

    group_size: int
    prompt_len: int
    max_new_tokens: int
    max_staleness: int
    max_in_flight: int
    return_size: int

    @classmethod
    def of(cls, settings: Settings, prompt_len: int) -> EngineSizes:
        rollout = settings.rollout
        engine = ENGINES.get(rollout.engine)
        args = (settings.round_size, rollout.slots, rollout.group_size)
        return cls(
            group_size=rollout.group_size,
            prompt_len=prompt_len,
            max_new_tokens=rollout.max_new_tokens,
            max_staleness=rollout.max_staleness,
            max_in_flight=engine.max_in_flight_for(*args),
            return_size=engine.return_size_for(*args),
        )


@dataclasses.dataclass(frozen=True)
class Abstract:
    """The run's state as sharded shapes: policy, train state, frozen teacher (graphdef,
    params and config), the step's batch of groups and the dynamic-sampling surplus."""

    graphdef: Any
    params: Any
    state: TrainState
    tx: Any
    schedule: Any
    teacher: tuple[Any, Any] | None
    teacher_model_config: ModelConfig | None
    batch: GroupBatch  # batch-split, as the update takes it
    surplus: Any  # DSBuffer, replicated as the collector's carry is placed
    engine: EngineSizes


def sharded(tree: Any, shardings: Any) -> Any:
    """`tree`'s shapes (arrays or `ShapeDtypeStruct`s) carrying `shardings`."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


def replicated_shapes(tree: Any, mesh: Mesh) -> Any:
    return sharded(tree, jax.tree.map(lambda x: replicated(mesh), tree))


def batch_split(tree: Any, mesh: Mesh) -> Any:
    """Leading axis over (data, fsdp) where it divides, as `parallel.shard_batch` places."""
    return sharded(tree, jax.tree.map(lambda x: batch_sharding(mesh, x.shape), tree))


def sharded_model(model_config: ModelConfig, mesh: Mesh) -> tuple[Any, Any]:
    """(graphdef, params as sharded shapes) of a model, placed by `parallel.RULES`."""
    graphdef, params = abstract_model(model_config)
    return graphdef, sharded(params, tree_shardings(params, mesh))


def abstract_run(
    settings: Settings,
    model_config: ModelConfig,
    teacher_model_config: ModelConfig | None,
    mesh,
    prompt_len: int,
) -> Abstract:
    """The train state as `update.state.init_train_state` builds it, and the step's
    buffers as the collector does, in shapes."""
    graphdef, params = sharded_model(model_config, mesh)
    tx, schedule = make_optimizer(settings.optim, settings.train.steps, settings.updates_per_step)
    opt = jax.eval_shape(tx.init, params)
    state = TrainState(
        params=params,
        opt_state=sharded(opt, tree_shardings(opt, mesh)),
        step=jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated(mesh)),
        rng=jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated(mesh)),
    )
    teacher = (
        sharded_model(teacher_model_config, mesh) if teacher_model_config is not None else None
    )
    sizes = EngineSizes.of(settings, prompt_len)
    n = settings.rl.train_prompts  # the collector's capacity: the batch it takes from its buffer
    batch = batch_split(jax.eval_shape(lambda: groups_like(sizes, n)), mesh)
    surplus = jax.eval_shape(lambda: empty_surplus(sizes))
    return Abstract(
        graphdef,
        params,
        state,
        tx,
        schedule,
        teacher,
        teacher_model_config,
        batch,
        replicated_shapes(surplus, mesh),
        sizes,
    )


def _update_program(settings: Settings, a: Abstract, mesh, packed: bool) -> Program:
    config = update_config(settings)
    config = dataclasses.replace(
        config, pack=PackConfig(settings.rl.pack_length, settings.rl.pack_rows) if packed else None
    )
    kl = settings.loss.kl_coef > 0
    g, n = settings.rollout.group_size, settings.rl.train_prompts

    def trace():
        update = PolicyUpdate(
            a.graphdef,
            a.tx,
            a.schedule,
            config,
            state_shardings=jax.tree.map(lambda x: x.sharding, a.state),
            mesh=mesh,
            ref_params=a.params if kl else None,
            teacher=a.teacher if config.opd is not None else None,
        )
        valid = jax.ShapeDtypeStruct((n,), jnp.bool_, sharding=batch_sharding(mesh, (n,)))
        prior = None
        if collect_config(settings).use_prior:
            like = jax.eval_shape(lambda: prior_from_state(init_prior_state(), g))
            prior = replicated_shapes(like, mesh)
        plan = None
        if packed:
            plan = replicated_shapes(empty_plan(n * g), mesh)
        return update.trace(a.state, a.batch, valid, prior, plan)

    teacher = ("teacher",) if config.opd is not None else ()
    return Program(
        f"update_{'packed' if packed else 'padded'}",
        used=packed == bool(settings.rl.packing),
        trace=trace,
        resident=("params", "optimizer") + ("reference",) * kl + teacher,
    )


def _ds_program(settings: Settings, a: Abstract, mesh) -> Program:
    """`Collector.add_finished`: one batch the engine returns into the step's buffer."""
    collect = collect_config(settings)
    buffer = jax.eval_shape(lambda: empty_pending(a.engine, collect.capacity))
    items_n = a.engine.return_size
    items = batch_split(jax.eval_shape(lambda: groups_like(a.engine, items_n)), mesh)
    valid = jax.ShapeDtypeStruct((items_n,), jnp.bool_, sharding=replicated(mesh))
    rule = collect.keep
    fn = jitted_add_finished()
    buf = replicated_shapes(buffer, mesh)
    return Program("ds_round", True, lambda: fn.trace(buf, items, valid, rule=rule))


def _generate_program(
    name, a: Abstract, model_config, gen: GenerateConfig, prompts: int, tp, mesh, used
):
    tokens = jax.ShapeDtypeStruct(
        (prompts, tp), jnp.int32, sharding=batch_sharding(mesh, (prompts, tp))
    )
    mask = jax.ShapeDtypeStruct((prompts, tp), jnp.bool_, sharding=tokens.sharding)
    init = cache_initializer(model_config, (prompts, tp), gen)
    cache = sharded(jax.eval_shape(init), cache_shardings(model_config, init, tokens))
    keys = replicated_shapes(jax.eval_shape(lambda: prompt_keys(jax.random.key(0), prompts)), mesh)

    def trace():
        return generate_with_cache.trace(
            a.graphdef, a.params, cache, tokens, mask, keys, config=gen
        )

    return Program(name, used, trace, ("params",))


def _continuous_programs(
    settings: Settings,
    a: Abstract,
    model_config,
    gen: GenerateConfig,
    tp,
    mesh,
    used,
    prefix: str = "",
    suffix: str = "",
) -> list[Program]:
    """`admit_groups` and `decode_steps` on the engine's slots as `run/build.py:
    make_engine` builds it for `gen` (`rollout.slots`, whatever the samples per prompt),
    named `<prefix>admit_groups<suffix>` etc."""
    rollout = settings.rollout
    slot_config = continuous.SlotConfig(
        rollout.slots, tp, rollout.steps_per_call, rollout.attention_block
    )
    slot_config = slot_config.resolved(gen.num_samples)
    slots = continuous.slot_shapes(model_config, gen, slot_config, mesh)
    n_a, g = slot_config.admit_prompts, gen.num_samples
    rep = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt, sharding=replicated(mesh))  # noqa: E731
    keys = replicated_shapes(jax.eval_shape(lambda: prompt_keys(jax.random.key(0), n_a)), mesh)
    host = admission_arrays(slot_config, g, gen.pad_id)
    admit = (*(rep(x.shape, x.dtype) for x in host), keys)

    def trace_admit():
        return continuous.admit_groups.trace(a.graphdef, a.params, slots, *admit, gen=gen)

    def trace_decode():
        return continuous.decode_steps.trace(
            a.graphdef, a.params, slots, gen=gen, steps=slot_config.steps_per_call
        )

    return [
        Program(f"{prefix}admit_groups{suffix}", used, trace_admit, ("params",)),
        Program(f"{prefix}decode_steps{suffix}", used, trace_decode, ("params",)),
    ]


def _eval_programs(
    settings: Settings, a: Abstract, model_config, eval_gen: GenerateConfig, tp, mesh
) -> list[Program]:
    """The evaluation's generate programs, one set per distinct k (see the module doc):
    `eval_generate` (static engine: `eval.prompts_per_call` prompts per call, the planner's
    upper bound on `run/build.py: eval_engine`'s), `eval_admit_groups` and
    `eval_decode_steps` (continuous); used when the run evaluates (`train.eval_every`)."""
    static = settings.rollout.engine == "static"
    evaluates = bool(settings.train.eval_every)
    # a recipe that leaves its held-out file to the command line is planned with one
    ks = settings.eval_sample_counts or (settings.eval.num_samples,)
    programs = []
    for k in ks:
        gen = eval_gen.replace(num_samples=k)
        suffix = f"@k{k}" if len(ks) > 1 else ""
        per_call = settings.eval.prompts_per_call
        programs.append(
            _generate_program(
                f"eval_generate{suffix}",
                a,
                model_config,
                gen,
                per_call,
                tp,
                mesh,
                static and evaluates,
            )
        )
        programs += _continuous_programs(
            settings, a, model_config, gen, tp, mesh, not static and evaluates, "eval_", suffix
        )
    return programs


def run_programs(
    settings: Settings,
    model_config: ModelConfig,
    mesh: Mesh,
    *,
    prompt_len: int,
    teacher_model_config: ModelConfig | None = None,
) -> tuple[Abstract, list[Program]]:
    """Every jitted program of the run of `settings` on `mesh` (see the module doc).

    Args:
      model_config: the policy's model config with the run's runtime fields;
        `teacher_model_config` the OPD teacher's (None: no teacher).
      prompt_len: the padded prompt length (the planner's: the largest bucket).
    """
    a = abstract_run(settings, model_config, teacher_model_config, mesh, prompt_len)
    # token ids only enter as constants: two stop ids, as the chat models have
    ids = types.SimpleNamespace(eos_ids=(1, 2), pad_id=0)
    gen, eval_gen = generate_configs(settings, ids)
    static = settings.rollout.engine == "static"
    programs = [
        _update_program(settings, a, mesh, packed=True),
        _update_program(settings, a, mesh, packed=False),
        _ds_program(settings, a, mesh),
        _generate_program(
            "sampler", a, model_config, gen, settings.round_size, prompt_len, mesh, static
        ),
        *_continuous_programs(settings, a, model_config, gen, prompt_len, mesh, not static),
        *_eval_programs(settings, a, model_config, eval_gen, prompt_len, mesh),
    ]
    return a, programs


def select(programs: list[Program], names: Sequence[str]) -> list[Program]:
    """The programs named; none named: the run's own (`used`); "all": every one.

    Raises:
      ValueError: naming an unknown program and listing the known ones.
    """
    if not names:
        return [p for p in programs if p.used]
    if list(names) == ["all"]:
        return programs
    known = [p.name for p in programs]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"unknown programs {unknown}; known: {known} (or 'all')")
    return [p for p in programs if p.name in names]


@contextlib.contextmanager
def lowering_for(platform: str, mesh: Mesh) -> Iterator[None]:
    """Traces choose `platform`'s kernels, and Pallas kernels run per shard of `mesh`, as
    in the trainer (`parallel.mesh.kernel_mesh`: the abstract mesh only, so constants a
    trace computes eagerly stay on this host's CPU). A one-chip mesh is set as well, which
    the trainer does not need: on the chip itself Pallas reads the chip's kind from the
    default device, here the CPU, so the kernels must find it on the mesh."""
    one_chip = mesh.size == 1 and mesh.devices.flat[0].platform != "cpu"
    mesh_context = jax.sharding.use_abstract_mesh(mesh.abstract_mesh) if one_chip else None
    with compiling_for(platform), mesh_context or kernel_mesh(mesh):
        yield
