"""Memory planner: per-device bytes of an RL run before any weights are downloaded.

    python -m da3po_jax.plan --config=configs/qwen_math.py --config.mesh.shape=1,8,1 \
        --config.model.preset=qwen2.5-math-7b --device=h100 [--num_devices=8] [--json]

Flags: `--config` (locked; dotted overrides such as `--config.mesh.shape=1,4,2`),
`--device` (a key of `DEVICE_GIB`) or `--device_gib` (>= 0; 0 = `--device`'s),
`--num_devices` (>= 1, default 8: resolves a -1 in mesh.shape; e.g. 4 for a v5p-8, 1 for
one GPU), `--prompt_len` (>= 0; 0 = the largest rollout bucket), `--usable` (in (0, 1],
default 0.9) and `--json`. They are defined only when the module runs as a script, so
importing it beside `da3po_jax.main` redefines nothing.

Model shapes come from `config.model.path`'s `config.json` when that folder exists, else
from `config.model.preset` (with a warning when a path was given but is not here yet).

`--compile=TOPOLOGY` (a TPU product: v5e-8, v5p-16, ...; `da3po_jax.compile`) compiles
every program of the run for it instead, on this machine (libtpu, no TPU), and prints the
compiled bytes per device beside this plan.

What is counted, component by component, and how `--compile` measures the same: see
docs/memory.md. In short, peak = params + optimizer + reference + teacher + batch +
gathered + max(rollout phase = kv_cache + decode_weights + rollout_work, train phase =
grads + activations + update_work); the first five, decode_weights and update_work are
exact from the sharding rules, the rest estimates.

Exit status: 0 once the plan (and with `--compile` the report) is printed; 1 on an error (a
flag out of its range, a config the run would refuse, a program that did not compile),
whose traceback is followed by one last line `da3po_jax: error: ...` naming the problem.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import sys
from typing import Any

import jax
from jax.sharding import AbstractMesh, AxisType

from da3po_jax.config import Settings, resolve_settings
from da3po_jax.models.attention import resolve_impl
from da3po_jax.models.config import ModelConfig
from da3po_jax.models.presets import abstract_model
from da3po_jax.parallel.mesh import AXES, resolve_mesh_shape
from da3po_jax.parallel.rules import spec_for
from da3po_jax.rl import ds_empty_buffer
from da3po_jax.rollout import GroupBatch
from da3po_jax.run.model_shapes import policy_config, teacher_config
from da3po_jax.sampling.sampler import cache_length
from da3po_jax.update.state import make_optimizer

log = logging.getLogger(__name__)

GiB = 1024**3

# Accelerator memory per chip (GiB): TPU v4 32, v5e 16, v5p 95, v6e (Trillium) 32,
# NVIDIA H100 SXM 80, H200 141 (nominal marketing figures).
DEVICE_GIB: dict[str, float] = {"v4": 32, "v5e": 16, "v5p": 95, "v6e": 32, "h100": 80, "h200": 141}

# The JAX backend of each device kind (which kernel `model.attention = auto` resolves to).
DEVICE_BACKEND: dict[str, str] = {"h100": "gpu", "h200": "gpu"} | {
    k: "tpu" for k in ("v4", "v5e", "v5p", "v6e")
}

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_COMPONENTS = (
    "params",
    "optimizer",
    "grads",
    "reference",
    "teacher",
    "batch",
    "gathered",
    "kv_cache",
    "decode_weights",
    "rollout_work",
    "activations",
    "update_work",
)


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Per-device bytes by component, the peak, and the verdict (see the module docstring)."""

    params: int
    optimizer: int
    grads: int
    reference: int
    teacher: int
    batch: int
    gathered: int
    kv_cache: int
    decode_weights: int
    rollout_work: int
    activations: int
    update_work: int
    peak: int
    device_bytes: int
    usable: float
    fits: bool
    info: dict[str, Any]

    @property
    def fraction(self) -> float:
        """peak / device memory."""
        return self.peak / self.device_bytes

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"fraction": self.fraction}

    def table(self) -> str:
        """A readable table: GiB per component, peak and % of the device."""
        i = self.info
        lines = [
            f"model {i['model']} ({i['num_params'] / 1e9:.2f}B params, "
            f"param_dtype={i['param_dtype']}, dtype={i['dtype']}, remat={i['remat']})",
            f"mesh (data, fsdp, tensor) = {tuple(i['mesh'])}; device {i['device']} "
            f"({self.device_bytes / GiB:.0f} GiB, usable {self.usable:.0%})",
            f"rollout rows {i['rollout_rows']} x {i['rollout_slots']} slots; eval rows "
            f"{i['eval_rows']} x {i['eval_slots']}; train micro-batch {i['micro_rows']} rows "
            f"({i['micro_rows_per_device']} per device) x {i['seq_len']} tokens",
            f"{'component':<14}{'GiB/device':>12}{'% device':>10}",
        ]
        for name in _COMPONENTS:
            b = getattr(self, name)
            lines.append(f"{name:<14}{b / GiB:>12.2f}{100 * b / self.device_bytes:>9.1f}%")
        for name in ("rollout_phase", "train_phase"):
            lines.append(f"{name.replace('_', ' '):<14}{i[name] / GiB:>12.2f}")
        lines.append(f"{'PEAK':<14}{self.peak / GiB:>12.2f}{100 * self.fraction:>9.1f}%")
        lines.append(
            f"fits: {self.fits} (peak {self.peak / GiB:.2f} GiB vs usable "
            f"{self.usable * self.device_bytes / GiB:.2f} GiB)"
        )
        return "\n".join(lines)


