"""Compiling a run's programs for a topology and reading what the compiler says.

Per program (`programs.run_programs`): compile seconds, and from the compiled executable
per device the argument, output, temp, generated-code and alias bytes
(`memory_analysis()`) and the FLOPs and bytes accessed (`cost_analysis()`; XLA counts the
body of a loop once, whatever its trip count, so for the layer scan, the micro-batch scan
and the decode loop these are per iteration, not per call).

For the run (per device):

- a program's peak = its arguments + its outputs not aliased to a donated argument + its
  temp + its generated code; while it runs the rest of the run's resident state (params,
  optimizer state, reference and teacher copies, the dynamic-sampling buffers) is alive
  beside it, so the run's compiled peak = the largest over the run's own programs of
  (program peak + the resident state it does not take as arguments);
- beside it the planner's estimate (`da3po_jax.plan`), component by component: resident,
  train phase (the update's temp and outputs: gradients, activations, gathered layers)
  and rollout phase (the KV cache and the sampler's work);
- a roofline time per step, a lower bound for a step whose every response runs to the
  length cap: the update's model FLOPs (`runtime.perf.update_flops`, all rows at full
  length) / the chip's peak FLOP/s, plus the decode steps of the step's rounds (every
  decode step reads each device's share of the compute-dtype weights and of the KV
  cache) / its HBM bandwidth;
- an estimate of the same step at stated efficiencies (`step_estimate`): the update at
  `ASSUMED_MFU` of the peak FLOP/s, the decode at `ASSUMED_HBM_EFFICIENCY` of the HBM
  bandwidth. Both are assumptions, not measurements: no run has happened on a TPU or GPU.
  The compiled programs' own FLOPs and bytes (`programs.*.flops`, `bytes_accessed`) are
  not used: XLA's cost analysis counts a loop's body once, so a program whose layers run
  under `lax.scan` (or whose decode steps run in a loop) reports one iteration's cost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

from da3po_jax.compile.programs import (
    Abstract,
    Program,
    generates,
    lowering_for,
    run_programs,
    select,
)
from da3po_jax.compile.topology import Topology
from da3po_jax.config import Settings
from da3po_jax.models.config import ModelConfig
from da3po_jax.parallel.mesh import batch_size_divisor, make_mesh
from da3po_jax.run.build import padded_update_flops, update_config
from da3po_jax.update.policy_update import frozen_forwards

GiB = 1024**3
# The efficiencies of the step estimate (assumed; see the module docstring): model FLOPs
# utilisation of the update, and the fraction of the HBM bandwidth the decode reaches.
ASSUMED_MFU = 0.4
ASSUMED_HBM_EFFICIENCY = 0.6
_MEMORY_KEYS = ("argument_bytes", "output_bytes", "temp_bytes", "generated_code_bytes")


@dataclasses.dataclass
class Compiled:
    """What the compiler reports for one program (per device); `error` when it failed."""

    name: str
    used: bool
    resident: tuple[str, ...]
    error: str = ""
    argument_bytes: int = 0
    output_bytes: int = 0
    temp_bytes: int = 0
    generated_code_bytes: int = 0
    alias_bytes: int = 0
    flops: float = 0.0
    bytes_accessed: float = 0.0
    compile_s: float = 0.0
    full_remats: int = 0  # XLA's "involuntary full rematerialization" warnings
    all_gathers: int = 0  # all-gather ops in the optimized HLO
    largest_all_gather_bytes: int = 0
    largest_param_gather_bytes: int = 0  # of the results shaped like a parameter
    kernels: int = 0  # Pallas (Mosaic) kernel calls in the optimized HLO

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def peak_bytes(self) -> int:
        """Arguments + outputs not aliased + temp + generated code."""
        outputs = max(0, self.output_bytes - self.alias_bytes)
        return self.argument_bytes + outputs + self.temp_bytes + self.generated_code_bytes

    def to_dict(self) -> dict[str, Any]:
        """The JSON of one program: every field but the name and the resident names, the
        peak, and `error` only when it failed."""
        out = dataclasses.asdict(self) | {"peak_bytes": self.peak_bytes}
        for key in ("name", "resident") + (() if self.error else ("error",)):
            del out[key]
        return out


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """Collects what the compiler's C++ logging writes to file descriptor 2 meanwhile
    (XLA reports e.g. involuntary full rematerialization there, not as an exception)."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode(errors="replace").splitlines())


