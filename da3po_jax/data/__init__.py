"""Data layer: problem sources, prompt templates and the RL prompt order.

- `records`: `MathProblem`, the one record type every source yields; reference-answer
  extraction (`extract_last_boxed`, `extract_gsm8k_answer`); `write_jsonl`.
- `synthetic`: the tiered arithmetic task of the embedded demo (`generate_split`,
  `generate_splits`, `corpus` for the tiny tokenizer).
- `readers`: JSONL / Parquet readers; `tfds_source`: the optional TFDS reader;
  `sources`: `load_problems` (path, glob, folder or `tfds:<name>`) over them.
- `benchmarks`: the field maps of the held-out benchmarks' public releases and of
  DAPO-Math-17K (`BENCHMARK_FORMATS`, `get_benchmark_format`, `load_benchmark`).
- `prompts`: instruction templates (`format_prompt`).
- `pipeline`: `PromptIterator`, the seeded, resumable, host-sharded prompt stream.

Nothing here imports another layer of the package.
"""

from da3po_jax.data.benchmarks import (
    BENCHMARK_FORMATS,
    BenchmarkFormat,
    detect_benchmark_format,
    get_benchmark_format,
    load_benchmark,
)
from da3po_jax.data.pipeline import IteratorState, PromptIterator
from da3po_jax.data.prompts import PROMPT_TEMPLATES, format_prompt, get_template
from da3po_jax.data.readers import (
    EmptyDatasetError,
    FieldSpec,
    MalformedRow,
    ReadReport,
    ReadResult,
    parse_row,
    read_jsonl,
    read_parquet,
)
from da3po_jax.data.records import (
    MathProblem,
    extract_gsm8k_answer,
    extract_last_boxed,
    write_jsonl,
)
from da3po_jax.data.sources import load_problems
from da3po_jax.data.synthetic import (
    SPLITS,
    TIERS,
    corpus,
    generate_split,
    generate_splits,
    make_problem,
    split_of,
)
from da3po_jax.data.tfds_source import read_tfds

__all__ = [
    "BENCHMARK_FORMATS",
    "BenchmarkFormat",
    "EmptyDatasetError",
    "FieldSpec",
    "IteratorState",
    "MalformedRow",
    "MathProblem",
    "PROMPT_TEMPLATES",
    "PromptIterator",
    "ReadReport",
    "ReadResult",
    "SPLITS",
    "TIERS",
    "corpus",
    "detect_benchmark_format",
    "extract_gsm8k_answer",
    "extract_last_boxed",
    "format_prompt",
    "generate_split",
    "generate_splits",
    "get_benchmark_format",
    "get_template",
    "load_benchmark",
    "load_problems",
    "make_problem",
    "parse_row",
    "read_jsonl",
    "read_parquet",
    "read_tfds",
    "split_of",
    "write_jsonl",
]
