"""Evaluation suites: the string a recipe writes (`parse_suite`), the files it names read
with the benchmark's field map and template (`load_suite`), the config field's refusals,
and the tables the reports print (`suite_average`, `suite_table`, `format_suite_table`)
against hand-computed values."""

from __future__ import annotations

import os
import shutil

import pytest

from da3po_jax.config import resolve_settings
from da3po_jax.config.resolve import with_added_fields
from da3po_jax.data import FieldSpec
from da3po_jax.data.suites import (
    SUITE_KEY,
    TEMPLATE_KEY,
    EvalSuite,
    SuiteError,
    load_suite,
    parse_suite,
    parse_suites,
)
from da3po_jax.run.evaluation import EvalSet, format_suite_table, suite_average, suite_table

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures", "benchmarks")


def fixture(name: str) -> str:
    return os.path.join(FIXTURES, name)


def test_a_suite_string_reads_back_as_written():
    suite = parse_suite("aime2024 path=/data/aime.parquet k=32")
    assert suite == EvalSuite("aime2024", "/data/aime.parquet", k=32)
    assert suite.title == "AIME 2024" and suite.known_format().name == "aime2024"
    spaced = parse_suite(
        "mine path='/my data/m.jsonl' format=MATH-500 template=boxed max_prompts=7"
    )
    assert spaced == EvalSuite("mine", "/my data/m.jsonl", "MATH-500", "boxed", 0, 7)
    assert spaced.title == "MATH-500"  # the format's title
    assert parse_suite(spaced.spec()) == spaced
    custom = parse_suite('x path=a.jsonl template="Q: {problem} A:"')
    assert custom.template == "Q: {problem} A:" and custom.title == "x"
    assert parse_suite(custom.spec()) == custom


@pytest.mark.parametrize(
    "spec, problem",
    [
        ("", "must start with its name"),
        ("path=a.jsonl", "must start with its name"),
        ("aime", "has no path=FILES"),
        ("aime path=", "has no path=FILES"),
        ("aime path=a k=0", "leave k out"),
        ("aime path=a k=-1", "k='-1' must be a whole number"),
        ("aime path=a max_prompts=x", "max_prompts='x' must be a whole number"),
        ("aime path=a temp=1", "'temp=1' is not an option"),
        ("aime path=a k", "'k' is not an option"),
        ("aime path=a path=b", "gives path twice"),
        ("aime path=a format=aime2027", "unknown benchmark format 'aime2027'"),
        ("aime path=a template=fancy", "unknown prompt template 'fancy'"),
        ("a/b path=x", "the name 'a/b' must be"),
        ("average path=x", "is a metric's"),
        ("pass@4 path=x", "the name 'pass@4' must be"),
        ("aime path='a", "No closing quotation"),
    ],
)
def test_a_bad_suite_string_is_refused_by_name(spec, problem):
    with pytest.raises(SuiteError) as e:
        parse_suite(spec)
    assert problem in str(e.value) and repr(spec) in str(e.value)


def test_suite_names_must_differ():
    with pytest.raises(SuiteError, match="two eval suites are named 'AIME'"):
        parse_suites(("aime path=a", "AIME path=b"))


