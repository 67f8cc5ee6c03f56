"""Hugging Face checkpoints in and out.

`load_model` reads `config.json` and `model.safetensors` (or a sharded
`model.safetensors.index.json`) one tensor at a time into an NNX `Transformer` whose
parameters were only shape-evaluated (`nnx.eval_shape`), so the model is never built
twice; with `sharding`, each tensor goes straight into its sharded layout
(`jax.make_array_from_callback` hands every device only its own slice).

`save_model` writes the inverse: `config.json`, sharded safetensors with an index, and the
tokenizer files, into a temporary folder renamed into place at the end (atomic).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from flax import nnx

from da3po_jax.models.config import ModelConfig
from da3po_jax.models.safetensors_io import SafetensorsFile, save_safetensors
from da3po_jax.models.transformer import Transformer

Path = tuple[Any, ...]
# A sharding for each parameter: one for all, or a function of (nnx path, shape).
ShardingSpec = jax.sharding.Sharding | Callable[[Path, tuple[int, ...]], jax.sharding.Sharding]

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "generation_config.json",
)
# Buffers some exporters include that carry no parameters.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


@dataclasses.dataclass(frozen=True)
class _Entry:
    """How one HF tensor maps onto one NNX parameter."""

    hf_name: str
    path: Path
    to_jax: Callable[[np.ndarray], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]
    layer: int | None = None  # index along a stacked parameter's leading layer axis


def _same(x: np.ndarray) -> np.ndarray:
    return x


def _linear(x: np.ndarray) -> np.ndarray:  # HF [out, in] <-> ours [in, out]
    return x.T


def param_table(model_config: ModelConfig) -> list[_Entry]:
    """Every parameter of `cfg`'s model: HF name, NNX path and the layout transforms."""
    entries = [_Entry("model.embed_tokens.weight", ("embed",), _same, _same)]
    for i in range(model_config.num_layers):
        layer = _layer_entries(model_config, f"model.layers.{i}.", ("layers", i))
        if model_config.scan_layers:  # one stacked parameter per name: drop the index from the path
            layer = [dataclasses.replace(e, path=e.path[:1] + e.path[2:], layer=i) for e in layer]
        entries += layer
    if model_config.scan_layers:  # parameter-major, so an export reads each stacked array once
        entries[1:] = sorted(entries[1:], key=lambda e: e.path)
    entries.append(_Entry("model.norm.weight", ("final_norm", "weight"), _same, _same))
    if not model_config.tie_word_embeddings:
        entries.append(_Entry("lm_head.weight", ("lm_head",), _linear, _linear))
    return entries


def _layer_entries(model_config: ModelConfig, pre: str, path: Path) -> list[_Entry]:
    """The parameters of one decoder layer (HF names under `pre`, NNX paths under `path`)."""
    h, d, q = model_config.hidden_size, model_config.head_dim, model_config.num_heads

    def heads_in(n):  # HF [n*d, h] <-> ours [h, n, d]
        return (lambda x: x.T.reshape(h, n, d)), (lambda x: x.reshape(h, n * d).T)

    attn, entries = f"{pre}self_attn.", []
    for name, n in (
        ("q", model_config.num_heads),
        ("k", model_config.num_kv_heads),
        ("v", model_config.num_kv_heads),
    ):
        fwd, bwd = heads_in(n)
        entries.append(_Entry(f"{attn}{name}_proj.weight", (*path, "attn", name), fwd, bwd))
        if model_config.attention_bias:
            entries.append(
                _Entry(
                    f"{attn}{name}_proj.bias",
                    (*path, "attn", f"{name}_bias"),
                    lambda x, n=n: x.reshape(n, d),
                    lambda x, n=n: x.reshape(n * d),
                )
            )
    entries.append(
        _Entry(
            f"{attn}o_proj.weight",
            (*path, "attn", "o"),
            lambda x: x.T.reshape(q, d, h),
            lambda x: x.reshape(q * d, h).T,
        )
    )
    if model_config.o_bias:
        entries.append(_Entry(f"{attn}o_proj.bias", (*path, "attn", "o_bias"), _same, _same))
    if model_config.qk_norm:
        for name in ("q_norm", "k_norm"):
            entries.append(
                _Entry(f"{attn}{name}.weight", (*path, "attn", name, "weight"), _same, _same)
            )
    for name in ("gate", "up", "down"):
        entries.append(
            _Entry(f"{pre}mlp.{name}_proj.weight", (*path, "mlp", name), _linear, _linear)
        )
    for hf, ours in (
        ("input_layernorm", "input_norm"),
        ("post_attention_layernorm", "post_attn_norm"),
    ):
        entries.append(_Entry(f"{pre}{hf}.weight", (*path, ours, "weight"), _same, _same))
    return entries


