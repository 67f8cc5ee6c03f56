"""TensorFlow Datasets as an optional source (e.g. GSM8K), mapped to `MathProblem`.

`tensorflow_datasets` is imported only when this source is used, so the package never
needs TensorFlow otherwise; its absence is an `ImportError` that says what to install.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from da3po_jax.data.readers import FieldSpec, ReadResult, collect_rows


def _import_tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise ImportError(
            "the TFDS source needs the 'tensorflow-datasets' package (and tensorflow): "
            "pip install tensorflow-datasets tensorflow, or pip install 'da3po_jax[tfds]'"
        ) from e
    return tfds


def _decode_tfds_value(value: Any) -> Any:
    """numpy/bytes leaves of a TFDS example -> Python str/int/float/list/dict."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, Mapping):
        return {k: _decode_tfds_value(v) for k, v in value.items()}
    if hasattr(value, "tolist"):  # numpy scalar or array
        return _decode_tfds_value(value.tolist())
    if isinstance(value, list):
        return [_decode_tfds_value(v) for v in value]
    return value


def read_tfds(
    name: str,
    split: str = "train",
    fields: FieldSpec | None = None,
    *,
    data_dir: str | None = None,
    download: bool = False,
    max_reported: int = 5,
) -> ReadResult:
    """Reads a TensorFlow Datasets dataset (e.g. `"gsm8k"`) as problems.

    GSM8K's `question`/`answer` (`... #### 72`) fit the default `FieldSpec`.

    Args:
      name: TFDS name, optionally with config/version (`"gsm8k/main"`).
      split: TFDS split expression.
      fields: field names and answer mode.
      data_dir: TFDS data directory.
      download: let TFDS download and prepare the data (off by default: no network).
      max_reported: how many malformed rows to log individually.

    Raises:
      ImportError: `tensorflow_datasets` is not installed.
      EmptyDatasetError: no usable row.
    """
    tfds = _import_tfds()
    ds = tfds.load(name, split=split, data_dir=data_dir, download=download)
    rows = ((i, i, _decode_tfds_value(example)) for i, example in enumerate(tfds.as_numpy(ds)))
    source = f"tfds:{name}/{split}"
    return collect_rows(rows, fields or FieldSpec(), source, max_reported, name=source)
