"""Field maps of the public releases of the held-out math benchmarks and DAPO-Math-17K.

A `BenchmarkFormat` names a benchmark and says how the readers map its published rows to
`MathProblem` (a `FieldSpec`), which field gives the tier and which the subject, and which
prompt template suits it, so a held-out set can say `"olympiadbench"` instead of spelling
field paths. `BENCHMARK_FORMATS` holds the built-in ones; `get_benchmark_format` looks one up
(case, `-`, `_` and spaces ignored: `"MATH-500"` is `math500`) and names the known ones
when the name is unknown; `load_benchmark` reads files with one; `detect_benchmark_format`
names the release a row's keys identify.

The releases (Hugging Face datasets) and what is read from them:

- `math500` (HuggingFaceH4/MATH-500): `problem`, `answer` (LaTeX string), id `unique_id`,
  tier `level` written `Level 3`, as the MATH training files label it, so accuracy groups
  match across the two; `subject` stays in `meta["fields"]`; `solution` is the SFT target.
- `aime2024`: Maxwell-Jia/AIME_2024 (`ID`, `Problem`, `Solution`, integer `Answer`) and
  HuggingFaceH4/aime_2024 (`id`, `problem`, `solution`, string `answer`, `url`, `year`).
- `aime2025` (opencompass/AIME2025, yentinglin/aime_2025, math-ai/aime25; the releases
  differ): `problem` or `question`, `answer` (string or integer), `id` when present.
- `aime2026` (MathArena-style releases; no settled release is known, so this is the
  MathArena layout of earlier years): `problem_idx` (the id), `problem`, `answer`.
- `amc23` (math-ai/amc23, zwhe99/amc23): `id`, `question`, `answer` stored as a float
  (`27.0` is read `27`), `url` optional.
- `minerva` (math-ai/minervamath, knoveleng/Minerva-Math; the releases differ):
  `question` or `problem`, `answer` (units, `6.0 \\times 10^{-27}`), else the last box of
  `solution` for a release that carries only worked solutions; `id` or `idx` when present.
- `olympiadbench` (Hothan/OlympiadBench, subset OE_TO_maths_en_COMP): `question` after a
  non-null `context`, integer `id`, tier `difficulty` (`Competition` throughout this
  subset), `subfield` as the subject. `final_answer` is a list: its answers, each out of
  its `$...$`, joined with `, ` (`["$2$", "$-3$"]` -> `2, -3`), which the verifier scores
  as an unordered set; the first of the `solution` list is the SFT target. `unit` and
  `answer_type` stay in `meta["fields"]`; the image fields are null in this text-only
  subset and are not read.
- `dapo_math_17k` (BytedTsinghua-SIA/DAPO-Math-17k, Parquet): the user message of the chat
  list `prompt` (it already holds the DAPO instruction, hence the `raw` template),
  `reward_model.ground_truth`, id `extra_info.index`; rows repeat, hence `dedupe`.

Template: the benchmarks with bare questions get `dapo`, the instruction DAPO-Math-17K's
prompts carry, so a policy trained on them is evaluated under the answer format it learned
(the verifier reads `Answer:` lines and boxes alike); `boxed` is the Qwen2.5-Math
alternative. How many samples per problem a table used is a property of an evaluation
suite, not of a release, and is not recorded here.

Detection: a format names the key sets that identify its rows; of the formats whose set a
row holds, the one with the largest set wins, and a tie or no match is None. The AIME 2025
rows (`problem`/`question` and `answer`) and Minerva's have the generic shape the default
`FieldSpec` already reads and identify nothing; a release copying HuggingFaceH4/aime_2024's
columns is detected as `aime2024`, whose field map it shares.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

from da3po_jax.data.readers import FieldSpec, ReadResult
from da3po_jax.data.sources import load_problems


@dataclasses.dataclass(frozen=True)
class BenchmarkFormat:
    """The published row format of one benchmark release.

    Attributes:
      name: registry key (`"math500"`).
      title: the benchmark's usual name (`"MATH-500"`).
      releases: Hugging Face datasets with this row format.
      fields: how the readers map a row to `MathProblem`; `fields.tier` names the field that
        gives the tier (empty: none).
      template: prompt template name (`da3po_jax.data.prompts.PROMPT_TEMPLATES`).
      subject: the field naming the subject, kept in `MathProblem.meta["fields"]`, or None.
      signatures: key sets whose presence in a row identifies the release (empty: rows of
        this release are not told apart from other releases by their keys).
    """

    name: str
    title: str
    releases: tuple[str, ...]
    fields: FieldSpec
    template: str
    subject: str | None = None
    signatures: tuple[frozenset[str], ...] = ()


def _bare(**kwargs: Any) -> FieldSpec:
    """A field map for releases whose answer field holds the final answer as is."""
    return FieldSpec(**{"tier": (), "answer_mode": "raw", **kwargs})


_FORMATS = (
    BenchmarkFormat(
        name="math500",
        title="MATH-500",
        releases=("HuggingFaceH4/MATH-500",),
        fields=_bare(
            prompt=("problem",),
            answer=("answer",),
            id=("unique_id",),
            tier=("level",),
            tier_prefix="Level ",
        ),
        template="dapo",
        subject="subject",
        signatures=(frozenset({"problem", "answer", "unique_id", "level", "subject"}),),
    ),
    BenchmarkFormat(
        name="aime2024",
        title="AIME 2024",
        releases=("Maxwell-Jia/AIME_2024", "HuggingFaceH4/aime_2024"),
        fields=_bare(
            prompt=("Problem", "problem"),
            answer=("Answer", "answer"),
            id=("ID", "id"),
            solution=("Solution", "solution"),
        ),
        template="dapo",
        signatures=(
            frozenset({"ID", "Problem", "Answer"}),
            frozenset({"id", "problem", "answer", "url", "year"}),
        ),
    ),
    BenchmarkFormat(
        name="aime2025",
        title="AIME 2025",
        releases=("opencompass/AIME2025", "yentinglin/aime_2025", "math-ai/aime25"),
        fields=_bare(prompt=("problem", "question"), answer=("answer",)),
        template="dapo",
    ),
    BenchmarkFormat(
        name="aime2026",
        title="AIME 2026",
        releases=("MathArena-style releases",),
        fields=_bare(prompt=("problem",), answer=("answer",), id=("problem_idx", "id")),
        template="dapo",
        signatures=(frozenset({"problem_idx", "problem", "answer"}),),
    ),
    BenchmarkFormat(
        name="amc23",
        title="AMC 2023",
        releases=("math-ai/amc23", "zwhe99/amc23"),
        fields=_bare(prompt=("question", "problem"), answer=("answer",)),
        template="dapo",
        signatures=(frozenset({"id", "question", "answer", "url"}),),
    ),
    BenchmarkFormat(
        name="minerva",
        title="Minerva Math",
        releases=("math-ai/minervamath", "knoveleng/Minerva-Math"),
        fields=FieldSpec(
            prompt=("question", "problem"),
            answer=("answer", "solution"),
            id=("id", "idx"),
            tier=(),
        ),
        template="dapo",
    ),
    BenchmarkFormat(
        name="olympiadbench",
        title="OlympiadBench",
        releases=("Hothan/OlympiadBench (OE_TO_maths_en_COMP)",),
        fields=_bare(
            prompt=("question",),
            context=("context",),
            answer=("final_answer",),
            list_answers=True,
            tier=("difficulty",),
        ),
        template="dapo",
        subject="subfield",
        signatures=(frozenset({"question", "final_answer"}),),
    ),
    BenchmarkFormat(
        name="dapo_math_17k",
        title="DAPO-Math-17K",
        releases=("BytedTsinghua-SIA/DAPO-Math-17k",),
        fields=_bare(
            prompt=("prompt",),
            answer=("reward_model.ground_truth",),
            id=("extra_info.index",),
            solution=(),
            dedupe=True,
        ),
        template="raw",
        signatures=(frozenset({"prompt", "reward_model", "data_source"}),),
    ),
)

BENCHMARK_FORMATS: Mapping[str, BenchmarkFormat] = {f.name: f for f in _FORMATS}


def _key(name: str) -> str:
    return re.sub(r"[-_\s]", "", name.lower())


_BY_KEY = {_key(f.name): f for f in _FORMATS}


def get_benchmark_format(name: str) -> BenchmarkFormat:
    """The built-in format called `name` (case, `-`, `_` and spaces ignored).

    Raises:
      ValueError: no such format; the message lists the known ones.
    """
    found = _BY_KEY.get(_key(name))
    if found is None:
        raise ValueError(
            f"unknown benchmark format {name!r}: use one of {', '.join(BENCHMARK_FORMATS)}"
        )
    return found


def detect_benchmark_format(row: Mapping[str, Any]) -> BenchmarkFormat | None:
    """The format whose largest identifying key set `row` holds; None on no match or a tie."""
    keys = set(row)
    best: list[tuple[int, BenchmarkFormat]] = []
    for fmt in _FORMATS:
        sizes = [len(s) for s in fmt.signatures if s <= keys]
        if sizes:
            best.append((max(sizes), fmt))
    if not best:
        return None
    top = max(size for size, _ in best)
    winners = [fmt for size, fmt in best if size == top]
    return winners[0] if len(winners) == 1 else None


def load_benchmark(
    source: str | os.PathLike,
    benchmark: str | BenchmarkFormat,
    *,
    max_reported: int = 5,
) -> ReadResult:
    """Reads a benchmark's files (a path, folder or glob, as `load_problems`) with its map.

    Args:
      source: the release's file(s), JSONL or Parquet.
      benchmark: a format name or a `BenchmarkFormat`.
      max_reported: how many malformed rows to log individually, per file.

    Raises:
      ValueError: an unknown format name.
    """
    fmt = benchmark if isinstance(benchmark, BenchmarkFormat) else get_benchmark_format(benchmark)
    return load_problems(source, fmt.fields, max_reported=max_reported)