def _open_checkpoint(path: str) -> dict[str, SafetensorsFile]:
    """Maps every tensor name of the checkpoint in `path` to the file that holds it."""
    index = os.path.join(path, "model.safetensors.index.json")
    single = os.path.join(path, "model.safetensors")
    if os.path.isfile(index):
        weight_map = _read_weight_map(index)
        files: dict[str, SafetensorsFile] = {}
        for fname in sorted(set(weight_map.values())):
            fpath = os.path.join(path, fname)
            if not os.path.isfile(fpath):
                raise FileNotFoundError(f"{index} lists {fname!r}, which is missing from {path!r}")
            files[fname] = SafetensorsFile(fpath)
        held = {fname: set(st.keys()) for fname, st in files.items()}
        absent = sorted(name for name, fname in weight_map.items() if name not in held[fname])
        if absent:
            raise ValueError(
                f"{index} maps tensors to shards that do not hold them: "
                + ", ".join(f"{n!r} -> {weight_map[n]!r}" for n in absent[:5])
                + (f" (and {len(absent) - 5} more)" if len(absent) > 5 else "")
            )
        return {name: files[fname] for name, fname in weight_map.items()}
    if os.path.isfile(single):
        st = SafetensorsFile(single)
        return {name: st for name in st.keys()}
    raise FileNotFoundError(
        f"no model.safetensors or model.safetensors.index.json in model folder {path!r}"
    )


def _read_weight_map(index: str) -> dict[str, str]:
    """The `weight_map` of a sharded checkpoint's index file, validated.

    Raises:
      ValueError: naming `index` when it is not JSON or has no {tensor: file} weight_map.
    """
    try:
        with open(index, encoding="utf-8") as f:
            doc = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"checkpoint index {index} is not valid JSON ({e})") from e
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise ValueError(
            f"checkpoint index {index} has no valid 'weight_map' (expected an object "
            "mapping tensor names to safetensors file names)"
        )
    return weight_map


def _count_nonfinite(arr: np.ndarray, chunk: int = 1 << 24) -> int:
    """NaN/Inf entries of a float array, scanned in chunks so that the temporary mask stays
    small next to the tensor; 0 for integer and bool arrays."""
    if arr.dtype.kind in "biu":
        return 0
    flat = arr.reshape(-1)
    bad = 0
    for i in range(0, flat.size, chunk):
        ok = np.isfinite(flat[i : i + chunk])
        if not ok.all():
            bad += int(ok.size - np.count_nonzero(ok))
    return bad


def _check_names(
    table: list[_Entry],
    tensors: dict[str, SafetensorsFile],
    model_config: ModelConfig,
    path: str | None = None,
):
    expected = {e.hf_name for e in table}
    missing = sorted(expected - set(tensors))
    unexpected = sorted(
        n
        for n in set(tensors) - expected
        if not n.endswith(_IGNORED_SUFFIXES)
        and not (model_config.tie_word_embeddings and n == "lm_head.weight")
    )
    problems = []
    if missing:
        problems.append(f"missing tensors: {missing}")
    if unexpected:
        problems.append(f"unexpected tensors: {unexpected}")
    if problems:
        where = f" in model folder {path!r}" if path is not None else ""
        raise ValueError(
            f"checkpoint{where} does not match a {model_config.model_type} model: "
            + "; ".join(problems)
        )