def all_gathers(hlo: str, param_shapes: frozenset = frozenset()) -> list[tuple[int, int]]:
    """(bytes, parameter bytes) of the result of every all-gather in optimized HLO text (a
    combined all-gather's tuple counts as one); parameter bytes are those of the results
    shaped like a parameter (`param_shapes`: tuples of dims), the rest are activations."""
    out = []
    for m in _ALL_GATHER.finditer(hlo):
        shapes = _SHAPE.findall(m.group(1))
        # an async start's result is (operands, results): count the results
        shapes = shapes[len(shapes) // 2 :] if m.group(2) else shapes
        sizes = [(_shape_bytes(d, dims), _dims(dims) in param_shapes) for d, dims in shapes]
        out.append((sum(b for b, _ in sizes), sum(b for b, is_param in sizes if is_param)))
    return out


def _dims(dims: str) -> tuple[int, ...]:
    return tuple(int(d) for d in dims.split(",") if d)


_ALL_GATHER = re.compile(r"= (\(?[^=]*?\)?) all-gather(-start)?\(")
_SHAPE = re.compile(r"\b(pred|s8|u8|s16|u16|bf16|f16|s32|u32|f32|s64|u64|f64)\[([\d,]*)\]")
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2}


def _shape_bytes(dtype: str, dims: str) -> int:
    return math.prod(_dims(dims)) * _ITEMSIZE.get(dtype, 8 if dtype.endswith("64") else 4)


def compile_program(
    p: Program,
    platform: str,
    mesh,
    *,
    lower_only: bool = False,
    param_shapes: frozenset = frozenset(),
) -> Compiled:
    """Traces, lowers and compiles `p` for `platform` ("tpu": on a topology's devices;
    `lower_only`: traced and lowered for `platform` on this host's devices, e.g. "cuda",
    where no compile is possible without the device); a failure is kept as the compiler's
    message."""
    out = Compiled(p.name, p.used, p.resident)
    t0 = time.perf_counter()
    try:
        with lowering_for(platform, mesh):
            traced = p.trace()
        if lower_only:
            traced.lower(lowering_platforms=(platform,))
            return out
        lowered = traced.lower()
        with _captured_stderr() as log:
            exe = lowered.compile()
    except Exception as e:  # noqa: BLE001 - every compiler error is reported, not raised
        out.error = f"{type(e).__name__}: {e}"
        return out
    finally:
        out.compile_s = time.perf_counter() - t0
    out.full_remats = sum("nvoluntary full rematerialization" in line for line in log)
    hlo = exe.as_text()
    out.kernels = hlo.count('custom_call_target="tpu_custom_call"')
    gathers = all_gathers(hlo, param_shapes)
    out.all_gathers = len(gathers)
    out.largest_all_gather_bytes = max((b for b, _ in gathers), default=0)
    out.largest_param_gather_bytes = max((b for _, b in gathers), default=0)
    m = exe.memory_analysis()
    out.argument_bytes = int(m.argument_size_in_bytes)
    out.output_bytes = int(m.output_size_in_bytes)
    out.temp_bytes = int(m.temp_size_in_bytes)
    out.generated_code_bytes = int(m.generated_code_size_in_bytes)
    out.alias_bytes = int(m.alias_size_in_bytes)
    cost = exe.cost_analysis() or {}
    out.flops = float(cost.get("flops", 0.0))
    out.bytes_accessed = float(cost.get("bytes accessed", 0.0))
    return out


def compile_all(
    programs: list[Program],
    platform: str,
    mesh,
    progress: Callable[[str], None] = print,
    *,
    lower_only: bool = False,
    param_shapes: frozenset = frozenset(),
) -> list[Compiled]:
    """Compiles (or only lowers) every program in turn, reporting each as it starts and
    ends."""
    results = []
    verb = "lowering" if lower_only else "compiling"
    for i, p in enumerate(programs, 1):
        progress(f"[{i}/{len(programs)}] {verb} {p.name} ...")
        c = compile_program(p, platform, mesh, lower_only=lower_only, param_shapes=param_shapes)
        status = f"FAILED: {c.error.splitlines()[0][:300]}" if c.error else "ok"
        progress(f"[{i}/{len(programs)}] {p.name}: {status} ({c.compile_s:.1f} s)")
        results.append(c)
    return results


