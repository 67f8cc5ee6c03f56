"""Minimal, lazy safetensors reading and writing on NumPy memory maps.

Reading memory-maps the file and returns one tensor at a time as a NumPy view, so host
memory stays near the size of the largest tensor; bfloat16 is handled with `ml_dtypes`
(NumPy has no native bfloat16). The format is the documented one: an 8-byte little-endian
header length, a JSON header `{name: {dtype, shape, data_offsets}}`, then the raw bytes.
"""

from __future__ import annotations

import json
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


class SafetensorsFile:
    """Read-only view of one `.safetensors` file; tensors are read on demand."""

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
        except (OSError, struct.error, ValueError) as e:
            raise ValueError(f"cannot read safetensors header of {path!r}: {e}") from e
        self.metadata = header.pop("__metadata__", {})
        self._entries = header
        self._offset = 8 + n

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


def save_safetensors(path: str, tensors: dict[str, np.ndarray], metadata: dict | None = None):
    """Writes `tensors` to `path` in safetensors format (tensors written one by one)."""
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    arrays = {}
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
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
