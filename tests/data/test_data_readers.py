"""JSONL / Parquet / TFDS readers: field mapping, malformed rows, empty data, boxed answers."""

from __future__ import annotations

import collections
import json
import logging
import sys

import pytest

from da3po_jax.data import (
    EmptyDatasetError,
    FieldSpec,
    extract_gsm8k_answer,
    extract_last_boxed,
    generate_split,
    load_problems,
    read_jsonl,
    read_parquet,
    read_tfds,
    write_jsonl,
)

DAPO_USER = (
    "Solve the following math problem step by step. The last line of your response should "
    "be of the form Answer: $Answer (without quotes) where $Answer is the answer to the "
    "problem.\n\nFind $x$ if $2x = 10$.\n\nRemember to put your answer on its own line "
    'after "Answer:".'
)
GOOD_ROWS = [
    {"prompt": "What is 2 + 3?", "answer": "5"},
    {
        "problem": "Simplify $\\frac{2}{4}$.",
        "solution": "Divide: $\\boxed{\\frac{1}{2}}$.",
        "level": "Level 2",
    },
    {
        "question": "Tom has 3 apples and buys 1,000 more. How many?",
        "answer": "3 + 1000 = 1003\n#### 1,003",
    },
    {
        "prompt": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": DAPO_USER},
        ],
        "reward_model": {"ground_truth": "5", "style": "rule"},
        "data_source": "math_dapo",
    },
    {"id": "aime-2024-1", "problem": "Compute 6 * 7.", "answer": 42},
]
EXPECTED = [  # (prompt, answer, tier) of GOOD_ROWS
    ("What is 2 + 3?", "5", ""),
    ("Simplify $\\frac{2}{4}$.", "\\frac{1}{2}", "Level 2"),
    ("Tom has 3 apples and buys 1,000 more. How many?", "1003", ""),
    (DAPO_USER, "5", ""),
    ("Compute 6 * 7.", "42", ""),
]
# (raw JSONL line, reason it is skipped)
BAD_LINES = [
    ('{"prompt": "unterminated', "bad JSON"),
    ('["a list", "not an object"]', "not an object"),
    ('{"answer": "3"}', "missing prompt"),
    ('{"prompt": "What is 1 + 1?"}', "missing answer"),
    ('{"prompt": "   ", "answer": "1"}', "empty prompt"),
    ('{"prompt": "What is 1 + 1?", "answer": ""}', "empty answer"),
    ('{"prompt": "What is 1 + 1?", "answer": ["2"]}', "wrong type"),
    ('{"prompt": 17, "answer": "2"}', "wrong type"),
    ('{"prompt": "Q", "answer": true}', "wrong type"),
    ('{"problem": "Q", "solution": "it is 2 but never boxed"}', "no answer in solution"),
    ('{"problem": "Q", "solution": "\\\\boxed{2"}', "no answer in solution"),
    ('{"prompt": [{"role": "system", "content": "hi"}], "answer": "2"}', "missing prompt"),
    ('{"prompt": [{"role": "user", "content": ["parts"]}], "answer": "2"}', "wrong type"),
]


def _write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_jsonl_maps_every_common_layout(tmp_path):
    path = _write_lines(tmp_path / "mix.jsonl", [json.dumps(r) for r in GOOD_ROWS])
    problems, report = read_jsonl(path)
    assert [(p.prompt, p.answer, p.tier) for p in problems] == EXPECTED
    assert [p.id for p in problems] == [
        "mix.jsonl:0",
        "mix.jsonl:1",
        "mix.jsonl:2",
        "mix.jsonl:3",
        "aime-2024-1",
    ]
    assert problems[1].solution == "Divide: $\\boxed{\\frac{1}{2}}$."
    assert problems[2].solution == "3 + 1000 = 1003\n#### 1,003"  # GSM8K's worked answer
    assert problems[0].solution is None
    assert problems[3].meta == {"system": "Be brief.", "fields": {"data_source": "math_dapo"}}
    assert all(p.source == "mix.jsonl" for p in problems)
    assert (report.num_rows, report.num_kept, report.num_skipped) == (5, 5, 0)


