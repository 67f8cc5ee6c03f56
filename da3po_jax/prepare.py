"""The model and data of a real run on disk:
`python -m da3po_jax.prepare --out=DIR [--model=...] [--train=...] [--eval=...]`.

Writes, under `--out`:

- `models/<repo name>`: `--model`'s Hugging Face repository (default Qwen/Qwen3-4B-Base),
  only the files a run reads (`MODEL_FILES`), then checked as a run loads it: config.json
  (`ModelConfig.from_hf_folder`), every weight file's header, the tokenizer. A folder
  already there is checked and kept (`--overwrite` downloads what is missing or changed);
  a local folder given as `--model` is checked and used where it is.
- `data/<name>.jsonl`: each dataset of `--train` (default DAPO-Math-17K) and `--eval`
  (default the seven benchmarks of configs/da3po_qwen3.py), named by its built-in format
  (`data/benchmarks.py: BENCHMARK_FORMATS`), from the format's Hugging Face release
  (downloaded into `downloads/<name>`) or from `--files name=PATH` (a file, folder or glob
  of JSONL / Parquet files). Every row is read through the format's field map: malformed
  rows are skipped, counted and the first few named; repeated rows are dropped where the
  format dedupes (DAPO-Math-17K holds each problem about a hundred times); the kept rows
  are written as published, so the format's field map reads the file back (a suite named
  `aime2024` reads `data/aime2024.jsonl`).
- `overrides.txt`: the `--config` overrides that train and evaluate on these files (the
  k of each suite is the recipe's, `SUITE_K`), also printed, to paste after `--config=...`;
  `overrides.flags`: the same as an absl flag file, `--flagfile=OUT/overrides.flags` after
  `--config=...`.
- `prepare.json`: what was fetched or read, from where, the counts, and when.

Every refusal comes before anything is written: an unknown dataset (the known ones
listed), `--files` for a dataset not asked for, a dataset with no files under `--offline`,
AIME 2026 (no settled release) without `--files`, an output file that exists without
`--overwrite`. The datasets are converted before the model is downloaded and before any of
them is written, so a file with no usable row stops the command with none written. With
`--offline` nothing is downloaded: every dataset needs `--files`, and the model is a local
folder or one an earlier run downloaded.

Exit status: 0 once everything is written; 1 on an error, whose traceback is followed by
one last line `da3po_jax: error: ...` naming the problem.
"""

from __future__ import annotations

import dataclasses
import datetime
import fnmatch
import glob
import json
import logging
import math
import os
import re
import shlex
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from absl import app, flags

from da3po_jax.cli import setup_logging

if TYPE_CHECKING:  # the command imports the package's layers when it runs
    from da3po_jax.data.benchmarks import BenchmarkFormat
    from da3po_jax.data.readers import ReadReport

log = logging.getLogger("da3po_jax.prepare")

DEFAULT_MODEL = "Qwen/Qwen3-4B-Base"
DEFAULT_TRAIN = "dapo_math_17k"
# Samples per problem of each benchmark in the printed `eval.suites`, in the order of the
# recipe's tables: the DA3PO recipe's choice (configs/da3po_qwen3.py: 32 on the small AIME
# and AMC sets, where avg@1 is noise, 4 on the larger ones), not a property of a release; a
# benchmark missing here gets the config's `eval.num_samples`.
SUITE_K = {name: 32 for name in ("aime2024", "aime2025", "aime2026", "amc23")}
SUITE_K |= {name: 4 for name in ("minerva", "olympiadbench", "math500")}
DEFAULT_EVAL = tuple(SUITE_K)
# the files of a model repository that the loader and the tokenizer read
MODEL_FILES = tuple(
    "config.json generation_config.json *.safetensors model.safetensors.index.json "
    "tokenizer* vocab.json merges.txt special_tokens_map.json added_tokens.json "
    "chat_template.jinja".split()
)
DATA_FILES = ("*.parquet", "*.jsonl")  # a release's data files (not its README or metadata)
_READABLE = (".jsonl", ".json", ".parquet")
_RELEASE = re.compile(r"([\w.-]+/[\w.-]+)(?: \((\w+)\))?")  # `owner/name (subset)`
MAX_REPORTED = 5  # malformed rows named per dataset


