"""Evaluation suites: named held-out sets, each with its own files, field map, template
and k, written once in a recipe as `eval.suites` and reported one row per benchmark.

A suite is one string: its name, then `key=value` options (shell quoting for values with
spaces):

    "aime2024 path=/data/aime_2024.parquet k=32"
    "math500 path=/data/math500.jsonl"
    "mine path=/data/mine/*.jsonl format=minerva template=boxed max_prompts=100"

- `path` (required): a file, folder or glob of JSONL / Parquet files (`load_problems`).
- `format`: a built-in benchmark format (`BENCHMARK_FORMATS`: its field map and template);
  unset: the name's format when the name is one (`aime2024`, `MATH-500`, ...), else the
  format the first row's keys identify (`detect_benchmark_format`), else the run's own
  field settings (`data.prompt_field`, ...), as for `data.eval_path`.
- `template`: a prompt template name or a string with `{problem}`; unset: the format's,
  else `data.template`.
- `k`: samples per problem for avg@k and pass@k; unset (0): `eval.num_samples`.
- `max_prompts`: the first n problems; unset (0): all, as a benchmark table reports.

`parse_suite` reads a string (every error names the suite and the bad part) and
`load_suite` reads the files. A suite's problems get ids `<name>/<id>` (unique across
suites) and carry their suite and template in `meta` (`SUITE_KEY`, `TEMPLATE_KEY`), which
the prompt renderer reads.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex

from da3po_jax.data.benchmarks import (
    BenchmarkFormat,
    detect_benchmark_format,
    get_benchmark_format,
)
from da3po_jax.data.prompts import get_template
from da3po_jax.data.readers import FieldSpec
from da3po_jax.data.records import MathProblem
from da3po_jax.data.sources import first_row, load_problems

SUITE_KEY = "suite"  # MathProblem.meta: the suite a problem was read for
TEMPLATE_KEY = "template"  # MathProblem.meta: the prompt template it is rendered with
OPTIONS = ("path", "format", "template", "k", "max_prompts")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# names a metric key under eval/ already uses, which a suite's keys would collide with
_RESERVED = ("average", "response_len", "truncated_frac", "num_prompts")


class SuiteError(ValueError):
    """A suite string that cannot be read, or a suite whose files cannot be."""


@dataclasses.dataclass(frozen=True)
class EvalSuite:
    """One named held-out set (see the module docstring for each field's default).

    Attributes:
      name: the benchmark's name in metric keys, tables and TensorBoard.
      path: its file(s).
      format: a `BENCHMARK_FORMATS` name, or "" (the name's format, else detected).
      template: a prompt template, or "" (the format's, else `data.template`).
      k: samples per problem, or 0 (`eval.num_samples`).
      max_prompts: the first n problems, or 0 (all).
    """

    name: str
    path: str
    format: str = ""
    template: str = ""
    k: int = 0
    max_prompts: int = 0

    @property
    def title(self) -> str:
        """The benchmark's usual name (`AIME 2024`) when the suite is a known format by
        name or `format`, else its name."""
        fmt = self.known_format()
        return fmt.title if fmt is not None else self.name

    def known_format(self) -> BenchmarkFormat | None:
        """The format `format` names, else the one the suite's name is; None if neither."""
        if self.format:
            return get_benchmark_format(self.format)
        try:
            return get_benchmark_format(self.name)
        except ValueError:
            return None

    def spec(self) -> str:
        """The suite as the string `parse_suite` reads back."""
        parts = [self.name, f"path={shlex.quote(self.path)}"]
        for key in OPTIONS[1:]:
            value = getattr(self, key)
            if value:
                parts.append(f"{key}={shlex.quote(str(value))}")
        return " ".join(parts)


def parse_suite(spec: str) -> EvalSuite:
    """The suite a string describes.

    Raises:
      SuiteError: not a string, no name or a bad one, an unknown option, an option given
        twice, no `path`, a bad `k` / `max_prompts`, an unknown `format` or `template`;
        the message quotes the string and names the part.
    """
    if not isinstance(spec, str):
        raise SuiteError(f"an eval suite must be a string 'NAME path=FILES ...', got {spec!r}")
    try:
        words = shlex.split(spec)
    except ValueError as e:
        raise SuiteError(f"eval suite {spec!r}: {e}") from None
    if not words or "=" in words[0]:
        raise SuiteError(f"eval suite {spec!r} must start with its name: 'NAME path=FILES ...'")
    name, options = words[0], {}
    _check_name(name, spec)
    for word in words[1:]:
        key, eq, value = word.partition("=")
        if not eq or key not in OPTIONS:
            raise SuiteError(
                f"eval suite {spec!r}: {word!r} is not an option; use key=value with keys "
                f"{', '.join(OPTIONS)}"
            )
        if key in options:
            raise SuiteError(f"eval suite {spec!r} gives {key} twice")
        options[key] = value
    if not options.get("path"):
        raise SuiteError(f"eval suite {spec!r} has no path=FILES (a file, folder or glob)")
    for key in ("k", "max_prompts"):
        if key in options:
            options[key] = _count(options[key], key, spec)
    suite = EvalSuite(name=name, **options)
    try:
        suite.known_format()
        if suite.template:
            get_template(suite.template)
    except ValueError as e:
        raise SuiteError(f"eval suite {spec!r}: {e}") from None
    return suite


def parse_suites(specs: tuple[str, ...] | list[str]) -> tuple[EvalSuite, ...]:
    """Every suite of `eval.suites`; the names must differ (case ignored: they become
    TensorBoard tags and folder names)."""
    suites = tuple(parse_suite(s) for s in specs)
    seen: dict[str, str] = {}
    for s in suites:
        if s.name.lower() in seen:
            raise SuiteError(f"two eval suites are named {s.name!r}: {seen[s.name.lower()]!r}")
        seen[s.name.lower()] = s.name
    return suites


def _check_name(name: str, spec: str) -> None:
    if not _NAME.fullmatch(name):
        raise SuiteError(
            f"eval suite {spec!r}: the name {name!r} must be letters, digits, '_', '.' or '-' "
            "(it is used in metric keys and file names)"
        )
    if name.lower() in _RESERVED or name.lower().startswith(("avg@", "pass@")):
        raise SuiteError(f"eval suite {spec!r}: the name {name!r} is a metric's; choose another")


def _count(value: str, key: str, spec: str) -> int:
    if not value.isdigit():
        raise SuiteError(f"eval suite {spec!r}: {key}={value!r} must be a whole number >= 0")
    n = int(value)
    if key == "k" and n == 0:
        raise SuiteError(f"eval suite {spec!r}: k=0; leave k out for eval.num_samples")
    return n


@dataclasses.dataclass(frozen=True)
class LoadedSuite:
    """A suite with its problems and what was resolved for it.

    Attributes:
      suite: the suite as written.
      format: the format its rows were read with (None: the run's own field settings).
      template: the template its prompts are rendered with.
      problems: its problems (ids `<name>/<id>`, `meta` naming suite and template).
    """

    suite: EvalSuite
    format: BenchmarkFormat | None
    template: str
    problems: list[MathProblem]

    @property
    def title(self) -> str:
        return self.format.title if self.format is not None else self.suite.name


def suite_format(suite: EvalSuite) -> BenchmarkFormat | None:
    """The format `suite` is read with: its `format`, its name's, else the one its first
    row's keys identify, else None (the run's own field settings)."""
    fmt = suite.known_format()
    if fmt is not None:
        return fmt
    return detect_benchmark_format(first_row(suite.path))


def load_suite(suite: EvalSuite, fields: FieldSpec, template: str) -> LoadedSuite:
    """Reads `suite`'s problems.

    Args:
      fields: the field map of a suite without a known or detected format (the run's).
      template: the template of a suite that names none and has no format (the run's).

    Raises:
      SuiteError: naming the suite, for files that are missing or hold no usable row.
    """
    try:
        fmt = suite_format(suite)
        result = load_problems(suite.path, fmt.fields if fmt is not None else fields)
    except (OSError, ValueError) as e:
        raise SuiteError(f"eval suite {suite.name!r} ({suite.path}): {e}") from e
    problems = result.problems[: suite.max_prompts or None]
    template = suite.template or (fmt.template if fmt is not None else template)
    problems = [_stamped(p, suite.name, template) for p in problems]
    return LoadedSuite(suite, fmt, template, problems)


def _stamped(problem: MathProblem, name: str, template: str) -> MathProblem:
    meta = {**problem.meta, SUITE_KEY: name, TEMPLATE_KEY: template}
    return dataclasses.replace(problem, id=f"{name}/{problem.id}", meta=meta)


def describe(suite: LoadedSuite) -> str:
    """One line for the log: name, count, format, template, files."""
    fmt = suite.format.name if suite.format is not None else "the run's fields"
    return (
        f"{suite.suite.name}: {len(suite.problems)} problems ({fmt}, template "
        f"{suite.template!r}) from {os.fspath(suite.suite.path)}"
    )
