"""`python -m da3po_jax.prepare`: every benchmark fixture (rows in its release's published
shape) converted offline and read back by the library as the fixture itself reads; the
download path with the Hub replaced by a copy of the fixtures (`fetch` monkeypatched) and
a tiny model folder; the refusals, each before anything is written; the printed overrides
accepted by the config; the command line's exit status and last line. Nothing here
reaches the network: every test that downloads replaces `fetch`, and every other one
replaces it with a function that fails."""

from __future__ import annotations

import fnmatch
import json
import os
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest
from absl import flags
from ml_collections import config_flags

import da3po_jax.prepare as prepare_lib
from da3po_jax.config import resolve_settings
from da3po_jax.data import FieldSpec, get_benchmark_format, load_benchmark
from da3po_jax.data.suites import load_suite, parse_suite, parse_suites
from da3po_jax.models.presets import get_preset
from da3po_jax.models.safetensors_io import save_safetensors
from da3po_jax.prepare import PrepareError, run_prepare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "data", "fixtures", "benchmarks")

# every fixture file -> the dataset (built-in format) whose release it imitates
FIXTURE_FORMATS = {
    "dapo_math_17k.parquet": "dapo_math_17k",
    "math500.jsonl": "math500",
    "aime2024.jsonl": "aime2024",
    "aime2024_h4.jsonl": "aime2024",
    "aime2025.jsonl": "aime2025",
    "aime2025_question.jsonl": "aime2025",
    "aime2026.jsonl": "aime2026",
    "amc23.jsonl": "amc23",
    "minerva.jsonl": "minerva",
    "minerva_problem.jsonl": "minerva",
    "olympiadbench.jsonl": "olympiadbench",
}
# one fixture per dataset, in a release's layout: name -> (fixture, path in the repository)
RELEASE_LAYOUT = {
    "dapo_math_17k": ("dapo_math_17k.parquet", "data/dapo-math-17k.parquet"),
    "math500": ("math500.jsonl", "test.jsonl"),
    "aime2024": ("aime2024.jsonl", "aime_2024_problems.jsonl"),
    "aime2025": ("aime2025.jsonl", "aime2025-I.jsonl"),
    "amc23": ("amc23.jsonl", "data/test-00000-of-00001.jsonl"),
    "minerva": ("minerva.jsonl", "data/test-00000-of-00001.jsonl"),
    "olympiadbench": ("olympiadbench.jsonl", "OE_TO_maths_en_COMP/train-00000-of-00001.jsonl"),
}


def fixture(name: str) -> str:
    return os.path.join(FIXTURES, name)


def fields_of(problems) -> list[tuple]:
    """What a run reads of each problem, ids aside (a release without an id field gets
    `<file name>:<row>`, and the file is renamed)."""
    return [(p.prompt, p.answer, p.tier, p.solution, p.meta.get("fields")) for p in problems]


def refuse_fetch(*args, **kwargs):
    raise AssertionError(f"fetch called offline: {args} {kwargs}")


@pytest.fixture
def no_network(monkeypatch):
    """`fetch` replaced by a function that fails: an offline run must never call it."""
    monkeypatch.setattr(prepare_lib, "fetch", refuse_fetch)


def offline(out, evals=(), train="", files=(), **kwargs):
    return run_prepare(str(out), "", train, list(evals), list(files), offline=True, **kwargs)


def test_every_fixture_is_converted_here():
    assert set(os.listdir(FIXTURES)) == set(FIXTURE_FORMATS)


