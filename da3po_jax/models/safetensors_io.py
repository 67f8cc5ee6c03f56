"""Minimal, lazy safetensors reading and writing on NumPy memory maps.

Reading memory-maps the file and returns one tensor at a time as a NumPy view, so host
memory stays near the size of the largest tensor; bfloat16 is handled with `ml_dtypes`
(NumPy has no native bfloat16). The format is the documented one: an 8-byte little-endian
header length, a JSON header `{name: {dtype, shape, data_offsets}}`, then the raw bytes.
"""

from __future__ import annotations

import json
import math
import os
import struct

import ml_dtypes
import numpy as np

_TO_NUMPY = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_FROM_NUMPY = {v: k for k, v in _TO_NUMPY.items()}
_CORRUPT = "the file looks truncated or corrupt"


class SafetensorsError(ValueError):
    """A `.safetensors` file whose header or layout is unreadable (truncated or corrupt);
    the message names the file and, where one is at fault, the tensor."""


class SafetensorsFile:
    """Read-only view of one `.safetensors` file; tensors are read on demand.

    The header is validated when the file is opened: its length fits in the file, it is a
    JSON object, and every tensor's `data_offsets` lie inside the data section and match
    its dtype and shape, so a truncated download fails here (naming the file and tensor)
    instead of in `mmap`.

    Raises:
      SafetensorsError: (a `ValueError`) an unreadable, truncated or inconsistent file.
    """

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(8)
                if len(head) < 8:
                    raise SafetensorsError(
                        f"safetensors file {path!r} has {size} bytes, fewer than the 8-byte "
                        f"header length; {_CORRUPT}"
                    )
                (n,) = struct.unpack("<Q", head)
                if 8 + n > size:
                    raise SafetensorsError(
                        f"safetensors file {path!r}: header length {n} exceeds the file size "
                        f"{size} bytes; {_CORRUPT}"
                    )
                raw = f.read(n)
        except OSError as e:
            raise SafetensorsError(f"cannot read safetensors file {path!r}: {e}") from e
        try:
            header = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as e:
            raise SafetensorsError(
                f"safetensors file {path!r}: header is not valid JSON ({e}); {_CORRUPT}"
            ) from e
        if not isinstance(header, dict):
            raise SafetensorsError(
                f"safetensors file {path!r}: header is a JSON {type(header).__name__}, not an "
                f"object; {_CORRUPT}"
            )
        self.metadata = header.pop("__metadata__", None) or {}
        self._entries = header
        self._offset = 8 + n
        data_size = size - self._offset
        for name, entry in header.items():
            _check_entry(path, name, entry, data_size)

    def keys(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entries[name]["shape"])

    def get(self, name: str) -> np.ndarray:
        """The tensor `name` as a read-only NumPy array backed by the memory map."""
        entry = self._entries[name]
        dtype = _TO_NUMPY.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"{self.path}: tensor {name!r} has unsupported dtype {entry['dtype']}")
        start, end = entry["data_offsets"]
        count = (end - start) // dtype.itemsize
        arr = np.memmap(
            self.path, dtype=dtype, mode="r", offset=self._offset + start, shape=(count,)
        )
        return arr.reshape(entry["shape"])


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_entry(path: str, name: str, entry, data_size: int) -> None:
    """Raises `SafetensorsError` unless `entry` is a well-formed tensor record whose bytes
    lie inside the `data_size`-byte data section and match its dtype and shape."""
    where = f"safetensors file {path!r}: tensor {name!r}"
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise SafetensorsError(
            f"{where} has header entry {entry!r}, expected {{dtype, shape, data_offsets}}; "
            f"{_CORRUPT}"
        )
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise SafetensorsError(f"{where} has invalid shape {shape!r}; {_CORRUPT}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_int(o) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise SafetensorsError(f"{where} has invalid data_offsets {offsets!r}; {_CORRUPT}")
    start, end = offsets
    if end > data_size:
        raise SafetensorsError(
            f"{where} has data_offsets [{start}, {end}] beyond the end of the data section "
            f"({data_size} bytes in the file); {_CORRUPT}"
        )
    dtype = _TO_NUMPY.get(entry["dtype"])
    if dtype is not None:  # an unsupported dtype is reported when the tensor is read
        want = math.prod(shape) * dtype.itemsize
        if end - start != want:
            raise SafetensorsError(
                f"{where} spans {end - start} bytes (data_offsets [{start}, {end}]) but "
                f"{entry['dtype']} x {tuple(shape)} needs {want}; {_CORRUPT}"
            )


def save_safetensors(path: str, tensors: dict[str, np.ndarray], metadata: dict | None = None):
    """Writes `tensors` to `path` in safetensors format (tensors written one by one)."""
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    arrays = {}
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr).reshape(np.shape(arr))  # keeps 0-d tensors 0-d
        if arr.dtype not in _FROM_NUMPY:
            raise ValueError(f"tensor {name!r}: unsupported dtype {arr.dtype}")
        header[name] = {
            "dtype": _FROM_NUMPY[arr.dtype],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
        arrays[name] = arr
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # align the data section to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for arr in arrays.values():
            f.write(arr.tobytes())
        f.flush()
        os.fsync(f.fileno())