def _place(arr: np.ndarray, path: Path, sharding: ShardingSpec | None) -> jax.Array:
    if sharding is None:
        return jax.device_put(arr)
    s = sharding(path, arr.shape) if callable(sharding) else sharding
    return jax.make_array_from_callback(arr.shape, s, lambda idx: arr[idx])


def load_model(
    path: str,
    *,
    sharding: ShardingSpec | None = None,
    progress: Callable[[int, int], None] | None = None,
    **config_overrides: Any,
) -> Transformer:
    """Loads a HF checkpoint folder into a `Transformer`.

    Args:
      path: folder with `config.json` and `model.safetensors` or
        `model.safetensors.index.json` plus its shards.
      sharding: target placement, one `Sharding` for all parameters or a function of
        (NNX path, shape); default: the default device.
      progress: called as progress(done, total) after each tensor.
      **config_overrides: `ModelConfig` fields to change, e.g. param_dtype="bfloat16".

    Raises:
      FileNotFoundError: no config.json or no weights.
      ValueError: a config.json that is not JSON or lacks a field, an unknown model_type,
        a truncated/corrupt safetensors file (`SafetensorsError`), missing/unexpected
        tensors, a wrong shape, or a tensor holding NaN/Inf (each named).
    """
    model_config = ModelConfig.from_hf_folder(path, **config_overrides)
    table = param_table(model_config)
    tensors = _open_checkpoint(path)
    _check_names(table, tensors, model_config, path)

    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(model_config, rngs=nnx.Rngs(0))))
    flat = dict(nnx.to_flat_state(state))
    stacks: dict[Path, np.ndarray] = {}  # stacked parameters, filled layer by layer
    for n, entry in enumerate(table):
        var = flat[entry.path]
        want = var.get_value()
        if entry.layer is not None:
            want = jax.ShapeDtypeStruct(want.shape[1:], want.dtype)
        arr = _read_tensor(tensors[entry.hf_name], entry, want, path, model_config.param_dtype)
        if entry.layer is not None:
            full = var.get_value()
            stack = stacks.setdefault(entry.path, np.empty(full.shape, full.dtype))
            stack[entry.layer] = arr
            if entry.layer < model_config.num_layers - 1:
                continue
            arr = stacks.pop(entry.path)
        var.set_value(_place(arr, entry.path, sharding))
        del arr
        if progress is not None:
            progress(n + 1, len(table))
    return nnx.merge(graphdef, nnx.from_flat_state(list(flat.items())))


def _read_tensor(src: SafetensorsFile, entry: _Entry, want, path: str, param_dtype: str):
    """`entry`'s tensor from `src` in our layout and `want`'s dtype, its shape and values
    checked (each problem named: shape, NaN/Inf in the file, overflow of the cast)."""
    got_hf = src.shape(entry.hf_name)
    expected_hf = entry.to_hf(np.empty(want.shape, np.bool_)).shape
    if tuple(got_hf) != tuple(expected_hf):
        raise ValueError(
            f"model folder {path!r}: tensor {entry.hf_name!r} has shape {tuple(got_hf)}, "
            f"expected {tuple(expected_hf)} for this config.json"
        )
    raw = src.get(entry.hf_name)
    with np.errstate(over="ignore"):  # an overflowing cast is reported just below
        arr = np.asarray(entry.to_jax(raw), dtype=want.dtype)
    if _count_nonfinite(arr):  # one scan of the loaded tensor; the file's on failure
        if bad := _count_nonfinite(raw):
            raise ValueError(
                f"model folder {path!r}: tensor {entry.hf_name} has {bad} non-finite "
                f"values (NaN/Inf) in {os.path.basename(src.path)}; the checkpoint is "
                "corrupt or diverged, refusing to load it"
            )
        raise ValueError(
            f"model folder {path!r}: tensor {entry.hf_name} has "
            f"{_count_nonfinite(arr)} values that overflow to Inf when cast from "
            f"{raw.dtype} to param_dtype={param_dtype}"
        )
    return arr