def abstract_mesh(shape: tuple[int, int, int]) -> AbstractMesh:
    """A (data, fsdp, tensor) mesh of `shape` without devices (for `spec_for`)."""
    return AbstractMesh(tuple(shape), AXES, axis_types=(AxisType.Auto,) * len(AXES))


def sharded_nbytes(path: Any, shape: tuple[int, ...], itemsize: int, mesh: AbstractMesh) -> int:
    """Bytes of one device's shard of the array at `path` under the sharding rules."""
    spec = spec_for(path, shape, mesh)
    dims = list(shape)
    for i, entry in enumerate(spec):
        for axis in (entry,) if isinstance(entry, str) else entry or ():
            dims[i] //= mesh.shape[axis]
    return math.prod(dims) * itemsize


def tree_nbytes(tree: Any, mesh: AbstractMesh) -> int:
    """Per-device bytes of every array leaf of `tree` (arrays or `ShapeDtypeStruct`s)."""
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    return sum(sharded_nbytes(p, x.shape, x.dtype.itemsize, mesh) for p, x in leaves)


def abstract_params(model_cfg: ModelConfig) -> Any:
    """The policy's parameter `nnx.State` as shapes only (no memory allocated)."""
    return abstract_model(model_cfg)[1]


def plan_settings(config: Any) -> Settings:
    """The settings of a recipe to plan: validated as a run's, except that the run's
    inputs (tokenizer folder, training data) need not be named yet."""
    return resolve_settings(config, inputs=False)


def _div(n: int, by: int) -> int:
    """n split over `by` devices when it divides evenly, else replicated (n)."""
    return n // by if by > 1 and n % by == 0 else n


def group_buffer_nbytes(g: int, tp: int, tn: int, capacity: int, devs: int = 1, versions=False):
    """Per-device bytes of a `DSBuffer` of `capacity` groups (`g` rows, `tp` + `tn` tokens)
    as the trainer builds it (`GroupBatch.zeros` + `ds_empty_buffer`: every field, per-token
    versions with `versions`, the valid mask, the count), split over `devs` when they divide."""
    like = lambda: GroupBatch.zeros(capacity, g, tp, tn, versions=versions)  # noqa: E731
    shapes = jax.eval_shape(lambda: ds_empty_buffer(like(), capacity))
    total = 0
    for x in jax.tree.leaves(shapes):
        nbytes = math.prod(x.shape) * x.dtype.itemsize
        total += nbytes // capacity * _div(capacity, devs) if x.ndim else nbytes
    return total