class PrepareError(ValueError):
    """The command cannot prepare what was asked; the message names the problem."""


def release_of(fmt: BenchmarkFormat) -> tuple[str, tuple[str, ...]] | None:
    """(repository id, `allow_patterns` of its data files) of the first of `fmt.releases`
    that is a Hugging Face dataset id (`owner/name`, its subset in parentheses: only that
    subset's files), or None (AIME 2026: no settled release)."""
    for text in fmt.releases:
        found = _RELEASE.fullmatch(text)
        if found and found[2]:
            return found[1], tuple(f"*{found[2]}*{ext}" for ext in (".parquet", ".jsonl", ".json"))
        if found:
            return found[1], DATA_FILES
    return None


def fetch(repo_id: str, dest: str, *, repo_type: str = "model", allow_patterns=()) -> str:
    """Downloads the files of `repo_id` matching `allow_patterns` into folder `dest` and
    returns it: the command's one access to the network (files already there and
    unchanged are not downloaded again).

    Raises:
      PrepareError: the download failed (the Hub's error follows as its cause).
    """
    from huggingface_hub import snapshot_download

    log.info("downloading %s %s (%s) into %s", repo_type, repo_id, ", ".join(allow_patterns), dest)
    try:
        snapshot_download(
            repo_id, repo_type=repo_type, local_dir=dest, allow_patterns=list(allow_patterns)
        )
    except OSError as e:  # the Hub's errors (HTTP, offline mode, missing repository)
        raise PrepareError(
            f"cannot download the {repo_type} {repo_id!r} from the Hugging Face Hub; check "
            "the network (and HF_TOKEN for a gated repository), or pass --offline with "
            "--files and a local --model folder"
        ) from e
    return dest


@dataclasses.dataclass(frozen=True)
class Request:
    """One dataset to prepare: its format's name, `train` or `eval`, and the `--files`
    path that replaces its release ("" = the release)."""

    name: str
    role: str
    files: str = ""


def parse_requests(train: str, evals, files) -> list[Request]:
    """The datasets `--train`, `--eval` and `--files` ask for, by their formats' names.

    Raises:
      PrepareError: an unknown name (the known ones listed), a dataset asked for twice,
        or a `--files` entry that is not `name=PATH` or names no dataset asked for.
    """
    names = [(_format_name(train, "--train"), "train")] if train else []
    names += [(_format_name(n, "--eval"), "eval") for n in evals if n.strip()]
    seen = [n for n, _ in names]
    twice = sorted({n for n in seen if seen.count(n) > 1})
    if twice:
        raise PrepareError(f"{', '.join(twice)} asked for twice (--train, --eval)")
    paths: dict[str, str] = {}
    for item in files:
        name, eq, path = item.partition("=")
        if not eq or not path.strip():
            raise PrepareError(f"--files entry {item!r} is not NAME=PATH")
        name = _format_name(name, "--files")
        if name not in seen:
            raise PrepareError(
                f"--files names {name!r}, which is not asked for by --train or --eval "
                f"({', '.join(seen) or 'nothing'})"
            )
        paths[name] = os.path.abspath(os.path.expanduser(path.strip()))
    return [Request(n, role, paths.get(n, "")) for n, role in names]


def _format_name(name: str, flag: str) -> str:
    from da3po_jax.data.benchmarks import BENCHMARK_FORMATS, get_benchmark_format

    try:
        return get_benchmark_format(name.strip()).name
    except ValueError:
        raise PrepareError(
            f"{flag}: unknown dataset {name.strip()!r}; known: {', '.join(BENCHMARK_FORMATS)}"
        ) from None