def test_malformed_rows_are_skipped_counted_and_first_few_reported(tmp_path, caplog):
    entries = []  # (line, reason or None): good, bad, good, bad, ... and one blank line
    for i, (bad, reason) in enumerate(BAD_LINES):
        entries += [(json.dumps(GOOD_ROWS[i % len(GOOD_ROWS)]), None), (bad, reason)]
    entries.insert(4, ("", None))  # blank lines are neither rows nor errors
    path = _write_lines(tmp_path / "dirty.jsonl", [line for line, _ in entries])
    bad_rows = [(n, r) for n, (_, r) in enumerate(entries, start=1) if r]  # 1-based lines
    with caplog.at_level(logging.WARNING, logger="da3po_jax.data.readers"):
        problems, report = read_jsonl(path, max_reported=3)
    assert len(problems) == len(BAD_LINES)
    assert (report.num_rows, report.num_skipped) == (2 * len(BAD_LINES), len(BAD_LINES))
    assert report.skipped == collections.Counter(r for _, r in BAD_LINES)
    assert [(n, msg.split(":")[0]) for n, msg in report.first_errors] == bad_rows[:3]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 4  # three rows reported one by one, then one summary
    for (n, reason), message in zip(bad_rows[:3], warnings[:3]):
        assert f"dirty.jsonl: skipping malformed row {n}: {reason}" in message
    assert f"skipped {len(BAD_LINES)} of {2 * len(BAD_LINES)} rows" in warnings[-1]
    # Default ids come from the row's line index, so they survive edits to other rows.
    assert [p.id for p in problems[:3]] == ["dirty.jsonl:0", "dirty.jsonl:2", "dirty.jsonl:5"]


def test_empty_dataset_is_an_error_naming_the_file(tmp_path):
    empty = _write_lines(tmp_path / "empty.jsonl", [])
    with pytest.raises(EmptyDatasetError, match="empty.jsonl.*0 rows"):
        read_jsonl(empty)
    all_bad = _write_lines(tmp_path / "all_bad.jsonl", [b for b, _ in BAD_LINES])
    with pytest.raises(EmptyDatasetError, match=f"all_bad.jsonl.*{len(BAD_LINES)} malformed"):
        read_jsonl(all_bad)
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_configurable_dotted_fields_and_answer_modes(tmp_path):
    rows = [
        {"data": {"q": "What is 9 - 4?", "gt": {"value": "5"}}, "uid": 17},
        {"data": {"q": "What is 1 + 1?", "gt": {"value": "Sum is \\boxed{2}"}}, "uid": 17},
        {"data.q": "Flattened column?", "data": {"gt": {"value": "#### 7"}}, "uid": 3},
    ]
    path = _write_lines(tmp_path / "nested.jsonl", [json.dumps(r) for r in rows])
    spec = FieldSpec(prompt="data.q", answer="data.gt.value", id="uid")
    problems, _ = read_jsonl(path, spec)
    assert [(p.id, p.prompt, p.answer) for p in problems] == [
        ("17", "What is 9 - 4?", "5"),
        ("17#1", "What is 1 + 1?", "2"),  # a repeated id stays unique
        ("3", "Flattened column?", "7"),
    ]
    raw, _ = read_jsonl(path, FieldSpec(prompt="data.q", answer="data.gt.value", answer_mode="raw"))
    assert [p.answer for p in raw] == ["5", "Sum is \\boxed{2}", "#### 7"]
    with pytest.raises(ValueError, match="answer_mode"):
        FieldSpec(answer_mode="guess")