@pytest.mark.parametrize("name", sorted(FIXTURE_FORMATS))
def test_a_release_converted_offline_reads_back_as_the_release(name, tmp_path, no_network):
    dataset = FIXTURE_FORMATS[name]
    train = dataset == "dapo_math_17k"
    manifest = offline(
        tmp_path,
        evals=() if train else [dataset],
        train=dataset if train else "",
        files=[f"{dataset}={fixture(name)}"],
    )
    path = str(tmp_path / "data" / f"{dataset}.jsonl")
    expected = load_benchmark(fixture(name), dataset)
    assert fields_of(load_benchmark(path, dataset).problems) == fields_of(expected.problems)
    suite = load_suite(parse_suite(f"{dataset} path={path}"), FieldSpec(), "tiny")
    assert fields_of(suite.problems) == fields_of(expected.problems)
    assert suite.template == get_benchmark_format(dataset).template
    (record,) = manifest["datasets"]
    assert record["rows"] == expected.report.num_rows
    assert record["kept"] == len(expected.problems)
    assert record["duplicates"] == expected.report.num_duplicates
    assert record["template"] == get_benchmark_format(dataset).template
    assert record["files"] == [fixture(name)] and record["path"] == path


def test_dapo_math_17k_is_deduplicated_and_kept_in_its_published_layout(tmp_path, no_network):
    manifest = offline(
        tmp_path, train="DAPO-Math-17K", files=[f"dapo-math-17k={fixture('dapo_math_17k.parquet')}"]
    )
    (record,) = manifest["datasets"]
    assert (record["rows"], record["kept"], record["duplicates"]) == (4, 3, 1)
    with open(tmp_path / "data" / "dapo_math_17k.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 3 and rows[0]["prompt"][0]["role"] == "user"
    assert rows[0]["reward_model"]["ground_truth"] == "36"
    assert rows[0]["extra_info"]["index"] == "9a6b1f0e-3c2d-4e8f-a1b2-c3d4e5f60718"


def test_olympiadbench_list_answers_and_math500_tiers_survive(tmp_path, no_network):
    offline(
        tmp_path,
        evals=["olympiadbench", "MATH-500"],
        files=[
            f"olympiadbench={fixture('olympiadbench.jsonl')}",
            f"math500={fixture('math500.jsonl')}",
        ],
    )
    data = tmp_path / "data"
    olympiad = load_benchmark(str(data / "olympiadbench.jsonl"), "olympiadbench").problems
    assert [p.answer for p in olympiad[:2]] == ["3, -2", "(1,2), (2,1)"]
    math500 = load_benchmark(str(data / "math500.jsonl"), "math500").problems
    assert [p.tier for p in math500] == ["Level 2", "Level 3", "Level 5", "Level 1"]
    assert math500[0].id == "test/precalculus/418.json"


def test_malformed_rows_are_skipped_counted_and_named(tmp_path, no_network):
    source = tmp_path / "aime.jsonl"
    rows = [
        '{"problem": "What is 1+1?", "answer": "2"}',
        "{not json",
        '{"problem": "What is 2+2?"}',
        '{"problem": "What is 3+3?", "answer": 6}',
    ]
    source.write_text("\n".join(rows) + "\n")
    manifest = offline(tmp_path / "out", evals=["aime2025"], files=[f"aime2025={source}"])
    (record,) = manifest["datasets"]
    assert (record["rows"], record["kept"]) == (4, 2)
    assert record["skipped"] == {"bad JSON": 1, "missing answer": 1}
    assert [e.split(":")[0] for e in record["first_errors"]] == ["row 2", "row 3"]
    written = (tmp_path / "out" / "data" / "aime2025.jsonl").read_text().splitlines()
    assert [json.loads(r) for r in written] == [json.loads(rows[0]), json.loads(rows[3])]


def test_a_folder_or_glob_of_files_is_one_dataset(tmp_path, no_network):
    manifest = offline(tmp_path, evals=["aime2025"], files=[f"aime2025={FIXTURES}/aime2025*.jsonl"])
    (record,) = manifest["datasets"]
    assert record["kept"] == 6 and len(record["files"]) == 2


# ---------------------------------------------------------------------------- refusals
def test_an_unknown_dataset_is_refused_with_the_known_ones(tmp_path, no_network):
    with pytest.raises(PrepareError, match="--eval: unknown dataset 'aime2030'; known: ") as e:
        offline(tmp_path / "out", evals=["aime2030"])
    assert "dapo_math_17k" in str(e.value) and "olympiadbench" in str(e.value)
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(evals=["aime2024", "minerva"]), "--offline and no --files for aime2024, minerva"),
        (dict(evals=["amc23"], files=["math500=x.jsonl"]), "--files names 'math500', which"),
        (dict(evals=["amc23"], files=["amc23"]), "--files entry 'amc23' is not NAME=PATH"),
        (dict(evals=["amc23", "AMC23"]), "amc23 asked for twice"),
        (dict(evals=["amc23"], files=["amc23=/nowhere/*.jsonl"]), "no .jsonl, .json or"),
    ],
)
def test_a_request_without_files_is_refused_before_anything_is_written(
    kwargs, message, tmp_path, no_network
):
    with pytest.raises((PrepareError, FileNotFoundError), match=message):
        offline(tmp_path / "out", **kwargs)
    assert not os.path.exists(tmp_path / "out")