def check_requests(requests: list[Request], out: str, offline: bool, overwrite: bool) -> None:
    """Refuses, before anything is written, a dataset without files to read and an
    output file in the way (see the module docstring)."""
    from da3po_jax.data.benchmarks import get_benchmark_format

    missing = [r.name for r in requests if not r.files]
    if offline and missing:
        raise PrepareError(
            f"--offline and no --files for {', '.join(missing)}: pass --files=NAME=PATH "
            "for each (a JSONL / Parquet file, folder or glob of its release), or leave "
            "them out of --train / --eval"
        )
    for r in requests:
        fmt = get_benchmark_format(r.name)
        if not r.files and release_of(fmt) is None:
            raise PrepareError(
                f"{fmt.title} has no settled Hugging Face release (its format reads "
                f"{', '.join(fmt.releases)}): download one and pass --files={r.name}=PATH"
            )
        if r.files:
            input_files(r.files)  # nothing there is refused now
    outputs = [data_path(out, r.name) for r in requests]
    outputs += [os.path.join(out, n) for n in ("overrides.txt", "overrides.flags", "prepare.json")]
    taken = [p for p in outputs if os.path.exists(p)]
    if taken and not overwrite:
        raise PrepareError(
            f"{', '.join(taken)} already exist{'s' if len(taken) == 1 else ''}; pass "
            "--overwrite to replace them (nothing was written)"
        )


def data_path(out: str, name: str) -> str:
    """Where dataset `name` is written."""
    return os.path.join(out, "data", f"{name}.jsonl")


def input_files(path: str) -> list[str]:
    """The JSONL / Parquet files of a file, folder (its files, not its subfolders') or
    glob, sorted.

    Raises:
      FileNotFoundError: nothing readable matches `path`.
    """
    if os.path.isdir(path):
        found = [os.path.join(path, n) for n in os.listdir(path)]
    elif any(c in path for c in "*?["):
        found = glob.glob(path)
    else:
        found = [path] if os.path.exists(path) else []
    found = sorted(f for f in found if os.path.isfile(f) and f.endswith(_READABLE))
    if not found:
        raise FileNotFoundError(f"no .jsonl, .json or .parquet files match {path!r}")
    return found


def release_files(fmt: BenchmarkFormat, out: str) -> tuple[str, list[str]]:
    """(`hf:<repo id>`, its data files) of `fmt`'s release, downloaded under `out`."""
    repo_id, patterns = release_of(fmt)
    dest = os.path.join(out, "downloads", fmt.name)
    fetch(repo_id, dest, repo_type="dataset", allow_patterns=patterns)
    found = []
    for root, dirs, names in os.walk(dest):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # the Hub's .cache
        for n in names:
            rel = os.path.relpath(os.path.join(root, n), dest)
            if any(fnmatch.fnmatch(rel, p) for p in patterns):
                found.append(os.path.join(root, n))
    if not found:
        raise PrepareError(
            f"the release {repo_id} of {fmt.title} holds no files matching "
            f"{', '.join(patterns)}; pass --files={fmt.name}=PATH"
        )
    return f"hf:{repo_id}", sorted(found)


@dataclasses.dataclass
class Converted:
    """A dataset read through its format's field map, not yet written: from `source`
    (`hf:<repo id>` or the `--files` path), its `files`, the kept `rows` as published,
    and the `report` (rows read, kept, skipped by reason, duplicates, first errors)."""

    request: Request
    fmt: BenchmarkFormat
    source: str
    files: list[str]
    rows: list[Any]
    report: ReadReport


def convert(request: Request, out: str) -> Converted:
    """Reads `request`'s files (its release's, downloaded, or `--files`) through its
    format's field map.

    Raises:
      PrepareError: no usable row (the counts and the first errors named).
    """
    from da3po_jax.data.benchmarks import get_benchmark_format
    from da3po_jax.data.readers import ReadReport

    fmt = get_benchmark_format(request.name)
    if request.files:
        source, files = request.files, input_files(request.files)
    else:
        source, files = release_files(fmt, out)
    report = ReadReport(source=source)
    rows, seen = [], set()
    for path in files:
        log.info("%s: reading %s", fmt.title, path)
        for row, problem in _parsed(path, fmt, report):
            if fmt.fields.dedupe:
                if (problem.prompt, problem.answer) in seen:
                    report.num_duplicates += 1
                    continue
                seen.add((problem.prompt, problem.answer))
            rows.append(row)
    report.num_kept = len(rows)
    if not rows:
        errors = "; ".join(f"row {n}: {e}" for n, e in report.first_errors)
        raise PrepareError(
            f"{fmt.title}: no usable rows in {', '.join(files)} ({report.num_rows} rows read, "
            f"{report.num_skipped} malformed, {report.num_duplicates} duplicates"
            f"{'; ' + errors if errors else ''}); are these files {fmt.title}'s release?"
        )
    return Converted(request, fmt, source, files, rows, report)