@dataclasses.dataclass(frozen=True)
class _Run:
    """The shapes the estimates read: settings, mesh, model, device, prompt length."""

    s: Settings
    mesh: AbstractMesh
    mc: ModelConfig
    device: str
    tp: int

    @functools.cached_property
    def params(self) -> Any:
        """The policy's parameters as shapes (`abstract_params`), built once per plan."""
        return abstract_params(self.mc)

    @property
    def batch_devs(self) -> int:
        return self.mesh.shape["data"] * self.mesh.shape["fsdp"]

    @property
    def cbytes(self) -> int:
        return _BYTES[self.mc.dtype]

    @property
    def heads_dev(self) -> int:
        return _div(self.mc.num_heads, self.mesh.shape["tensor"])

    @property
    def kv_dev(self) -> int:
        return _div(self.mc.num_kv_heads, self.mesh.shape["tensor"])

    @property
    def attention(self) -> str:
        """The kernel `model.attention` resolves to on this device kind."""
        backend = DEVICE_BACKEND.get(self.device, "cpu")
        return resolve_impl(self.s.model.attention, backend, self.mc.dtype, self.mc.head_dim)


def _attention_bytes(r: _Run, rows: int, seq: int) -> int:
    """Attention work of `rows` sequences of `seq` tokens: the naive path's f32 scores
    and probs [rows, heads, seq, seq]; a blockwise kernel's one block of them (x2 for the
    backward's dS, dP) and its per-query statistics; cuDNN's is blockwise too, but it
    takes the segment rule as a [rows, 1, seq, seq] bool mask that it turns into a
    compute-dtype bias (`models.attention.cudnn_arguments`), O(T^2)."""
    impl, cb = r.attention, r.cbytes
    if impl == "naive":
        return rows * r.heads_dev * seq * seq * (4 + cb)
    block = min(r.s.model.attention_block, seq)
    blockwise = rows * r.heads_dev * (2 * block * block * (4 + cb) + seq * 4 * 3)
    return blockwise + (rows * seq * seq * (1 + cb) if impl == "cudnn" else 0)


def _cache_bytes(r: _Run, prompts: int, samples: int, new_tokens: int) -> tuple[int, int, int]:
    """(KV cache, rollout work, cache slots) of a static sampler call of `prompts` x
    `samples` rows."""
    mc, cb, tp = r.mc, r.cbytes, r.tp
    rows_dev = _div(prompts, r.batch_devs) * samples
    slots = cache_length(tp, new_tokens)
    kv = 2 * mc.num_layers * rows_dev * slots * r.kv_dev * mc.head_dim * cb + rows_dev * slots
    p_dev = _div(prompts, r.batch_devs)
    small = 2 * mc.num_layers * p_dev * tp * r.kv_dev * mc.head_dim * cb
    prefill_attn = _attention_bytes(r, p_dev, tp)
    decode = rows_dev * mc.vocab_size * 4 * 3 + rows_dev * r.heads_dev * slots * (4 + cb)
    loop = rows_dev * new_tokens * 12
    return kv, small + max(prefill_attn, decode) + loop, slots