def _host_array(x: jax.Array | np.ndarray) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:  # every host must call
        from jax.experimental import multihost_utils

        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


def save_model(
    model: Transformer,
    out_dir: str,
    *,
    tokenizer_dir: str | None = None,
    max_shard_bytes: int = 2 << 30,
    overwrite: bool = False,
) -> str:
    """Exports `model` as a HF folder that `transformers` loads with the same logits.

    Writes into a temporary sibling folder and renames it into place, so a crash never
    leaves a half-written export; an existing non-empty `out_dir` is an error unless
    `overwrite`, in which case it is replaced only after the new one is complete.
    Leftovers of an export killed midway (its temporary folder, or `<out_dir>.old` moved
    aside just before the final rename) are removed first; when the kill left only
    `<out_dir>.old`, that previous export stays there until the new one is in place.
    """
    out_dir = os.path.abspath(out_dir)
    if os.path.exists(out_dir) and os.listdir(out_dir) and not overwrite:
        raise FileExistsError(f"{out_dir!r} exists and is not empty (pass overwrite=True)")
    model_config = model.config
    flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    parent, name = os.path.split(out_dir)
    os.makedirs(parent, exist_ok=True)
    old = out_dir + ".old"
    _remove_leftovers(parent, name, old if os.path.exists(out_dir) else None)
    tmp = tempfile.mkdtemp(prefix=f".{name}.export-", dir=parent)
    try:
        _write_weights(tmp, param_table(model_config), flat, max_shard_bytes)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(model_config.to_hf_dict(), f, indent=2)
        if tokenizer_dir is not None:
            for fname in TOKENIZER_FILES:
                src = os.path.join(tokenizer_dir, fname)
                if os.path.isfile(src):
                    shutil.copy2(src, os.path.join(tmp, fname))
        if os.path.exists(out_dir):
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        if os.path.exists(old):
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _remove_leftovers(parent: str, name: str, stale_old: str | None) -> None:
    """Deletes the temporary folders of earlier, interrupted exports of `name` and (when
    `out_dir` itself exists) the `.old` copy such an export had moved aside."""
    for entry in os.listdir(parent):
        if entry.startswith(f".{name}.export-"):
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
    if stale_old is not None and os.path.exists(stale_old):
        shutil.rmtree(stale_old)


def _write_weights(folder: str, table: list[_Entry], flat: dict, max_shard_bytes: int):
    """Writes shards of at most `max_shard_bytes` as they fill, so host memory holds one
    shard at a time; names them `model-0000k-of-0000n` once n is known."""
    shard: dict[str, np.ndarray] = {}
    size, files, weight_map, total = 0, [], {}, 0

    def flush():
        fname = f"part-{len(files)}.safetensors"
        save_safetensors(os.path.join(folder, fname), shard)
        files.append(fname)
        weight_map.update({name: fname for name in shard})

    host: dict[Path, np.ndarray] = {}  # the stacked parameter being written, on the host
    for entry in table:
        if entry.layer is None:
            value = _host_array(flat[entry.path].get_value())
        else:
            if entry.path not in host:
                host = {entry.path: _host_array(flat[entry.path].get_value())}
            value = host[entry.path][entry.layer]
        arr = np.ascontiguousarray(entry.to_hf(value))
        if shard and size + arr.nbytes > max_shard_bytes:
            flush()
            shard, size = {}, 0
        shard[entry.hf_name] = arr
        size += arr.nbytes
        total += arr.nbytes
    flush()
    if len(files) == 1:
        os.replace(os.path.join(folder, files[0]), os.path.join(folder, "model.safetensors"))
        return
    final = {f: f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i, f in enumerate(files)}
    for old, new in final.items():
        os.replace(os.path.join(folder, old), os.path.join(folder, new))
    weight_map = {name: final[f] for name, f in weight_map.items()}
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