def parameter_shapes(*trees: Any) -> frozenset:
    """The shapes an all-gather of a parameter can have: every parameter's, and with
    stacked (scanned) layers one layer's slice of it."""
    shapes = set()
    for tree in trees:
        for x in jax.tree.leaves(tree):
            shapes.add(tuple(x.shape))
            shapes.add(tuple(x.shape[1:]))
    return frozenset(s for s in shapes if len(s) >= 2)


def device_bytes(tree: Any) -> int:
    """Bytes one device holds of `tree`'s sharded `ShapeDtypeStruct`s (the largest shard)."""
    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += math.prod(shape) * x.dtype.itemsize
    return total


def resident_bytes(settings: Settings, a: Abstract) -> dict[str, int]:
    """Per-device bytes of the state alive across the whole step, by name (what
    `Program.resident` names): the params, the optimizer state, the reference and teacher
    copies, the step's batch and the dynamic-sampling surplus."""
    params = device_bytes(a.params)
    return {
        "params": params,
        "optimizer": device_bytes(a.state.opt_state),
        "reference": params if settings.loss.kl_coef > 0 else 0,
        "teacher": device_bytes(a.teacher[1]) if a.teacher is not None else 0,
        "batch": device_bytes(a.batch),
        "surplus": device_bytes(a.surplus),
    }