def test_the_config_field_refuses_a_bad_suite_and_old_runs_get_none(tmp_path):
    import importlib.util

    root = os.path.dirname(os.path.dirname(HERE))
    spec = importlib.util.spec_from_file_location(
        "tiny", os.path.join(root, "configs/tiny_math.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()  # k = eval.num_samples = 4
    config.eval.suites = ("aime path=a k=zero",)
    with pytest.raises(ValueError) as e:
        resolve_settings(config)
    assert str(e.value).startswith("config.eval.suites=('aime path=a k=zero',) has a bad suite")
    config.eval.suites = ("aime2024 path=a k=32", "math500 path=b")
    settings = resolve_settings(config)
    assert [(s.name, s.k) for s in settings.eval_suites] == [("aime2024", 32), ("math500", 4)]
    assert settings.eval_sample_counts == (4, 32)  # the held-out set's k and the suites'
    config.rollout.slots = 16  # the continuous engine decodes one group of k in its slots
    with pytest.raises(ValueError, match=r"config.rollout.slots=16 must be >= 32 .*suite's k"):
        resolve_settings(config)
    saved = settings.to_dict()
    del saved["eval"]["suites"]  # a run saved before suites existed
    assert resolve_settings(with_added_fields(saved)).eval.suites == ()


@pytest.mark.parametrize(
    "spec, fmt, count, first_id",
    [
        ("math500 path={}/math500.jsonl", "math500", None, "math500/test/precalculus/418.json"),
        ("aime2024 path={}/aime2024.jsonl", "aime2024", None, "aime2024/2024-I-1"),
        # no format by name: detected from the rows' keys
        ("oly path={}/olympiadbench.jsonl", "olympiadbench", None, "oly/1702"),
        # named explicitly, on a release whose keys identify nothing
        ("a25 path={}/aime2025.jsonl format=aime2025", "aime2025", None, None),
        ("m path={}/math500.jsonl max_prompts=2", "math500", 2, None),
    ],
)
def test_a_suite_reads_its_files_with_its_benchmarks_map(spec, fmt, count, first_id):
    loaded = load_suite(parse_suite(spec.format(FIXTURES)), FieldSpec(), "tiny")
    name = spec.split()[0]
    assert loaded.format.name == fmt and loaded.template == "dapo"  # the format's template
    assert count is None or len(loaded.problems) == count
    assert first_id is None or loaded.problems[0].id == first_id
    for p in loaded.problems:
        assert p.id.startswith(f"{name}/") and p.answer
        assert p.meta[SUITE_KEY] == name and p.meta[TEMPLATE_KEY] == "dapo"
    assert len({p.id for p in loaded.problems}) == len(loaded.problems)


def test_an_unknown_layout_reads_the_runs_fields_and_template(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"q": "What is 1 + 1?", "a": "2"}\n{"q": "What is 2 + 2?", "a": "4"}\n')
    loaded = load_suite(
        parse_suite(f"mine path={path}"), FieldSpec(prompt="q", answer="a"), "boxed"
    )
    assert loaded.format is None and loaded.title == "mine" and loaded.template == "boxed"
    assert [(p.id, p.prompt, p.answer) for p in loaded.problems] == [
        ("mine/mine.jsonl:0", "What is 1 + 1?", "2"),
        ("mine/mine.jsonl:1", "What is 2 + 2?", "4"),
    ]
    own = load_suite(parse_suite(f"mine path={path} template=tiny"), FieldSpec("q", "a"), "dapo")
    assert own.template == "tiny" and own.problems[0].meta[TEMPLATE_KEY] == "tiny"


def test_a_suite_whose_files_are_missing_or_unusable_is_named(tmp_path):
    with pytest.raises(SuiteError, match=r"eval suite 'aime2024' \(/nowhere/a.jsonl\).*no dataset"):
        load_suite(parse_suite("aime2024 path=/nowhere/a.jsonl"), FieldSpec(), "dapo")
    shutil.copy(fixture("amc23.jsonl"), tmp_path / "amc.jsonl")
    with pytest.raises(SuiteError, match="eval suite 'x'.*no usable row"):
        load_suite(parse_suite(f"x path={tmp_path}/amc.jsonl format=olympiadbench"), None, "")


def _set(name, k, n=1):
    return EvalSet(name, name.upper(), [None] * n, k)


def test_the_suites_average_and_table_by_hand():
    sets = [_set("", 4), _set("a", 32), _set("b", 4), _set("c", 1)]
    metrics = {
        "eval/avg@4": 0.9,  # the held-out set: not part of the average
        "eval/pass@4": 1.0,
        "eval/a/avg@32": 0.25,
        "eval/a/pass@32": 0.75,
        "eval/a/num_prompts": 30.0,
        "eval/b/avg@4": 0.5,
        "eval/b/pass@4": 0.5,
        "eval/b/num_prompts": 500.0,
        "eval/c/avg@1": 0.0,
        "eval/c/pass@1": 0.0,
        "eval/c/num_prompts": 40.0,
    }
    average = suite_average(metrics, sets)
    assert average == {
        "eval/average/avg@k": pytest.approx(0.25),
        "eval/average/pass@k": pytest.approx(1.25 / 3),
    }
    table = suite_table({**metrics, **average}, sets)
    assert [(r["name"], r["k"], r["avg"], r["pass"], r["num_prompts"]) for r in table] == [
        ("a", 32, 0.25, 0.75, 30),
        ("b", 4, 0.5, 0.5, 500),
        ("c", 1, 0.0, 0.0, 40),
        ("average", None, pytest.approx(0.25), pytest.approx(1.25 / 3), 570),
    ]
    text = format_suite_table(table).splitlines()
    assert text[1].split() == ["A", "32", "0.250", "0.750", "30"]
    assert text[-3:] == [
        "  |---|---|---|---|---|",
        "  | avg@k | 25.0 | 50.0 | 0.0 | 25.0 |",
        "  | pass@k | 75.0 | 50.0 | 0.0 | 41.7 |",
    ]
    assert suite_average({"eval/avg@4": 1.0}, [_set("", 4)]) == {}
    assert suite_table({"eval/avg@4": 1.0}, [_set("", 4)]) == [] and format_suite_table([]) == ""