def test_aime2026_asks_for_files_since_it_has_no_release(tmp_path, no_network):
    with pytest.raises(PrepareError, match="AIME 2026 has no settled Hugging Face release"):
        run_prepare(str(tmp_path / "out"), "", "", ["aime2026"])
    assert not os.path.exists(tmp_path / "out")


def test_an_existing_output_is_kept_without_overwrite(tmp_path, no_network):
    out = tmp_path / "out"
    offline(out, evals=["amc23"], files=[f"amc23={fixture('amc23.jsonl')}"])
    before = {
        n: (out / n).read_bytes() for n in ("data/amc23.jsonl", "overrides.txt", "prepare.json")
    }
    asked = ["amc23", "math500"]
    files = [f"amc23={fixture('minerva.jsonl')}", f"math500={fixture('math500.jsonl')}"]
    with pytest.raises(PrepareError, match="amc23.jsonl.*already exist.*pass --overwrite"):
        offline(out, evals=asked, files=files)
    assert {n: (out / n).read_bytes() for n in before} == before
    assert not (out / "data" / "math500.jsonl").exists()
    offline(out, evals=asked, files=files, overwrite=True)
    assert (out / "data" / "amc23.jsonl").read_bytes() != before["data/amc23.jsonl"]


def test_a_file_without_a_usable_row_writes_nothing(tmp_path, no_network):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "no answer here"}\n{broken\n')
    with pytest.raises(PrepareError, match=r"AMC 2023: no usable rows in .*bad.jsonl \(2 rows"):
        offline(
            tmp_path / "out",
            evals=["math500", "amc23"],
            files=[f"math500={fixture('math500.jsonl')}", f"amc23={bad}"],
        )
    assert not os.path.exists(tmp_path / "out" / "data")


def test_an_offline_model_must_be_a_folder(tmp_path, no_network):
    with pytest.raises(PrepareError, match="--offline and no model folder .*Qwen3-4B-Base"):
        run_prepare(str(tmp_path), "Qwen/Qwen3-4B-Base", "", [], offline=True)
    with pytest.raises(PrepareError, match="neither a folder nor a Hugging Face repository"):
        run_prepare(str(tmp_path), "no-such-folder", "", [], offline=True)


# ----------------------------------------------------------------- with the Hub (mocked)
def write_model(folder: str, tokenizer_dir: str) -> int:
    """A tiny model folder as the Hub serves it; returns its parameter count."""
    os.makedirs(folder, exist_ok=True)
    model_config = get_preset("tiny-qwen2")
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(model_config.to_hf_dict(), f)
    embed = np.zeros((model_config.vocab_size, model_config.hidden_size), np.float32)
    save_safetensors(
        os.path.join(folder, "model.safetensors"), {"model.embed_tokens.weight": embed}
    )
    for name in os.listdir(tokenizer_dir):
        shutil.copy(os.path.join(tokenizer_dir, name), folder)
    return embed.size


@pytest.fixture
def hub(monkeypatch, tokenizer_dir):
    """`fetch` replaced by a copy of the fixtures laid out as the releases are, each file
    copied only where `allow_patterns` admits it (as the Hub filters them); records the
    calls."""
    calls = []
    releases = {prepare_lib.release_of(get_benchmark_format(n))[0]: n for n in RELEASE_LAYOUT}

    def fake_fetch(repo_id, dest, *, repo_type="model", allow_patterns=()):
        calls.append((repo_id, repo_type, tuple(allow_patterns)))
        if repo_type == "model":
            write_model(dest, tokenizer_dir)
            return dest
        name, target = RELEASE_LAYOUT[releases[repo_id]]
        offered = {target: fixture(name), "README.md": fixture("amc23.jsonl")}
        offered["OE_TO_physics_en_COMP/train.jsonl"] = fixture("minerva.jsonl")  # other subset
        for rel, src in offered.items():
            if any(fnmatch.fnmatch(rel, p) for p in allow_patterns):
                os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
                shutil.copy(src, os.path.join(dest, rel))
        return dest

    monkeypatch.setattr(prepare_lib, "fetch", fake_fetch)
    return calls


def test_the_download_path_fetches_the_releases_and_the_model(tmp_path, hub):
    out = str(tmp_path / "out")
    evals = ["aime2024", "aime2025", "aime2026", "amc23", "minerva", "olympiadbench", "math500"]
    manifest = run_prepare(
        out, "Qwen/Qwen3-4B-Base", "dapo_math_17k", evals, [f"aime2026={fixture('aime2026.jsonl')}"]
    )
    model_dir = os.path.join(out, "models", "Qwen3-4B-Base")
    assert hub[-1] == ("Qwen/Qwen3-4B-Base", "model", prepare_lib.MODEL_FILES)
    assert {c[0] for c in hub[:-1]} == {
        "BytedTsinghua-SIA/DAPO-Math-17k",
        "Maxwell-Jia/AIME_2024",
        "opencompass/AIME2025",
        "math-ai/amc23",
        "math-ai/minervamath",
        "Hothan/OlympiadBench",
        "HuggingFaceH4/MATH-500",
    }
    assert all(c[1] == "dataset" for c in hub[:-1])
    model = manifest["model"]
    assert model["path"] == model_dir and model["fetched"] and model["model_type"] == "qwen2"
    records = {d["name"]: d for d in manifest["datasets"]}
    assert records["olympiadbench"]["source"] == "hf:Hothan/OlympiadBench"
    assert [os.path.relpath(f, out) for f in records["olympiadbench"]["files"]] == [
        "downloads/olympiadbench/OE_TO_maths_en_COMP/train-00000-of-00001.jsonl"
    ]
    assert records["aime2026"]["source"] == fixture("aime2026.jsonl")
    assert records["dapo_math_17k"]["kept"] == 3
    for name in evals:
        written = os.path.join(out, "data", f"{name}.jsonl")
        assert len(load_benchmark(written, name).problems) == records[name]["kept"]
    with open(os.path.join(out, "prepare.json")) as f:
        assert json.load(f) == manifest
    summary = prepare_lib.format_summary(manifest).splitlines()
    assert (
        summary[0] == f"model Qwen/Qwen3-4B-Base: {model_dir} (qwen2, 2 layers, 32,768 parameters)"
    )
    check_overrides_resolve(out, manifest)


def check_overrides_resolve(out: str, manifest: dict) -> None:
    """The printed overrides, pasted after configs/tiny_math.py, give a config that
    resolves and reads the prepared files."""
    from da3po_jax.run.inputs import load_datasets

    with open(os.path.join(out, "overrides.txt")) as f:
        text = f.read()
    assert text == prepare_lib.format_overrides(manifest["overrides"])
    argv = ["prog", f"--config={ROOT}/configs/tiny_math.py", *shlex.split(text)]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
    values(argv)
    # The flag file gives the same config as the shell-quoted overrides.
    flagged = ["prog", f"--config={ROOT}/configs/tiny_math.py"]
    flagged.append(f"--flagfile={os.path.join(out, 'overrides.flags')}")
    from_file = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=from_file, sys_argv=flagged)
    from_file(flagged)
    assert from_file.config.to_dict() == values.config.to_dict()
    settings = resolve_settings(values.config, inputs=False)
    assert settings.model.path == os.path.join(out, "models", "Qwen3-4B-Base")
    assert settings.data.train_path == os.path.join(out, "data", "dapo_math_17k.jsonl")
    assert settings.data.template == "raw"
    ks = {s.name: s.k for s in settings.eval_suites}
    assert ks == prepare_lib.SUITE_K
    data = load_datasets(settings.data, settings.seed, settings.eval_suites)
    assert len(data.train) == 3
    assert [len(s.problems) for s in data.suites] == [
        d["kept"] for d in manifest["datasets"] if d["role"] == "eval"
    ]