def _parsed(path: str, fmt: BenchmarkFormat, report: ReadReport) -> Iterator[tuple]:
    """(row, its `MathProblem`) of every well-formed row of `path`; every row is counted
    in `report`, and the first malformed ones are logged."""
    from tqdm import tqdm

    from da3po_jax.data.readers import (
        MalformedRow,
        check_regular_file,
        jsonl_rows,
        parquet_rows,
        parse_row,
    )

    check_regular_file(path)
    name = os.path.basename(path)
    rows = parquet_rows(path, 4096) if path.endswith(".parquet") else jsonl_rows(path)
    # a bar once a file has taken 2 s (DAPO-Math-17K's 1.8M rows), none for a benchmark
    rows = tqdm(rows, desc=fmt.name, unit=" rows", leave=False, dynamic_ncols=True, delay=2)
    for number, index, row in rows:
        report.num_rows += 1
        try:
            if isinstance(row, MalformedRow):
                raise row
            problem = parse_row(row, fmt.fields, default_id=f"{name}:{index}", source=name)
        except MalformedRow as e:
            report.skipped[e.reason] += 1
            if len(report.first_errors) < MAX_REPORTED:
                report.first_errors.append((number, f"{name}: {e}"))
                log.warning("%s: skipping malformed row %d: %s", path, number, e)
            continue
        yield row, problem


def _jsonl(rows: list[Any]) -> str:
    """`rows` as JSONL; a value JSON lacks (a Parquet timestamp) as its text."""
    return "".join(json.dumps(row, ensure_ascii=False, default=str) + "\n" for row in rows)


