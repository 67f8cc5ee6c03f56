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
from da3po_jax.run.model_shapes import check_context, model_origin, policy_config, teacher_config
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
# the components a plan reports, in its table's order
_COMPONENTS = tuple(
    "params optimizer grads reference teacher batch gathered kv_cache decode_weights "
    "rollout_work activations update_work".split()
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


def abstract_params(model_config: ModelConfig) -> Any:
    """The policy's parameter `nnx.State` as shapes only (no memory allocated)."""
    return abstract_model(model_config)[1]


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

    settings: Settings
    mesh: AbstractMesh
    model_config: ModelConfig
    device: str
    tp: int

    @functools.cached_property
    def params(self) -> Any:
        """The policy's parameters as shapes (`abstract_params`), built once per plan."""
        return abstract_params(self.model_config)

    @property
    def batch_devs(self) -> int:
        return self.mesh.shape["data"] * self.mesh.shape["fsdp"]

    @property
    def cbytes(self) -> int:
        return _BYTES[self.model_config.dtype]

    @property
    def heads_dev(self) -> int:
        return _div(self.model_config.num_heads, self.mesh.shape["tensor"])

    @property
    def kv_dev(self) -> int:
        return _div(self.model_config.num_kv_heads, self.mesh.shape["tensor"])

    @property
    def kv_token_bytes(self) -> int:
        """Keys and values of one cached token of one row, every layer, per device."""
        m = self.model_config
        return 2 * m.num_layers * self.kv_dev * m.head_dim * self.cbytes

    @property
    def attention(self) -> str:
        """The kernel `model.attention` resolves to on this device kind."""
        backend = DEVICE_BACKEND.get(self.device, "cpu")
        m = self.model_config
        return resolve_impl(self.settings.model.attention, backend, m.dtype, m.head_dim)


def _attention_bytes(run: _Run, rows: int, seq: int) -> int:
    """Attention work of `rows` sequences of `seq` tokens: the naive path's f32 scores
    and probs [rows, heads, seq, seq]; a blockwise kernel's one block of them (x2 for the
    backward's dS, dP) and its per-query statistics; cuDNN's is blockwise too, but it
    takes the segment rule as a [rows, 1, seq, seq] bool mask that it turns into a
    compute-dtype bias (`models.attention.cudnn_arguments`), O(T^2)."""
    impl, cb = run.attention, run.cbytes
    if impl == "naive":
        return rows * run.heads_dev * seq * seq * (4 + cb)
    block = min(run.settings.model.attention_block, seq)
    blockwise = rows * run.heads_dev * (2 * block * block * (4 + cb) + seq * 4 * 3)
    return blockwise + (rows * seq * seq * (1 + cb) if impl == "cudnn" else 0)


def _cache_bytes(run: _Run, prompts: int, samples: int, new_tokens: int) -> tuple[int, int, int]:
    """(KV cache, rollout work, cache slots) of a static sampler call of `prompts` x
    `samples` rows."""
    cb, tp, vocab = run.cbytes, run.tp, run.model_config.vocab_size
    rows_dev = _div(prompts, run.batch_devs) * samples
    slots = cache_length(tp, new_tokens)
    kv = run.kv_token_bytes * rows_dev * slots + rows_dev * slots
    p_dev = _div(prompts, run.batch_devs)
    small = run.kv_token_bytes * p_dev * tp
    prefill_attn = _attention_bytes(run, p_dev, tp)
    decode = rows_dev * vocab * 4 * 3 + rows_dev * run.heads_dev * slots * (4 + cb)
    loop = rows_dev * new_tokens * 12
    return kv, small + max(prefill_attn, decode) + loop, slots


def _slot_bytes(run: _Run, samples: int, new_tokens: int) -> tuple[int, int, int]:
    """The continuous engine: S slots of ceil((Tp + N - 1) / block) blocks each (with
    `rollout.partial_kv = "keep"` kept through the update too)."""
    cb, tp, rollout = run.cbytes, run.tp, run.settings.rollout
    block, vocab = rollout.attention_block, run.model_config.vocab_size
    rows_dev = _div(rollout.slots, run.batch_devs)
    slots = -(-(tp + new_tokens - 1) // block) * block
    kv = run.kv_token_bytes * rows_dev * slots
    p_dev = max(1, rollout.slots // samples)  # one admission's prompts
    small = run.kv_token_bytes * p_dev * tp
    prefill_attn = _attention_bytes(run, p_dev, tp)
    decode = rows_dev * vocab * 4 * 3 + rows_dev * run.heads_dev * block * (4 + cb) * 2
    return kv, small + max(prefill_attn, decode) + rows_dev * new_tokens * 12, slots


def _weight_bytes(run: _Run, mesh: AbstractMesh) -> tuple[int, int]:
    """(the 2-D weights in the compute dtype, the rest in their own dtype): per-device
    bytes of the policy's parameters split as the rules place them on `mesh`. The model
    casts each 2-D weight to the compute dtype where it uses it."""
    cast = rest = 0
    for path, x in jax.tree_util.tree_leaves_with_path(run.params):
        if x.ndim >= 2:
            cast += sharded_nbytes(path, x.shape, run.cbytes, mesh)
        else:
            rest += sharded_nbytes(path, x.shape, x.dtype.itemsize, mesh)
    return cast, rest


def _decode_weights(run: _Run) -> int:
    """What a generate call holds of the weights when it reads its own gathered copy
    (`rollout.gather_weights`, `sampling.sampler.decode_weights`; more than one device):
    the weights gathered over data x fsdp (2-D ones in the compute dtype, split over
    `tensor` only), plus each device's shard cast to the compute dtype before the
    all-gather (XLA casts them all before the gathers it overlaps)."""
    if not run.settings.rollout.gather_weights or run.mesh.size == 1:
        return 0
    gathered = sum(_weight_bytes(run, abstract_mesh((1, 1, run.mesh.shape["tensor"]))))
    return gathered + _weight_bytes(run, run.mesh)[0]


def _rollout_phase(run: _Run) -> dict[str, int]:
    """The largest of the rollout and eval caches (one per k of `eval_sample_counts`) with
    its work buffers, and the rows and slots of each (eval: the largest k's)."""
    settings = run.settings
    rollout, per_call = settings.rollout, settings.eval.prompts_per_call
    g, tn = rollout.group_size, rollout.max_new_tokens
    eval_ks = settings.eval_sample_counts or (settings.eval.num_samples,)
    eval_tn = settings.eval_max_new_tokens
    if rollout.engine == "continuous":
        roll = _slot_bytes(run, g, tn)
        evals = [_slot_bytes(run, k, eval_tn) for k in eval_ks]
        rows = {"rollout_rows": rollout.slots, "eval_rows": rollout.slots}
    else:
        roll = _cache_bytes(run, settings.round_size, g, tn)
        evals = [_cache_bytes(run, per_call, k, eval_tn) for k in eval_ks]
        rows = {"rollout_rows": settings.round_size * g, "eval_rows": per_call * max(eval_ks)}
    ev = max(evals, key=lambda e: e[:2])
    kv, work, _ = roll if roll[0] >= ev[0] else ev
    return {
        "kv_cache": kv,
        "decode_weights": _decode_weights(run),
        "rollout_work": work,
        "rollout_slots": roll[2],
        "eval_slots": ev[2],
    } | rows


def _train_phase(run: _Run) -> dict[str, int]:
    """Activations of one train micro-batch (packed: pack_rows x pack_length) and the
    micro-batch's shape (see the module docstring)."""
    rl, model_config, cb = run.settings.rl, run.model_config, run.cbytes
    g, tn = run.settings.rollout.group_size, run.settings.rollout.max_new_tokens
    h = model_config.hidden_size
    mb_rows = rl.mini_batch_prompts * g
    if rl.packing:
        micro_rows, seq = rl.pack_rows, rl.pack_length or run.tp + tn
    else:
        micro_rows, seq = (rl.micro_batch_prompts or rl.mini_batch_prompts) * g, run.tp + tn
    b = _div(micro_rows, run.batch_devs)
    k_noremat = 8 + 4 * model_config.intermediate_size / h
    layer_full = b * seq * h * cb * k_noremat + _attention_bytes(run, b, seq)
    if model_config.remat:
        saved = model_config.num_layers * b * seq * h * cb + 2 * layer_full
    else:
        saved = model_config.num_layers * layer_full + layer_full
    logits_block = b * min(model_config.logits_chunk, seq) * model_config.vocab_size * 4 * 3
    # packed: the mini-batch's [rows, Tp + Tn] scatter indices and the [rows, Tn] f32
    # log-probs, entropies, loss terms and their gradients the loss reads back
    pack_work = 12 * _div(mb_rows, run.batch_devs) * (run.tp + tn) * 4 if rl.packing else 0
    activations = int(saved + logits_block + 2 * b * seq * h * 4 + pack_work)
    shape = {"micro_rows": micro_rows, "b": b, "seq": seq}
    return {"activations": activations, "update_work": _update_work(run)} | shape


def _update_work(run: _Run) -> int:
    """The update's other buffers (exact): each device's 2-D weights cast to the compute
    dtype (XLA hoists the casts out of the micro-batch loop), and under FSDP the
    unembedding's gradient whole over fsdp (each device forms the gradient of the
    gathered weight before its reduce-scatter), split over tensor."""
    model_config = run.model_config
    work = _weight_bytes(run, run.mesh)[0] if model_config.param_dtype != model_config.dtype else 0
    if run.mesh.shape["fsdp"] > 1:
        vocab = _div(model_config.vocab_size, run.mesh.shape["tensor"])
        work += vocab * model_config.hidden_size * _BYTES[model_config.param_dtype]
    return work


def _resident(run: _Run) -> dict[str, Any]:
    """Exact bytes from the sharding rules: parameters, optimizer state, gradients, the
    reference and teacher copies; and the batch buffers and FSDP all-gathers."""
    settings, model_config = run.settings, run.model_config
    params_abs = run.params
    params = tree_nbytes(params_abs, run.mesh)
    tx, _ = make_optimizer(settings.optim, max(settings.train.steps, 1))
    teacher, teacher_name = 0, settings.teacher.path or settings.teacher.preset
    teacher_model_config = teacher_config(settings, model_config)
    if teacher_model_config is not None:
        teacher = tree_nbytes(abstract_params(teacher_model_config), run.mesh)
    g, tn, devs = settings.rollout.group_size, settings.rollout.max_new_tokens, run.batch_devs
    stale = bool(settings.rollout.max_staleness)
    batch = group_buffer_nbytes(g, run.tp, tn, settings.rl.train_prompts, devs, stale)
    batch += group_buffer_nbytes(g, run.tp, tn, settings.surplus_capacity, devs, stale)
    v_h = model_config.vocab_size * model_config.hidden_size
    embeddings = v_h * (1 if model_config.tie_word_embeddings else 2)
    layer_params = (model_config.num_params() - embeddings) // model_config.num_layers
    gathered = 2 * max(layer_params, v_h) * run.cbytes if run.mesh.shape["fsdp"] > 1 else 0
    return {
        "params": params,
        "optimizer": tree_nbytes(jax.eval_shape(tx.init, params_abs), run.mesh),
        "grads": 2 * params,
        "reference": params if settings.loss.kl_coef > 0 else 0,
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


def _info(run: _Run, res: dict, roll: dict, train: dict) -> dict[str, Any]:
    """What the plan is of (model, mesh, device, engine, attention, packing) and the shapes
    it counted (rows and slots of the caches, the train micro-batch)."""
    settings, model_config = run.settings, run.model_config
    return {
        "model": settings.model.path or settings.model.preset,
        "num_params": model_config.num_params(),
        "param_dtype": model_config.param_dtype,
        "dtype": model_config.dtype,
        "remat": model_config.remat,
        "teacher": res["teacher_name"],
        "mesh": list(run.mesh.axis_sizes),
        "device": run.device,
        "prompt_len": run.tp,
        "engine": settings.rollout.engine,
        **{k: roll[k] for k in ("rollout_rows", "rollout_slots", "eval_rows", "eval_slots")},
        "attention": run.attention,
        "packing": settings.rl.packing,
        "micro_rows": train["micro_rows"],
        "micro_rows_per_device": train["b"],
        "seq_len": train["seq"],
    }


def plan_memory(
    settings: Settings,
    mesh_shape: tuple[int, ...] | None = None,
    num_devices: int = 8,
    *,
    device: str = "h100",
    device_gib: float | None = None,
    prompt_len: int | None = None,
    usable: float = 0.9,
) -> MemoryPlan:
    """Plans per-device memory of the RL run of `settings` (`plan_settings` of a
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
    rollout, asked = settings.rollout, settings.mesh.shape if mesh_shape is None else mesh_shape
    try:
        shape = resolve_mesh_shape(asked, num_devices)
    except ValueError as e:
        raise ValueError(f"config.{e}") from None
    device_bytes = _device_bytes(device, device_gib)
    tp = int(prompt_len or max(rollout.prompt_buckets))
    model_config = policy_config(settings)
    where = model_origin(settings.model, settings.model.path)
    check_context(settings, model_config, tp, tp, f"{where}, as planned")
    run = _Run(settings, abstract_mesh(shape), model_config, device, tp)
    res, roll, train = _resident(run), _rollout_phase(run), _train_phase(run)
    resident = sum(res[k] for k in ("params", "optimizer", "reference", "teacher", "batch"))
    resident += res["gathered"]
    rollout_phase = roll["kv_cache"] + roll["decode_weights"] + roll["rollout_work"]
    train_phase = res["grads"] + train["activations"] + train["update_work"]
    if rollout.max_staleness and rollout.partial_kv == "keep":  # slots kept in the update
        train_phase += _slot_bytes(run, rollout.group_size, rollout.max_new_tokens)[0]
    peak = resident + max(rollout_phase, train_phase)
    info = _info(run, res, roll, train)
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
    settings = plan_settings(config)
    plan = plan_memory(
        settings, num_devices=topo.chips, device=topo.chip.generation, prompt_len=prompt_len
    )
    model_config = policy_config(settings)
    teacher = teacher_config(settings, model_config)
    args = (settings, topo, devices, plan, model_config, teacher, progress, tuple(only))
    report = aot.compile_run(*args)
    if aot.print_report(report, as_json):
        failed = ", ".join(report["failed"])
        raise RuntimeError(f"did not compile for {name}: {failed} (see the errors above)")


if __name__ == "__main__":
    from absl import app

    _define_flags()
    app.run(main)