def test_dedupe_drops_repeated_problems_quietly(tmp_path, caplog):
    row = json.dumps({"prompt": "What is 2 + 3?", "answer": "5"})
    other = json.dumps({"prompt": "What is 2 + 4?", "answer": "6"})
    path = _write_lines(tmp_path / "dup.jsonl", [row, row, other, row])
    with caplog.at_level(logging.WARNING):
        problems, report = read_jsonl(path, FieldSpec(dedupe=True))
    assert [p.answer for p in problems] == ["5", "6"]
    assert (report.num_duplicates, report.num_skipped) == (2, 0)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    kept_all, _ = read_jsonl(path)
    assert [p.id for p in kept_all] == ["dup.jsonl:0", "dup.jsonl:1", "dup.jsonl:2", "dup.jsonl:3"]


def test_json_array_files_and_load_problems_dispatch(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(GOOD_ROWS[:2], indent=2))
    _write_lines(tmp_path / "b.jsonl", [json.dumps(GOOD_ROWS[2]), json.dumps(GOOD_ROWS[4])])
    (tmp_path / "notes.txt").write_text("ignored in folders")
    one, _ = load_problems(tmp_path / "a.json")
    assert [p.answer for p in one] == ["5", "\\frac{1}{2}"]
    for source in (tmp_path, str(tmp_path / "*.json*")):
        problems, report = load_problems(source)
        assert [p.id for p in problems] == ["a.json:0", "a.json:1", "b.jsonl:0", "aime-2024-1"]
        assert (report.num_rows, report.num_kept) == (4, 4)
    with pytest.raises(FileNotFoundError):
        load_problems(tmp_path / "nothing-*.jsonl")
    with pytest.raises(ValueError, match="unsupported extension"):
        load_problems(tmp_path / "notes.txt")


def test_synthetic_split_round_trips_through_jsonl(tmp_path):
    problems = generate_split("heldout", 30, seed=1)
    path = tmp_path / "heldout.jsonl"
    assert write_jsonl(problems, path) == 30
    back, _ = read_jsonl(path)
    assert [(p.id, p.prompt, p.answer, p.tier, p.solution) for p in back] == [
        (p.id, p.prompt, p.answer, p.tier, p.solution) for p in problems
    ]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so $\\boxed{5}$.", "5"),
        ("first \\boxed{1}, finally \\boxed{\\frac{a}{b}}", "\\frac{a}{b}"),
        ("\\boxed{\\left\\{ 1, 2 \\right\\}}", "\\left\\{ 1, 2 \\right\\}"),
        ("\\boxed{x^{2^{3}}+\\sqrt{4}}", "x^{2^{3}}+\\sqrt{4}"),
        ("\\boxed{\\boxed{7}}", "\\boxed{7}"),
        ("\\fbox{3}", "3"),
        ("The answer is $\\boxed 9$.", "9"),
        ("\\boxed{ 12 }", "12"),
        ("\\boxed{}", None),
        ("\\boxed{1} and then \\boxed{2", None),
        ("no box here", None),
        ("\\boxedfoo{3}", None),
    ],
)
def test_extract_last_boxed(text, expected):
    assert extract_last_boxed(text) == expected


def test_extract_last_boxed_is_linear_on_adversarial_input():
    import time

    start = time.perf_counter()
    for text in ("\\boxed{" * 50_000, "\\boxed" * 50_000, "\\boxed{}" * 50_000 + "\\fbox{1}"):
        extract_last_boxed(text)
    assert extract_last_boxed("\\boxed{}" * 50_000 + "\\fbox{1}") == "1"
    assert time.perf_counter() - start < 2.0


def test_extract_gsm8k_answer():
    assert extract_gsm8k_answer("5 + 6 = 11\n#### 11") == "11"
    assert extract_gsm8k_answer("a #### 1 then\n#### 1,234,567") == "1234567"
    assert extract_gsm8k_answer("no marker") is None
    assert extract_gsm8k_answer("####   ") is None


def test_parquet_missing_package_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match="pip install pyarrow"):
        read_parquet(tmp_path / "x.parquet")


def test_tfds_missing_package_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(ImportError, match="tensorflow-datasets"):
        read_tfds("gsm8k")
    with pytest.raises(ImportError, match="tensorflow-datasets"):
        load_problems("tfds:gsm8k", split="test")