def write_text(path: str, text: str) -> None:
    """`text` at `path`, written whole then renamed (a reader never sees half a file)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def prepare_model(model: str, out: str, offline: bool, overwrite: bool) -> dict[str, Any]:
    """`--model` as a checked folder: a local folder as it is; a repository id downloaded
    into `out/models/<repo name>` (kept when already there, unless `overwrite`)."""
    if os.path.isdir(model):
        return {"source": os.path.abspath(model), "fetched": False, **check_model(model)}
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", model):
        raise PrepareError(
            f"--model {model!r} is neither a folder nor a Hugging Face repository id "
            "(owner/name); --model= prepares no model"
        )
    path = os.path.join(out, "models", model.split("/")[1])
    there = os.path.isdir(path) and bool(os.listdir(path))
    if offline or (there and not overwrite):
        if not there:
            raise PrepareError(
                f"--offline and no model folder {path!r}: run once with the network, or pass "
                "--model=FOLDER (a local Hugging Face folder) or --model= (none)"
            )
        log.info("model folder %s exists: checking it (--overwrite downloads it again)", path)
        try:
            return {"source": model, "fetched": False, **check_model(path)}
        except (OSError, ValueError) as e:
            raise PrepareError(
                f"the model folder {path!r} is incomplete or damaged ({e}); pass --overwrite "
                "to download what is missing"
            ) from e
    fetch(model, path, repo_type="model", allow_patterns=MODEL_FILES)
    return {"source": model, "fetched": True, **check_model(path)}


def check_model(path: str) -> dict[str, Any]:
    """What a run reads of model folder `path`, checked: config.json
    (`ModelConfig.from_hf_folder`), the weight files' headers and the tokenizer.

    Raises:
      FileNotFoundError / ValueError: naming the missing or broken file.
    """
    from da3po_jax.models.config import ModelConfig
    from da3po_jax.models.safetensors_io import SafetensorsFile
    from da3po_jax.models.tokenizer import Tokenizer

    path = os.path.abspath(path)
    model_config = ModelConfig.from_hf_folder(path)
    count = 0
    for name in _weight_files(path):
        weights = SafetensorsFile(os.path.join(path, name))
        count += sum(math.prod(weights.shape(k)) for k in weights.keys())
    Tokenizer.load(path)
    return {
        "path": path,
        "model_type": model_config.model_type,
        "num_layers": model_config.num_layers,
        "parameters": count,
    }


def _weight_files(path: str) -> list[str]:
    """The safetensors files the loader reads: those `model.safetensors.index.json` lists,
    else `model.safetensors`."""
    index = os.path.join(path, "model.safetensors.index.json")
    if not os.path.isfile(index):
        if not os.path.isfile(os.path.join(path, "model.safetensors")):
            raise FileNotFoundError(
                f"no model.safetensors or model.safetensors.index.json in model folder {path!r}"
            )
        return ["model.safetensors"]
    try:
        with open(index, encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"checkpoint index {index} has no valid 'weight_map' ({e})") from e
    absent = [n for n in files if not os.path.isfile(os.path.join(path, n))]
    if absent:
        raise FileNotFoundError(f"{index} lists {', '.join(absent)}, missing from {path!r}")
    return files


def override_fields(model_path: str, converted: list[Converted], out: str) -> list[tuple[str, str]]:
    """The config fields (dotted, value) that read the prepared files: the model, the
    training set (its format's template) and the benchmarks as `eval.suites`, each at
    `SUITE_K`'s k."""
    from da3po_jax.data.suites import EvalSuite

    fields = [("model.path", model_path)] if model_path else []
    for c in converted:
        if c.request.role == "train":
            fields += [
                ("data.source", "jsonl"),
                ("data.train_path", data_path(out, c.fmt.name)),
                ("data.template", c.fmt.template),
            ]
    specs = [
        EvalSuite(c.fmt.name, data_path(out, c.fmt.name), k=SUITE_K.get(c.fmt.name, 0)).spec()
        for c in converted
        if c.request.role == "eval"
    ]
    if specs:  # a Python tuple of double-quoted strings
        suites = "(" + ", ".join(json.dumps(s) for s in specs) + ("," if len(specs) == 1 else "")
        fields.append(("eval.suites", suites + ")"))
    return fields


def format_overrides(args: list[str]) -> str:
    """The overrides as pasted after `--config=...`: one per line, continued."""
    return " \\\n  ".join(args) + "\n"


def dataset_record(c: Converted, out: str) -> dict[str, Any]:
    """A converted dataset's entry of `prepare.json`."""
    report = c.report
    return {
        "name": c.fmt.name,
        "title": c.fmt.title,
        "role": c.request.role,
        "source": c.source,
        "files": c.files,
        "path": data_path(out, c.fmt.name),
        "rows": report.num_rows,
        "kept": report.num_kept,
        "skipped": dict(report.skipped),
        "duplicates": report.num_duplicates,
        "first_errors": [f"row {n}: {e}" for n, e in report.first_errors],
        "template": c.fmt.template,
        "k": SUITE_K.get(c.fmt.name) if c.request.role == "eval" else None,
    }


def run_prepare(
    out: str,
    model: str = DEFAULT_MODEL,
    train: str = DEFAULT_TRAIN,
    evals=DEFAULT_EVAL,
    files=(),
    *,
    offline: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Prepares what the module docstring lists and returns `prepare.json`'s content.

    Raises:
      PrepareError: a refusal (before anything is written) or a dataset with no usable row
        (before any is written).
    """
    if not out or not out.strip():
        raise PrepareError("--out is empty: name a folder")
    out = os.path.abspath(os.path.expanduser(out))
    if os.path.exists(out) and not os.path.isdir(out):
        raise PrepareError(f"--out {out!r} exists and is not a folder")
    requests = parse_requests(train, evals, files)
    check_requests(requests, out, offline, overwrite)
    converted = [convert(r, out) for r in requests]
    model_info = prepare_model(model, out, offline, overwrite) if model else None
    for c in converted:
        log.info("%s: writing %d rows to %s", c.fmt.title, len(c.rows), data_path(out, c.fmt.name))
        write_text(data_path(out, c.fmt.name), _jsonl(c.rows))
    fields = override_fields(model_info["path"] if model_info else "", converted, out)
    args = [f"--config.{field}={shlex.quote(value)}" for field, value in fields]  # shell words
    manifest = {
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "out": out,
        "offline": offline,
        "model": model_info,
        "datasets": [dataset_record(c, out) for c in converted],
        "overrides": args,
    }
    write_text(os.path.join(out, "overrides.txt"), format_overrides(args))
    # the same as an absl flag file: one unquoted --config.<field>=<value> per line
    flagfile = "".join(f"--config.{field}={value}\n" for field, value in fields)
    write_text(os.path.join(out, "overrides.flags"), flagfile)
    write_text(os.path.join(out, "prepare.json"), json.dumps(manifest, indent=2) + "\n")
    return manifest


def format_summary(manifest: dict[str, Any]) -> str:
    """What the command prints: the model, one row per dataset, then the overrides."""
    lines = []
    m = manifest["model"]
    if m:
        lines.append(
            f"model {m['source']}: {m['path']} ({m['model_type']}, {m['num_layers']} layers, "
            f"{m['parameters']:,} parameters)"
        )
    head = f"{'dataset':<15} {'rows':>9} {'kept':>7} {'skipped':>8} {'duplicates':>11}"
    lines.append(f"  {head}  template  file")
    for d in manifest["datasets"]:
        lines.append(
            f"  {d['name']:<15} {d['rows']:>9} {d['kept']:>7} {sum(d['skipped'].values()):>8} "
            f"{d['duplicates']:>11}  {d['template']:<9} {d['path']}"
        )
    where = os.path.join(manifest["out"], "overrides")
    lines.append(f"overrides for --config=... (also in {where}.txt; --flagfile={where}.flags):")
    lines.append(format_overrides(manifest["overrides"]).rstrip("\n"))
    return "\n".join(lines)


def define_flags() -> dict[str, Any]:
    """The command's flags (by `run_prepare`'s argument each sets), defined when it runs
    (`python -m da3po_jax.prepare`), not when the module is imported, as `eval`'s."""
    return {
        "out": flags.DEFINE_string(
            "out", None, "Folder to write models/, data/, overrides.txt into.", required=True
        ),
        "model": flags.DEFINE_string(
            "model",
            DEFAULT_MODEL,
            "Hugging Face model repository (owner/name) to download into OUT/models, or a "
            "local model folder to check and use; '' = no model.",
        ),
        "train": flags.DEFINE_string(
            "train", DEFAULT_TRAIN, "Training set, a built-in format's name; '' = none."
        ),
        "evals": flags.DEFINE_list(
            "eval", list(DEFAULT_EVAL), "Benchmarks, built-in formats' names; '' = none."
        ),
        "files": flags.DEFINE_list(
            "files",
            [],
            "NAME=PATH,...: read dataset NAME from PATH (a JSONL / Parquet file, folder or "
            "glob of its release) instead of downloading it.",
        ),
        "offline": flags.DEFINE_bool(
            "offline", False, "Download nothing: --files for every dataset, a local model."
        ),
        "overwrite": flags.DEFINE_bool(
            "overwrite", False, "Replace existing output files; download the model again."
        ),
    }


def main(argv: list[str], f: dict[str, Any]) -> None:
    """The command: the summary and the overrides on stdout; exit status 1 and a last
    stderr line naming the problem on any error."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from da3po_jax.runtime.signals import run_reporting_errors  # after flags: fast --help

    setup_logging()

    def run() -> None:
        manifest = run_prepare(**{name: flag.value for name, flag in f.items()})
        print(format_summary(manifest))

    code = run_reporting_errors(run)
    if code is not None:
        sys.stdout.flush()
        sys.exit(code)


if __name__ == "__main__":
    _flags = define_flags()
    app.run(lambda argv: main(argv, _flags))