def test_a_downloaded_model_is_checked_and_kept_offline(tmp_path, hub, monkeypatch):
    out = str(tmp_path)
    run_prepare(out, "Qwen/Qwen3-4B-Base", "", [])
    assert len(hub) == 1
    monkeypatch.setattr(prepare_lib, "fetch", refuse_fetch)
    manifest = run_prepare(out, "Qwen/Qwen3-4B-Base", "", [], offline=True, overwrite=True)
    assert not manifest["model"]["fetched"] and manifest["model"]["parameters"] > 0
    os.remove(os.path.join(out, "models", "Qwen3-4B-Base", "model.safetensors"))
    with pytest.raises(PrepareError, match="incomplete or damaged .*no model.safetensors"):
        run_prepare(out, "Qwen/Qwen3-4B-Base", "", [], offline=True, overwrite=True)


def test_a_local_model_folder_is_used_where_it_is(tmp_path, tokenizer_dir, no_network):
    folder = str(tmp_path / "my_model")
    count = write_model(folder, tokenizer_dir)
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {"model.embed_tokens.weight": "model.safetensors"}}, f)
    manifest = run_prepare(str(tmp_path / "out"), folder, "", [], offline=True)
    assert manifest["model"]["path"] == folder and manifest["model"]["parameters"] == count
    assert manifest["overrides"] == [f"--config.model.path={folder}"]
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {"lm_head.weight": "model-2.safetensors"}}, f)
    with pytest.raises(FileNotFoundError, match="lists model-2.safetensors, missing"):
        run_prepare(str(tmp_path / "out"), folder, "", [], offline=True, overwrite=True)