def _slot_bytes(r: _Run, samples: int, new_tokens: int) -> tuple[int, int, int]:
    """The continuous engine: S slots of ceil((Tp + N - 1) / block) blocks each (with
    `rollout.partial_kv = "keep"` kept through the update too)."""
    mc, cb, tp, ro = r.mc, r.cbytes, r.tp, r.s.rollout
    block = ro.attention_block
    rows_dev = _div(ro.slots, r.batch_devs)
    slots = -(-(tp + new_tokens - 1) // block) * block
    kv = 2 * mc.num_layers * rows_dev * slots * r.kv_dev * mc.head_dim * cb
    p_dev = max(1, ro.slots // samples)  # one admission's prompts
    small = 2 * mc.num_layers * p_dev * tp * r.kv_dev * mc.head_dim * cb
    prefill_attn = _attention_bytes(r, p_dev, tp)
    decode = rows_dev * mc.vocab_size * 4 * 3 + rows_dev * r.heads_dev * block * (4 + cb) * 2
    return kv, small + max(prefill_attn, decode) + rows_dev * new_tokens * 12, slots


def _weight_bytes(r: _Run, mesh: AbstractMesh) -> tuple[int, int]:
    """(the 2-D weights in the compute dtype, the rest in their own dtype): per-device
    bytes of the policy's parameters split as the rules place them on `mesh`. The model
    casts each 2-D weight to the compute dtype where it uses it."""
    cast = rest = 0
    for path, x in jax.tree_util.tree_leaves_with_path(r.params):
        if x.ndim >= 2:
            cast += sharded_nbytes(path, x.shape, r.cbytes, mesh)
        else:
            rest += sharded_nbytes(path, x.shape, x.dtype.itemsize, mesh)
    return cast, rest


def _decode_weights(r: _Run) -> int:
    """What a generate call holds of the weights when it reads its own gathered copy
    (`rollout.gather_weights`, `sampling.sampler.decode_weights`; more than one device):
    the weights gathered over data x fsdp (2-D ones in the compute dtype, split over
    `tensor` only), plus each device's shard cast to the compute dtype before the
    all-gather (XLA casts them all before the gathers it overlaps)."""
    if not r.s.rollout.gather_weights or r.mesh.size == 1:
        return 0
    gathered = sum(_weight_bytes(r, abstract_mesh((1, 1, r.mesh.shape["tensor"]))))
    return gathered + _weight_bytes(r, r.mesh)[0]


def _rollout_phase(r: _Run) -> dict[str, int]:
    """The larger of the rollout and eval caches with its work buffers, and the rows and
    slots of each (the continuous engine's slots serve rollout and eval alike)."""
    s = r.s
    g, tn = s.rollout.group_size, s.rollout.max_new_tokens
    eval_g, eval_tn = s.eval.num_samples, s.eval_max_new_tokens
    if s.rollout.engine == "continuous":
        roll, ev = _slot_bytes(r, g, tn), _slot_bytes(r, eval_g, eval_tn)
        rows = {"rollout_rows": s.rollout.slots, "eval_rows": s.rollout.slots}
    else:
        roll = _cache_bytes(r, s.round_size, g, tn)
        ev = _cache_bytes(r, s.eval.prompts_per_call, eval_g, eval_tn)
        rows = {"rollout_rows": s.round_size * g, "eval_rows": s.eval.prompts_per_call * eval_g}
    kv, work, _ = roll if roll[0] >= ev[0] else ev
    return {
        "kv_cache": kv,
        "decode_weights": _decode_weights(r),
        "rollout_work": work,
        "rollout_slots": roll[2],
        "eval_slots": ev[2],
    } | rows


def _train_phase(r: _Run) -> dict[str, int]:
    """Activations of one train micro-batch (packed: pack_rows x pack_length) and the
    micro-batch's shape (see the module docstring)."""
    s, mc, cb = r.s, r.mc, r.cbytes
    g, h, tn = s.rollout.group_size, mc.hidden_size, s.rollout.max_new_tokens
    mb_rows = s.rl.mini_batch_prompts * g
    if s.rl.packing:
        micro_rows, seq = s.rl.pack_rows, s.rl.pack_length or r.tp + tn
    else:
        micro_rows, seq = (s.rl.micro_batch_prompts or s.rl.mini_batch_prompts) * g, r.tp + tn
    b = _div(micro_rows, r.batch_devs)
    k_noremat = 8 + 4 * mc.intermediate_size / h
    layer_full = b * seq * h * cb * k_noremat + _attention_bytes(r, b, seq)
    if mc.remat:
        saved = mc.num_layers * b * seq * h * cb + 2 * layer_full
    else:
        saved = mc.num_layers * layer_full + layer_full
    logits_block = b * min(mc.logits_chunk, seq) * mc.vocab_size * 4 * 3
    # packed: the mini-batch's [rows, Tp + Tn] scatter indices and the [rows, Tn] f32
    # log-probs, entropies, loss terms and their gradients the loss reads back
    pack_work = 12 * _div(mb_rows, r.batch_devs) * (r.tp + tn) * 4 if s.rl.packing else 0
    activations = int(saved + logits_block + 2 * b * seq * h * 4 + pack_work)
    shape = {"micro_rows": micro_rows, "b": b, "seq": seq}
    return {"activations": activations, "update_work": _update_work(r)} | shape


def _update_work(r: _Run) -> int:
    """The update's other buffers (exact): each device's 2-D weights cast to the compute
    dtype (XLA hoists the casts out of the micro-batch loop), and under FSDP the
    unembedding's gradient whole over fsdp (each device forms the gradient of the
    gathered weight before its reduce-scatter), split over tensor."""
    mc = r.mc
    work = _weight_bytes(r, r.mesh)[0] if mc.param_dtype != mc.dtype else 0
    if r.mesh.shape["fsdp"] > 1:
        vocab = _div(mc.vocab_size, r.mesh.shape["tensor"])
        work += vocab * mc.hidden_size * _BYTES[mc.param_dtype]
    return work


def _resident(r: _Run) -> dict[str, Any]:
    """Exact bytes from the sharding rules: parameters, optimizer state, gradients, the
    reference and teacher copies; and the batch buffers and FSDP all-gathers."""
    s, mc = r.s, r.mc
    params_abs = r.params
    params = tree_nbytes(params_abs, r.mesh)
    tx, _ = make_optimizer(s.optim, max(s.train.steps, 1))
    teacher, teacher_name = 0, s.teacher.path or s.teacher.preset
    tcfg = teacher_config(s, mc)
    if tcfg is not None:
        teacher = tree_nbytes(abstract_params(tcfg), r.mesh)
    g, tn, devs = s.rollout.group_size, s.rollout.max_new_tokens, r.batch_devs
    stale = bool(s.rollout.max_staleness)
    batch = group_buffer_nbytes(g, r.tp, tn, s.rl.train_prompts, devs, stale)
    batch += group_buffer_nbytes(g, r.tp, tn, s.surplus_capacity, devs, stale)
    v_h = mc.vocab_size * mc.hidden_size
    layer_params = (mc.num_params() - v_h * (1 if mc.tie_word_embeddings else 2)) // mc.num_layers
    gathered = 2 * max(layer_params, v_h) * r.cbytes if r.mesh.shape["fsdp"] > 1 else 0
    return {
        "params": params,
        "optimizer": tree_nbytes(jax.eval_shape(tx.init, params_abs), r.mesh),
        "grads": 2 * params,
        "reference": params if s.loss.kl_coef > 0 else 0,
        "teacher": teacher,
        "teacher_name": teacher_name,
        "batch": batch,
        "gathered": gathered,
    }


def _device_bytes(device: str, device_gib: float | None) -> int:
    if device_gib is None:
        if device not in DEVICE_GIB:
            raise ValueError(f"unknown device {device!r}; known: {sorted(DEVICE_GIB)}")
        device_gib = DEVICE_GIB[device]
    return int(device_gib * GiB)


def _info(r: _Run, res: dict, roll: dict, train: dict) -> dict[str, Any]:
    """What the plan is of (model, mesh, device, engine, attention, packing) and the shapes
    it counted (rows and slots of the caches, the train micro-batch)."""
    s, mc = r.s, r.mc
    return {
        "model": s.model.path or s.model.preset,
        "num_params": mc.num_params(),
        "param_dtype": mc.param_dtype,
        "dtype": mc.dtype,
        "remat": mc.remat,
        "teacher": res["teacher_name"],
        "mesh": list(r.mesh.axis_sizes),
        "device": r.device,
        "prompt_len": r.tp,
        "engine": s.rollout.engine,
        **{k: roll[k] for k in ("rollout_rows", "rollout_slots", "eval_rows", "eval_slots")},
        "attention": r.attention,
        "packing": s.rl.packing,
        "micro_rows": train["micro_rows"],
        "micro_rows_per_device": train["b"],
        "seq_len": train["seq"],
    }


def plan_memory(
    s: Settings,
    mesh_shape: tuple[int, ...] | None = None,
    num_devices: int = 8,
    *,
    device: str = "h100",
    device_gib: float | None = None,
    prompt_len: int | None = None,
    usable: float = 0.9,
) -> MemoryPlan:
    """Plans per-device memory of the RL run of settings `s` (`plan_settings` of a
    recipe; see the module docstring for what is counted).

    Args:
      mesh_shape: (data, fsdp, tensor), -1 allowed once; default `mesh.shape`.
      num_devices: devices of the run (resolves the -1).
      device: a key of `DEVICE_GIB`; `device_gib` overrides its memory.
      prompt_len: padded prompt length; default the largest `rollout.prompt_buckets`.
      usable: fraction of the device memory the run may use.

    Raises:
      ValueError: naming `config.mesh.shape` for a bad mesh, or an unknown device.
    """
    try:
        shape = resolve_mesh_shape(s.mesh.shape if mesh_shape is None else mesh_shape, num_devices)
    except ValueError as e:
        raise ValueError(f"config.{e}") from None
    device_bytes = _device_bytes(device, device_gib)
    mc = policy_config(s)
    r = _Run(s, abstract_mesh(shape), mc, device, int(prompt_len or max(s.rollout.prompt_buckets)))
    res, roll, train = _resident(r), _rollout_phase(r), _train_phase(r)
    resident = sum(res[k] for k in ("params", "optimizer", "reference", "teacher", "batch"))
    resident += res["gathered"]
    rollout_phase = roll["kv_cache"] + roll["decode_weights"] + roll["rollout_work"]
    train_phase = res["grads"] + train["activations"] + train["update_work"]
    if s.rollout.max_staleness and s.rollout.partial_kv == "keep":  # slots kept in the update
        train_phase += _slot_bytes(r, s.rollout.group_size, s.rollout.max_new_tokens)[0]
    peak = resident + max(rollout_phase, train_phase)
    info = _info(r, res, roll, train)
    info.update(rollout_phase=rollout_phase, train_phase=train_phase)
    components = {k: res[k] for k in _COMPONENTS if k in res}
    components.update({k: roll[k] for k in ("kv_cache", "decode_weights", "rollout_work")})
    components.update(activations=train["activations"], update_work=train["update_work"])
    return MemoryPlan(
        **components,
        peak=peak,
        device_bytes=device_bytes,
        usable=usable,
        fits=peak <= usable * device_bytes,
        info=info,
    )


# ----------------------------------------------------------------------------- CLI
def _define_flags():
    from absl import flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "Path to a config file.", lock_config=True)
    flags.DEFINE_enum("device", "h100", sorted(DEVICE_GIB), "Accelerator kind (memory per chip).")
    flags.DEFINE_float("device_gib", 0.0, "Memory per device in GiB; overrides --device.")
    flags.DEFINE_integer(
        "num_devices", 8, "Devices of the run (resolves a -1 in mesh.shape); e.g. 4 on v5p-8."
    )
    flags.DEFINE_integer("prompt_len", 0, "Padded prompt length; 0 = max(rollout.prompt_buckets).")
    flags.DEFINE_float("usable", 0.9, "Fraction of device memory the run may use.")
    flags.DEFINE_bool("json", False, "Print the plan as JSON instead of a table.")
    flags.DEFINE_string(
        "compile",
        "",
        "A TPU topology (e.g. v5e-8, v5p-16): compile every program of the run "
        "for it (needs libtpu, no TPU) and report the compiled memory beside the plan.",
    )
    flags.DEFINE_list(
        "programs",
        [],
        "With --compile: these programs (default: the run's own; 'all': both update "
        "variants and both engines; names in `da3po_jax/compile/programs.py`).",
    )
    flags.mark_flags_as_required(["config"])


def check_flags(prompt_len: int, usable: float, device_gib: float, num_devices: int) -> None:
    """Checks the numeric flags of the command against their ranges.

    Raises:
      ValueError: naming the first flag out of its range, its value and the range.
    """
    ranges = (
        ("prompt_len", prompt_len, prompt_len >= 0, ">= 0 (0 = max(rollout.prompt_buckets))"),
        ("usable", usable, 0 < usable <= 1, "in (0, 1] (a fraction of the device memory)"),
        (
            "device_gib",
            device_gib,
            math.isfinite(device_gib) and device_gib >= 0,
            "a finite number >= 0 (0 = the memory of --device)",
        ),
        ("num_devices", num_devices, num_devices >= 1, ">= 1"),
    )
    for name, value, ok, allowed in ranges:
        if not ok:
            raise ValueError(f"--{name}={value}: must be {allowed}")


def main(argv: list[str]) -> None:
    """Prints the memory plan of `--config` on `--num_devices` x `--device`; ends with exit
    status 1 and a last stderr line naming the problem on any error."""
    from absl import app, flags

    from da3po_jax.runtime.signals import run_reporting_errors

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    F = flags.FLAGS

    def run() -> None:
        check_flags(F.prompt_len, F.usable, F.device_gib, F.num_devices)
        if F.compile:
            compile_main(F.config, F.compile, F.prompt_len or None, F.json, F.programs)
            return
        plan = plan_memory(
            plan_settings(F.config),
            num_devices=F.num_devices,
            device=F.device,
            device_gib=F.device_gib or None,
            prompt_len=F.prompt_len or None,
            usable=F.usable,
        )
        print(json.dumps(plan.to_dict(), indent=2) if F.json else plan.table())

    code = run_reporting_errors(run)
    if code is not None:
        sys.stdout.flush()
        sys.exit(code)


def compile_main(config: Any, name: str, prompt_len: int | None, as_json: bool, only=()) -> None:
    """`--compile`: compiles every program of the run of `config` for the TPU topology
    `name` (`da3po_jax.compile.compile_run`) and prints the report beside this plan
    (progress on stderr).

    Raises:
      RuntimeError: a program did not compile (the report names it with the compiler's
        message), or this machine cannot compile for `name` (no libtpu, too few devices).
      ValueError: an unknown topology, or a run that cannot be built.
    """
    from da3po_jax import compile as aot

    progress = functools.partial(print, file=sys.stderr, flush=True)
    topo = aot.topology(name)
    devices = aot.devices_for(topo)  # first: JAX must start on the CPU platform
    s = plan_settings(config)
    plan = plan_memory(
        s, num_devices=topo.chips, device=topo.chip.generation, prompt_len=prompt_len
    )
    mc = policy_config(s)
    args = (s, topo, devices, plan, mc, teacher_config(s, mc), progress, tuple(only))
    report = aot.compile_run(*args)
    if aot.print_report(report, as_json):
        failed = ", ".join(report["failed"])
        raise RuntimeError(f"did not compile for {name}: {failed} (see the errors above)")


if __name__ == "__main__":
    from absl import app

    _define_flags()
    app.run(main)