def roofline(
    settings: Settings, a: Abstract, model_config: ModelConfig, topo: Topology, mesh
) -> dict[str, float]:
    """A lower bound on one step's seconds (see the module docstring)."""
    chip = topo.chip
    seq = max(settings.rollout.prompt_buckets) + settings.rollout.max_new_tokens
    forwards = frozen_forwards(update_config(settings), reference=settings.loss.kl_coef > 0)
    flops = padded_update_flops(settings, model_config, a.teacher_model_config, seq, forwards)
    update_s = flops / topo.chips / (chip.peak_tflops * 1e12)
    tensor, cbytes = mesh.shape["tensor"], jnp.dtype(model_config.dtype).itemsize
    weights = model_config.num_params() * cbytes / tensor
    rounds = max(1, math.ceil(settings.rl.train_prompts / max(settings.round_size, 1)))
    kv_per_token = (
        2
        * model_config.num_layers
        * model_config.num_kv_heads
        * model_config.head_dim
        * cbytes
        / tensor
    )
    rows_dev = max(1, settings.round_size * settings.rollout.group_size // batch_size_divisor(mesh))
    ctx = max(settings.rollout.prompt_buckets) + settings.rollout.max_new_tokens / 2  # mean context
    step_bytes = weights + rows_dev * ctx * kv_per_token
    decode_s = rounds * settings.rollout.max_new_tokens * step_bytes / (chip.hbm_gbs * 1e9)
    return {
        "update_s": update_s,
        "rollout_s": decode_s,
        "step_s": update_s + decode_s,
        "update_flops": flops,
    }


def step_estimate(
    roof: dict[str, float], mfu: float = ASSUMED_MFU, hbm: float = ASSUMED_HBM_EFFICIENCY
) -> dict[str, Any]:
    """The roofline's step at stated efficiencies: the update at `mfu` of the peak FLOP/s,
    the decode at `hbm` of the HBM bandwidth (every response at the length cap, as the
    roofline)."""
    if not (0 < mfu <= 1 and 0 < hbm <= 1):
        raise ValueError(f"efficiencies must be in (0, 1]: mfu={mfu}, hbm={hbm}")
    update_s, rollout_s = roof["update_s"] / mfu, roof["rollout_s"] / hbm
    return {
        "update_s": update_s,
        "rollout_s": rollout_s,
        "step_s": update_s + rollout_s,
        "mfu": mfu,
        "hbm_efficiency": hbm,
        "label": f"estimate at {mfu:.0%} MFU and {hbm:.0%} of HBM bandwidth (assumed)",
    }


def one_layer_bytes(model_config: ModelConfig) -> int:
    """The largest all-gather an FSDP program needs: one decoder layer's parameters or the
    (un)embedding, in the parameter dtype (what `plan`'s `gathered` assumes)."""
    v_h = model_config.vocab_size * model_config.hidden_size
    layer = (
        model_config.num_params() - v_h * (1 if model_config.tie_word_embeddings else 2)
    ) // model_config.num_layers
    return max(layer, v_h) * (4 if model_config.param_dtype == "float32" else 2)


def run_peak(compiled: list[Compiled], resident: dict[str, int]) -> tuple[int, str]:
    """(the run's compiled peak per device, the program that sets it)."""
    best, name = 0, ""
    for c in compiled:
        if not (c.used and c.ok):
            continue
        others = sum(v for k, v in resident.items() if k not in c.resident)
        if c.peak_bytes + others > best:
            best, name = c.peak_bytes + others, c.name
    return best, name


def _components(
    settings: Settings, compiled, resident, plan, lowered_only
) -> dict[str, dict[str, Any]]:
    """Compiled beside planned bytes: resident state, train phase and rollout phase."""
    by_name = {c.name: c for c in compiled if c.ok and not lowered_only}
    update = by_name.get("update_packed" if settings.rl.packing else "update_padded")
    # the run's own generate programs, rollout and eval (every k)
    gens = [c for c in by_name.values() if c.used and generates(c.name)]
    compiled_rollout = max((c.peak_bytes - resident["params"] for c in gens), default=None)
    compiled_train = None
    if update is not None:
        compiled_train = update.temp_bytes + max(0, update.output_bytes - update.alias_bytes)
    planned_resident = ("params", "optimizer", "reference", "teacher", "batch")
    components = {
        "resident": {
            "compiled": sum(resident.values()),
            "planned": sum(getattr(plan, k) for k in planned_resident),
        },
        "train_phase": {
            "compiled": compiled_train,
            "planned": plan.grads + plan.activations + plan.update_work + plan.gathered,
        },
        "rollout_phase": {
            "compiled": compiled_rollout,
            "planned": plan.kv_cache + plan.decode_weights + plan.rollout_work,
        },
    }
    return components


def _checks(compiled: list[Compiled], bound: int, whole_model_ok: bool) -> dict[str, Any]:
    """Involuntary full rematerializations and parameter all-gathers larger than one layer
    (in the generate programs too unless they gather the whole model by design,
    `programs.GENERATE_PROGRAMS` with `rollout.gather_weights`)."""
    checks = {
        "full_remats": {c.name: c.full_remats for c in compiled if c.full_remats},
        "one_layer_bytes": bound,
        # all-gathers of activations (e.g. a batch axis gathered to slice it) are not
        # parameter gathers, but a gathered batch is as large: listed, not flagged
        "largest_gather_bytes": {c.name: c.largest_all_gather_bytes for c in compiled},
        "gathers_beyond_one_layer": [
            c.name
            for c in compiled
            if c.largest_param_gather_bytes > bound and not (whole_model_ok and generates(c.name))
        ],
    }
    return checks


def summary(
    settings: Settings,
    model_config: ModelConfig,
    topo: Topology,
    mesh,
    a: Abstract,
    compiled: list[Compiled],
    plan: Any,
) -> dict[str, Any]:
    """The command's JSON: per-program stats, the compiled and planned peaks side by side,
    the chip's HBM, `fits` and the roofline."""
    resident = resident_bytes(settings, a)
    peak, by = run_peak(compiled, resident)
    planned = plan.peak
    lowered_only = topo.platform != "tpu"  # nothing compiled, nothing measured
    components = _components(settings, compiled, resident, plan, lowered_only)
    device = topo.chip.hbm_gib * GiB
    checks = _checks(compiled, one_layer_bytes(model_config), settings.rollout.gather_weights)
    roof = roofline(settings, a, model_config, topo, mesh)
    return {
        "topology": topo.name,
        "describe": topo.describe(),
        "jax": jax.__version__,
        "mesh": list(mesh.axis_sizes),
        "attention": plan.info.get("attention"),
        "programs": {c.name: c.to_dict() for c in compiled},
        "failed": [c.name for c in compiled if not c.ok],
        "resident_bytes": resident,
        "components": components,
        "peak_program": by,
        "compiled": not lowered_only,
        "compiled_peak_gib": None if lowered_only else peak / GiB,
        "planned_peak_gib": planned / GiB,
        "planned_vs_compiled": planned / peak - 1 if peak and not lowered_only else None,
        "device_gib": topo.chip.hbm_gib,
        "fits": None
        if lowered_only
        else bool(peak) and peak <= device and not any(not c.ok for c in compiled if c.used),
        "roofline": roof | {"label": "lower bound"},
        "estimate": step_estimate(roof),
        "checks": checks,
    }


def compile_run(
    settings: Settings,
    topo: Topology,
    devices: Any,
    plan: Any,
    model_config: ModelConfig,
    teacher_model_config: ModelConfig | None = None,
    progress: Callable[[str], None] = print,
    only: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Builds the run's programs on the topology's `devices` with the mesh and prompt
    length of `plan` (`da3po_jax.plan.plan_memory` for the topology), compiles them (or
    only lowers them for a GPU), and returns the report (`summary`). `only`: just these
    programs (the peak is then over those)."""
    mesh = make_mesh(tuple(plan.info["mesh"]), devices)
    progress(
        f"{topo.describe()}; mesh {tuple(mesh.axis_sizes)}; attention {plan.info['attention']}"
    )
    a, programs = run_programs(
        settings,
        model_config,
        mesh,
        prompt_len=plan.info["prompt_len"],
        teacher_model_config=teacher_model_config,
    )
    programs = select(programs, only)
    shapes = parameter_shapes(a.params, a.teacher[1] if a.teacher else None)
    compiled = compile_all(
        programs,
        topo.platform,
        mesh,
        progress,
        lower_only=topo.platform == "cuda",
        param_shapes=shapes,
    )
    return summary(settings, model_config, topo, mesh, a, compiled, plan)


def table(report: dict[str, Any]) -> str:
    """The report as readable text."""
    lines = [report["describe"], f"mesh (data, fsdp, tensor) = {tuple(report['mesh'])}"]
    head = f"{'program':<24}{'used':>5}{'compile s':>10}{'args':>9}{'out':>9}{'temp':>9}"
    lines += [head + f"{'code':>8}{'alias':>9}{'GFLOP':>10}{'GB acc':>9}  (GiB per device)"]
    for name, p in report["programs"].items():
        used = "*" if p["used"] else ""
        if "error" in p:
            lines.append(f"{name:<24}{used:>5}  FAILED: {p['error'][:200]}")
            continue
        if not report["compiled"]:
            lines.append(f"{name:<24}{used:>5}{p['compile_s']:>10.1f}  lowered")
            continue
        gib = [p[k] / GiB for k in (*_MEMORY_KEYS, "alias_bytes")]
        lines.append(
            f"{name:<24}{used:>5}{p['compile_s']:>10.1f}{gib[0]:>9.2f}{gib[1]:>9.2f}"
            f"{gib[2]:>9.2f}{gib[3]:>8.3f}{gib[4]:>9.2f}{p['flops'] / 1e9:>10.1f}"
            f"{p['bytes_accessed'] / 1e9:>9.2f}"
        )
    lines.append(f"{'component':<16}{'compiled GiB':>14}{'planned GiB':>13}")
    for name, c in report["components"].items():
        got = "-" if c["compiled"] is None else f"{c['compiled'] / GiB:.2f}"
        lines.append(f"{name:<16}{got:>14}{c['planned'] / GiB:>13.2f}")
    r = report["roofline"]
    if report["compiled"]:
        peak = (
            f"compiled peak {report['compiled_peak_gib']:.2f} GiB/device ({report['peak_program']})"
        )
    else:
        peak = "lowered for the GPU only, nothing compiled (see da3po_jax/compile/topology.py)"
    lines += [
        f"{peak}, planned {report['planned_peak_gib']:.2f} GiB, chip {report['device_gib']:g} "
        f"GiB: fits={report['fits']}",
        f"roofline (lower bound): {r['step_s']:.3f} s/step (update {r['update_s']:.3f} s, "
        f"rollout decode {r['rollout_s']:.3f} s)",
    ]
    e = report.get("estimate")
    if e:
        lines.append(
            f"{e['label']}: {e['step_s']:.3f} s/step (update {e['update_s']:.3f} s, rollout "
            f"decode {e['rollout_s']:.3f} s); every response at the length cap"
        )
    c = report["checks"]
    if c["full_remats"] or c["gathers_beyond_one_layer"]:
        lines.append(
            f"WARNING: involuntary full rematerialization in {c['full_remats'] or 'none'}; "
            f"all-gathers beyond one layer in {c['gathers_beyond_one_layer'] or 'none'}"
        )
    if report["failed"]:
        lines.append(f"FAILED to compile: {', '.join(report['failed'])}")
    return "\n".join(lines)


def print_report(report: dict[str, Any], as_json: bool) -> int:
    """Prints the report (JSON or the table) and each failed program's compiler message
    on stderr; returns the exit status: 1 when a program did not compile."""
    print(json.dumps(report, indent=2) if as_json else table(report))
    for name in report["failed"]:
        print(
            f"error: {name} did not compile: {report['programs'][name]['error']}", file=sys.stderr
        )
    return 1 if report["failed"] else 0