def test_tfds_examples_are_decoded_and_mapped(monkeypatch):
    """A stand-in `tensorflow_datasets` (no network): bytes/numpy leaves, GSM8K layout."""
    import types

    import numpy as np

    examples = [
        {"question": b"Ann has 2 cats and gets 3 more. How many?", "answer": b"2+3=5\n#### 5"},
        {"question": b"", "answer": b"#### 1"},
        {"question": np.bytes_(b"What is 10 * 10?"), "answer": np.bytes_(b"#### 100")},
    ]
    calls = []
    fake = types.SimpleNamespace(
        load=lambda name, **kw: calls.append((name, kw)) or examples,
        as_numpy=lambda ds: iter(ds),
    )
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
    problems, report = load_problems("tfds:gsm8k", split="test")
    assert calls == [("gsm8k", {"split": "test", "data_dir": None, "download": False})]
    assert [(p.id, p.prompt, p.answer) for p in problems] == [
        ("tfds:gsm8k/test:0", "Ann has 2 cats and gets 3 more. How many?", "5"),
        ("tfds:gsm8k/test:2", "What is 10 * 10?", "100"),
    ]
    assert dict(report.skipped) == {"empty prompt": 1}


def test_parquet_dapo_layout_and_malformed_rows(tmp_path, caplog):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    msg = lambda role, content: {"role": role, "content": content}  # noqa: E731
    table = pa.table(
        {
            "data_source": ["math_dapo"] * 4,
            "prompt": [
                [msg("user", DAPO_USER)],
                None,
                [msg("user", "What is 3 * 4?")],
                [msg("user", "What is 3 * 4?")],
            ],
            "reward_model": [
                {"ground_truth": "5", "style": "rule"},
                {"ground_truth": "1", "style": "rule"},
                {"ground_truth": "12", "style": "rule"},
                {"ground_truth": "", "style": "rule"},
            ],
            "extra_info": [{"index": "u-0"}, {"index": "u-1"}, {"index": "u-2"}, {"index": "u-3"}],
        }
    )
    path = tmp_path / "dapo-math-17k.parquet"
    pq.write_table(table, path)
    with caplog.at_level(logging.WARNING, logger="da3po_jax.data.readers"):
        problems, report = read_parquet(path, batch_size=2)
    assert [(p.id, p.prompt, p.answer) for p in problems] == [
        ("u-0", DAPO_USER, "5"),
        ("u-2", "What is 3 * 4?", "12"),
    ]
    assert dict(report.skipped) == {"missing prompt": 1, "empty answer": 1}
    assert [n for n, _ in report.first_errors] == [1, 3]
    assert "skipping malformed row 1: missing prompt" in caplog.text
    assert load_problems(path).problems == problems


def test_short_scalar_fields_are_kept_for_grouping(tmp_path):
    """A row's short scalar fields (subject, level, ...) are kept in `meta["fields"]` for
    `eval.group_by`; the prompt, the answer, long texts and nested values are not."""
    from da3po_jax.run.evaluation import check_group_by, group_of

    rows = [
        {"problem": "What is 1+1?", "answer": "2", "subject": "arithmetic", "level": 1},
        {"problem": "Solve x+1=3.", "answer": "2", "subject": "algebra", "notes": "x" * 300},
        {"problem": "What is 2+2?", "answer": "4", "extra": {"nested": 1}},
    ]
    path = _write_lines(tmp_path / "subj.jsonl", [json.dumps(r) for r in rows])
    problems, _ = read_jsonl(path)
    assert problems[0].meta["fields"] == {"subject": "arithmetic", "level": 1}
    assert problems[1].meta["fields"] == {"subject": "algebra"}
    assert "fields" not in problems[2].meta
    assert [group_of(p, "subject") for p in problems] == ["arithmetic", "algebra", ""]
    assert [group_of(p, "tier") for p in problems] == ["1", "", ""]  # level is the tier
    check_group_by(problems, "subject")
    with pytest.raises(ValueError, match="eval.group_by='topic': no problem has that field; "):
        check_group_by(problems, "topic")