def test_the_k_table_is_the_recipes():
    recipe = os.path.join(ROOT, "configs", "da3po_qwen3_4b.py")
    if not os.path.exists(recipe):
        pytest.skip("configs/da3po_qwen3_4b.py is not there")
    import importlib.util

    spec = importlib.util.spec_from_file_location("da3po_qwen3_4b", recipe)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    suites = parse_suites(module.get_config().eval.suites)
    assert {s.name: s.k for s in suites} == prepare_lib.SUITE_K
    assert tuple(s.name for s in suites) == prepare_lib.DEFAULT_EVAL


# ------------------------------------------------------------------------ command line
def cli(*args: str) -> tuple[int, str, str]:
    cmd = [sys.executable, "-m", "da3po_jax.prepare", *args]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    return done.returncode, done.stdout, lines[-1] if lines else ""


def test_the_command_line(tmp_path):
    out = str(tmp_path / "out")
    files = f"dapo_math_17k={fixture('dapo_math_17k.parquet')},math500={fixture('math500.jsonl')}"
    code, stdout, last = cli(
        f"--out={out}", "--model=", "--eval=math500", f"--files={files}", "--offline"
    )
    assert code == 0, last
    assert "  dapo_math_17k           4       3        0           1  raw" in stdout
    assert stdout.rstrip("\n").endswith(
        f"--config.eval.suites='(\"math500 path={out}/data/math500.jsonl k=4\",)'"
    )
    code, _, last = cli(f"--out={out}", "--model=", "--eval=math500,aime2030", "--offline")
    assert code == 1
    assert last.startswith("da3po_jax: error: PrepareError: --eval: unknown dataset 'aime2030'")
