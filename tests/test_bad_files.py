"""Every bad input file is refused with an error that names the file (and tensor / field)
and says what is wrong: truncated or corrupt safetensors, non-finite weights, broken
model config.json, truncated tokenizer files, corrupt Parquet data."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct

import numpy as np
import pytest

from da3po_jax.data import EmptyDatasetError, load_problems, read_jsonl, read_parquet
from da3po_jax.models import get_preset, init_model, load_model, save_model
from da3po_jax.models.safetensors_io import SafetensorsError, SafetensorsFile, save_safetensors
from da3po_jax.models.tokenizer import Tokenizer, TokenizerLoadError

TINY = get_preset("tiny-qwen2", vocab_size=64)
UP = "model.layers.0.mlp.up_proj.weight"


@pytest.fixture(scope="module")
def _saved_model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tiny") / "model")
    return save_model(init_model(TINY, seed=0), path)


@pytest.fixture
def model_dir(_saved_model, tmp_path):
    """A fresh copy of a tiny qwen2 HF folder (config.json + model.safetensors)."""
    return shutil.copytree(_saved_model, str(tmp_path / "model"))


def _raises(exc_type, *words):
    """`pytest.raises` whose message must contain every one of `words` literally."""
    return pytest.raises(exc_type, match="".join(f"(?=[\\s\\S]*{re.escape(w)})" for w in words))


def _tensors(path):
    st = SafetensorsFile(path)
    return {k: np.array(st.get(k)) for k in st.keys()}


def _header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return n, json.loads(f.read(n))


def _write_with_header(path, header: dict, data: bytes):
    blob = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob + data)


# ------------------------------------------------------------------ safetensors


def test_truncated_safetensors_names_file_and_tensor(model_dir):
    st_path = os.path.join(model_dir, "model.safetensors")
    n, header = _header(st_path)
    last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"])
    size = os.path.getsize(st_path)
    with open(st_path, "r+b") as f:
        f.truncate(size - 100)
    with _raises(
        SafetensorsError,
        st_path,
        f"tensor {last!r}",
        "beyond the end of the data section",
        "truncated or corrupt",
    ):
        load_model(model_dir)


def test_safetensors_cut_inside_header(model_dir):
    st_path = os.path.join(model_dir, "model.safetensors")
    with open(st_path, "r+b") as f:
        f.truncate(100)
    with _raises(SafetensorsError, st_path, "header length", "exceeds the file size 100 bytes"):
        load_model(model_dir)
    with open(st_path, "r+b") as f:
        f.truncate(5)
    with _raises(SafetensorsError, st_path, "has 5 bytes", "truncated or corrupt"):
        load_model(model_dir)


def test_safetensors_header_not_json(model_dir):
    st_path = os.path.join(model_dir, "model.safetensors")
    with open(st_path, "r+b") as f:
        f.seek(8)
        f.write(b"#")  # the opening brace of the JSON header
    with _raises(SafetensorsError, st_path, "header is not valid JSON", "truncated or corrupt"):
        load_model(model_dir)


def test_safetensors_offsets_inconsistent_with_shape(tmp_path):
    path = str(tmp_path / "x.safetensors")
    data = np.arange(6, dtype=np.float32).tobytes()
    _write_with_header(
        path, {"w": {"dtype": "F32", "shape": [2, 4], "data_offsets": [0, 24]}}, data
    )
    with _raises(SafetensorsError, path, "tensor 'w'", "spans 24 bytes", "needs 32"):
        SafetensorsFile(path)
    _write_with_header(path, {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [8, 4]}}, data)
    with _raises(SafetensorsError, path, "tensor 'w'", "invalid data_offsets [8, 4]"):
        SafetensorsFile(path)
    _write_with_header(path, {"w": {"dtype": "F32", "shape": [-2, 3]}}, data)
    with _raises(SafetensorsError, path, "tensor 'w'", "expected {dtype, shape, data_offsets}"):
        SafetensorsFile(path)
    _write_with_header(path, [1, 2], data)
    with _raises(SafetensorsError, path, "header is a JSON list"):
        SafetensorsFile(path)


def test_valid_safetensors_still_reads(tmp_path):
    path = str(tmp_path / "ok.safetensors")
    t = {"a": np.ones((2, 3), np.float32), "b": np.zeros((0,), np.int8), "c": np.float16(2.0)}
    save_safetensors(path, {k: np.asarray(v) for k, v in t.items()})
    st = SafetensorsFile(path)
    for k, v in t.items():
        got = np.asarray(st.get(k))
        assert got.shape == np.shape(v) and got.dtype == np.asarray(v).dtype
        np.testing.assert_array_equal(got, v)


def test_sharded_index_not_json_or_pointing_at_wrong_shard(model_dir):
    st_path = os.path.join(model_dir, "model.safetensors")
    tensors = _tensors(st_path)
    os.remove(st_path)
    names = sorted(tensors)
    save_safetensors(os.path.join(model_dir, "a.safetensors"), {k: tensors[k] for k in names[:5]})
    save_safetensors(os.path.join(model_dir, "b.safetensors"), {k: tensors[k] for k in names[5:]})
    index = os.path.join(model_dir, "model.safetensors.index.json")
    weight_map = {k: "a.safetensors" if i < 5 else "b.safetensors" for i, k in enumerate(names)}
    with open(index, "w") as f:
        json.dump({"weight_map": weight_map}, f)
    load_model(model_dir)  # the valid layout loads
    with open(index, "w") as f:
        json.dump({"weight_map": {**weight_map, names[0]: "b.safetensors"}}, f)
    with _raises(ValueError, index, "do not hold them", f"{names[0]!r} -> 'b.safetensors'"):
        load_model(model_dir)
    with open(index, "w") as f:
        f.write('{"weight_map": {"model.norm')
    with _raises(ValueError, index, "is not valid JSON"):
        load_model(model_dir)
    with open(index, "w") as f:
        json.dump({"metadata": {}}, f)
    with _raises(ValueError, index, "no valid 'weight_map'"):
        load_model(model_dir)


# ------------------------------------------------------------------ non-finite weights


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_are_refused_naming_tensor_and_folder(model_dir, bad):
    st_path = os.path.join(model_dir, "model.safetensors")
    tensors = _tensors(st_path)
    tensors[UP].reshape(-1)[[0, 5, 7]] = bad
    save_safetensors(st_path, tensors)
    with _raises(
        ValueError,
        f"model folder {model_dir!r}: tensor {UP} has 3 non-finite values (NaN/Inf)",
        "model.safetensors",
    ):
        load_model(model_dir)


def test_weights_overflowing_float16_are_refused(model_dir):
    st_path = os.path.join(model_dir, "model.safetensors")
    tensors = _tensors(st_path)
    tensors[UP].reshape(-1)[:2] = 1e6  # finite in float32, Inf in float16
    save_safetensors(st_path, tensors)
    load_model(model_dir)  # float32: fine
    with _raises(ValueError, model_dir, UP, "2 values that overflow", "param_dtype=float16"):
        load_model(model_dir, param_dtype="float16")


# ------------------------------------------------------------------ model config.json


def _edit_config(model_dir, edit):
    cfg_path = os.path.join(model_dir, "config.json")
    with open(cfg_path) as f:
        hf = json.load(f)
    with open(cfg_path, "w") as f:
        json.dump(edit(hf), f, indent=2)
    return cfg_path


def test_config_json_not_valid_json(model_dir):
    cfg_path = os.path.join(model_dir, "config.json")
    with open(cfg_path) as f:
        text = f.read()
    with open(cfg_path, "w") as f:
        f.write(text[: len(text) // 2])
    with _raises(ValueError, f"model config {cfg_path} is not valid JSON (line"):
        load_model(model_dir)
    with open(cfg_path, "w") as f:
        f.write("[1, 2]")
    with _raises(ValueError, f"model config {cfg_path} holds a JSON list, expected an object"):
        load_model(model_dir)


@pytest.mark.parametrize(
    "edit, words",
    [
        (
            lambda hf: {k: v for k, v in hf.items() if k != "hidden_size"},
            "missing the field 'hidden_size'",
        ),
        (
            lambda hf: {**hf, "hidden_size": "16"},
            "'hidden_size' must be a positive integer, got '16'",
        ),
        (
            lambda hf: {**hf, "num_attention_heads": 0},
            "'num_attention_heads' must be a positive integer",
        ),
        (
            lambda hf: {**hf, "num_hidden_layers": None},
            "'num_hidden_layers' must be a positive integer, got None",
        ),
        (lambda hf: {**hf, "rms_norm_eps": "tiny"}, "'rms_norm_eps' must be a positive number"),
        (lambda hf: {**hf, "eos_token_id": "eos"}, "'eos_token_id' must be a token id"),
        (
            lambda hf: {**hf, "rope_parameters": {"rope_theta": "big"}},
            "rope_theta must be a number",
        ),
        (lambda hf: {**hf, "model_type": "gpt2"}, "unknown model_type 'gpt2'"),
    ],
)
def test_config_json_bad_fields_name_the_file(model_dir, edit, words):
    cfg_path = _edit_config(model_dir, edit)
    with _raises(ValueError, f"model config {cfg_path}: ", words):
        load_model(model_dir)


def test_config_json_integral_float_is_accepted(model_dir):
    _edit_config(model_dir, lambda hf: {**hf, "hidden_size": float(TINY.hidden_size)})
    assert load_model(model_dir).config.hidden_size == TINY.hidden_size


# ------------------------------------------------------------------ tokenizer


@pytest.fixture
def tok_dir(tokenizer_dir, tmp_path):
    return shutil.copytree(tokenizer_dir, str(tmp_path / "tok"))


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_truncated_tokenizer_file_is_named(tok_dir, name):
    path = os.path.join(tok_dir, name)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with _raises(TokenizerLoadError, f"tokenizer file {path} is not valid JSON (line", "truncated"):
        Tokenizer.load(tok_dir)


def test_broken_generation_config_is_named(tok_dir):
    path = os.path.join(tok_dir, "generation_config.json")
    with open(path, "w") as f:
        f.write('{"eos_token_id": [1, ')
    with _raises(TokenizerLoadError, f"generation config {path} is not valid JSON"):
        Tokenizer.load(tok_dir)
    with open(path, "w") as f:
        json.dump({"eos_token_id": "eos"}, f)
    with _raises(TokenizerLoadError, path, "eos_token_id must be a token id"):
        Tokenizer.load(tok_dir)


def test_tokenizer_loader_error_is_wrapped_with_the_folder(tok_dir, monkeypatch):
    import transformers

    def fail(*args, **kwargs):
        raise Exception("data did not match any variant of untagged enum ModelWrapper")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fail)
    with _raises(
        TokenizerLoadError, f"cannot load the tokenizer in folder {tok_dir!r}", "ModelWrapper"
    ):
        Tokenizer.load(tok_dir)


# ------------------------------------------------------------------ data files


ROWS = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(50)]


@pytest.fixture
def parquet_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=10)
    return path


def test_corrupt_parquet_names_the_file(parquet_file):
    assert len(read_parquet(parquet_file).problems) == len(ROWS)
    data = parquet_file.read_bytes()
    parquet_file.write_bytes(data[: len(data) // 2])  # footer gone
    with _raises(
        ValueError, str(parquet_file), "not a valid or complete Parquet file", "truncated"
    ):
        read_parquet(parquet_file)
    parquet_file.write_bytes(b"PAR1" + b"\0" * 64)
    with _raises(ValueError, str(parquet_file), "not a valid or complete Parquet file"):
        load_problems(str(parquet_file))


def test_parquet_with_corrupt_data_page_names_the_file(parquet_file):
    data = bytearray(parquet_file.read_bytes())
    data[4:200] = b"\xff" * 196  # first column chunk's pages; the footer stays intact
    parquet_file.write_bytes(bytes(data))
    with _raises(ValueError, str(parquet_file), "not a valid or complete Parquet file"):
        read_parquet(parquet_file)


def test_parquet_missing_columns_names_the_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "other.parquet"
    pq.write_table(pa.Table.from_pylist([{"text": "a", "label": 1}] * 3), path)
    with _raises(EmptyDatasetError, str(path), "no usable rows (3 rows read, 3 malformed"):
        read_parquet(path)


def test_broken_json_array_names_the_file(tmp_path):
    path = tmp_path / "train.json"
    path.write_text('[{"prompt": "Q", "answer": "1"}, {"prom')
    with _raises(ValueError, str(path), "not a valid JSON array of rows"):
        read_jsonl(path)
