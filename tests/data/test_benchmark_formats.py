"""Built-in benchmark formats: each release's rows (hand-made fixtures in its published
shape) read into the expected problems, format lookup and detection, malformed rows in
those shapes, and OlympiadBench's several final answers scored as a set."""

from __future__ import annotations

import json
import math
import os

import pytest

from da3po_jax.data import (
    BENCHMARK_FORMATS,
    PROMPT_TEMPLATES,
    FieldSpec,
    detect_benchmark_format,
    format_prompt,
    get_benchmark_format,
    load_benchmark,
    parse_row,
    read_jsonl,
)
from da3po_jax.rewards.extract import extract_reference
from da3po_jax.rewards.scorer import score_batch

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "benchmarks")

# fixture -> (format, the field the prompt is published in, [(id, answer, tier)])
EXPECTED = {
    "math500.jsonl": (
        "math500",
        "problem",
        [
            ("test/precalculus/418.json", "\\left( 2, \\pi \\right)", "Level 2"),
            ("test/algebra/2291.json", "7", "Level 3"),
            ("test/number_theory/1057.json", "4", "Level 5"),
            ("test/counting_and_probability/733.json", "10", "Level 1"),
        ],
    ),
    "aime2024.jsonl": (
        "aime2024",
        "Problem",
        [("2024-I-1", "130", ""), ("2024-I-2", "272", ""), ("2024-II-4", "70", "")],
    ),
    "aime2024_h4.jsonl": (
        "aime2024",
        "problem",
        [("60", "015", ""), ("61", "486", ""), ("62", "45", "")],
    ),
    "aime2025.jsonl": (
        "aime2025",
        "problem",
        [("0", "26", ""), ("1", "200", ""), ("2", "30", "")],
    ),
    "aime2025_question.jsonl": (
        "aime2025",
        "question",
        [(f"aime2025_question.jsonl:{i}", a, "") for i, a in enumerate(["10", "432", "128"])],
    ),
    "aime2026.jsonl": ("aime2026", "problem", [("1", "4", ""), ("2", "3", ""), ("3", "255", "")]),
    "amc23.jsonl": (
        "amc23",
        "question",
        [("0", "35", ""), ("1", "2.5", ""), ("2", "4", ""), ("3", "27", "")],
    ),
    "minerva.jsonl": (
        "minerva",
        "question",
        [
            ("minerva.jsonl:0", "2.0 \\times 10^{-27}", ""),
            ("minerva.jsonl:1", "2.5", ""),
            ("minerva.jsonl:2", "10", ""),
        ],
    ),
    "minerva_problem.jsonl": (
        "minerva",
        "problem",
        [
            ("minerva_problem.jsonl:0", "5.0 \\times 10^{14}", ""),
            ("minerva_problem.jsonl:1", "4", ""),
        ],
    ),
    "olympiadbench.jsonl": (
        "olympiadbench",
        "question",
        [
            ("1702", "3, -2", "Competition"),
            ("1715", "(1,2), (2,1)", "Competition"),
            ("2431", "5", "Competition"),
            ("2978", "\\frac{1}{6}", "Competition"),
        ],
    ),
}
# fixture -> what detection names from its first row's keys (None: the generic shape)
DETECTED = {
    "math500.jsonl": "math500",
    "aime2024.jsonl": "aime2024",
    "aime2024_h4.jsonl": "aime2024",
    "aime2025.jsonl": None,
    "aime2025_question.jsonl": None,
    "aime2026.jsonl": "aime2026",
    "amc23.jsonl": "amc23",
    "minerva.jsonl": None,
    "minerva_problem.jsonl": None,
    "olympiadbench.jsonl": "olympiadbench",
}


def _rows(name: str) -> list[dict]:
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_each_release_reads_into_the_expected_problems(fixture):
    fmt, prompt_field, expected = EXPECTED[fixture]
    result = load_benchmark(os.path.join(FIXTURES, fixture), fmt)
    problems, rows = result.problems, _rows(fixture)
    assert [(p.id, p.answer, p.tier) for p in problems] == expected
    assert result.report.num_skipped == 0
    for p, row in zip(problems, rows):
        if row.get("context"):
            assert p.prompt == f"{row['context']}\n\n{row[prompt_field]}"
        else:
            assert p.prompt == row[prompt_field]
        assert p.source == fixture


def test_worked_solutions_and_grouping_fields():
    math500 = load_benchmark(os.path.join(FIXTURES, "math500.jsonl"), "MATH-500").problems
    assert math500[2].solution.endswith("\\boxed{4} \\pmod 7$.")
    assert [p.meta["fields"]["subject"] for p in math500] == [
        "Precalculus",
        "Algebra",
        "Number Theory",
        "Counting & Probability",
    ]
    aime = load_benchmark(os.path.join(FIXTURES, "aime2024.jsonl"), "aime2024").problems
    assert aime[0].solution.startswith("There are $\\lfloor 1000/7 \\rfloor = 142$")
    fmt = get_benchmark_format("olympiadbench")
    olympiad = load_benchmark(os.path.join(FIXTURES, "olympiadbench.jsonl"), fmt).problems
    assert olympiad[2].solution == "$\\log_{2} 8=3$ and $\\log_{3} 9=2$, so the sum is $5$."
    assert [p.meta["fields"][fmt.subject] for p in olympiad] == [
        "Algebra",
        "Number Theory",
        "Algebra",
        "Combinatorics",
    ]
    assert olympiad[3].prompt.startswith("Two different numbers are chosen at random")
    assert "context" not in olympiad[3].meta["fields"]


def test_dapo_math_17k_parquet_keeps_its_instruction_and_drops_repeats():
    pytest.importorskip("pyarrow")
    fmt = get_benchmark_format("DAPO-Math-17K")
    result = load_benchmark(os.path.join(FIXTURES, "dapo_math_17k.parquet"), fmt)
    assert (result.report.num_rows, result.report.num_duplicates) == (4, 1)
    assert [(p.id[:8], p.answer) for p in result.problems] == [
        ("9a6b1f0e", "36"),
        ("0f1e2d3c", "24"),
        ("5d6c7b8a", "400"),
    ]
    prompt = result.problems[1].prompt
    assert prompt.startswith("Solve the following math problem step by step.")
    assert "\n\nHow many positive divisors does $360$ have?\n\n" in prompt
    assert prompt.endswith('on its own line after "Answer:".')
    assert format_prompt(prompt, fmt.template) == prompt  # raw: no second instruction


def test_templates_are_built_in_and_only_dapo_math_17k_is_raw():
    assert all(f.template in PROMPT_TEMPLATES for f in BENCHMARK_FORMATS.values())
    raw = {name for name, f in BENCHMARK_FORMATS.items() if f.template == "raw"}
    assert raw == {"dapo_math_17k"}


@pytest.mark.parametrize(
    "name, key",
    [
        ("MATH-500", "math500"),
        ("AIME 2024", "aime2024"),
        ("aime_2025", "aime2025"),
        ("OlympiadBench", "olympiadbench"),
        ("dapo-math-17k", "dapo_math_17k"),
    ],
)
def test_lookup_ignores_case_and_separators(name, key):
    assert get_benchmark_format(name) is BENCHMARK_FORMATS[key]


def test_an_unknown_format_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown benchmark format 'gsm8k'") as e:
        get_benchmark_format("gsm8k")
    for name in BENCHMARK_FORMATS:
        assert name in str(e.value)
    with pytest.raises(ValueError, match="unknown benchmark format"):
        load_benchmark(os.path.join(FIXTURES, "math500.jsonl"), "math-5000")


@pytest.mark.parametrize("fixture", sorted(DETECTED))
def test_detection_from_a_rows_keys(fixture):
    fmt = detect_benchmark_format(_rows(fixture)[0])
    assert (fmt.name if fmt else None) == DETECTED[fixture]


def test_detection_of_dapo_rows_and_of_no_or_two_releases():
    dapo = {"data_source": "math_dapo", "prompt": [], "ability": "MATH", "reward_model": {}}
    assert detect_benchmark_format({**dapo, "extra_info": {}}).name == "dapo_math_17k"
    assert detect_benchmark_format({"prompt": "Q", "answer": "1"}) is None
    both = {"problem_idx": 1, "problem": "Q", "answer": 2, "ID": "x", "Problem": "Q", "Answer": 2}
    assert detect_benchmark_format(both) is None  # aime2026 and aime2024 tie


def test_malformed_rows_in_the_published_shapes_are_skipped_and_counted(tmp_path):
    math500, aime, amc, olympiad = (
        _rows(n) for n in ("math500.jsonl", "aime2024.jsonl", "amc23.jsonl", "olympiadbench.jsonl")
    )
    no_answer = {k: v for k, v in math500[0].items() if k != "answer"}
    cases = [
        ("math500", [no_answer, *math500[1:]], {"missing answer": 1}),
        ("aime2024", [aime[0], {**aime[1], "Answer": True}], {"wrong type": 1}),
        ("amc23", [{**amc[0], "answer": math.nan}, amc[1]], {"wrong type": 1}),
        (
            "olympiadbench",
            [{**olympiad[0], "final_answer": []}, {**olympiad[1], "final_answer": ["$ $"]}]
            + olympiad[2:],
            {"empty answer": 2},
        ),
    ]
    for fmt, rows, skipped in cases:
        result = load_benchmark(_write(tmp_path / f"{fmt}.jsonl", rows), fmt)
        assert dict(result.report.skipped) == skipped, fmt
        assert result.report.num_kept == len(rows) - sum(skipped.values())
    first = load_benchmark(str(tmp_path / "olympiadbench.jsonl"), "olympiadbench").report
    assert [n for n, _ in first.first_errors] == [1, 2]  # 1-based JSONL lines


def test_olympiadbench_answers_match_the_verifiers_reading_and_score_as_sets():
    fixture = os.path.join(FIXTURES, "olympiadbench.jsonl")
    problems = load_benchmark(fixture, "olympiadbench").problems
    rows = _rows("olympiadbench.jsonl")
    for p, row in zip(problems, rows):
        assert p.answer == extract_reference(row["final_answer"])
    multi = [(p, row) for p, row in zip(problems, rows) if row["is_multiple_answer"]]
    assert len(multi) == 2
    responses, references = [], []
    for p, row in multi:
        answers = [a.strip("$") for a in row["final_answer"]]
        boxes = ", ".join(f"$\\boxed{{{a}}}$" for a in reversed(answers))
        responses += [f"So the solutions are {boxes}.", f"The answer is $\\boxed{{{answers[0]}}}$."]
        references += [p.answer, p.answer]
    scores = score_batch(responses, references, num_workers=1)
    assert [r.correct for r in scores.results] == [True, False, True, False]


def test_numeric_answers_under_the_default_field_map(tmp_path):
    rows = [
        {"prompt": "A", "answer": 27.0},
        {"prompt": "B", "answer": 0.1},
        {"prompt": "C", "answer": -3.0},
        {"prompt": "D", "answer": 12},
        {"prompt": "E", "answer": math.inf},
        {"prompt": "F", "answer": False},
    ]
    result = read_jsonl(_write(tmp_path / "numbers.jsonl", rows))
    assert [p.answer for p in result.problems] == ["27", "0.1", "-3", "12"]
    assert dict(result.report.skipped) == {"wrong type": 2}


@pytest.mark.parametrize(
    "value, answer",
    [
        (["$2$", "$-3$"], "2, -3"),
        (["\\(x+1\\)", "$$y$$", "\\[z\\]"], "x+1, y, z"),
        (["$1$ and $2$"], "$1$ and $2$"),  # two spans, not one wrapping all
        (["7", 8, 2.0], "7, 8, 2"),
    ],
)
def test_list_answers_lose_a_wrapping_math_span(value, answer):
    fields = FieldSpec(answer="final_answer", list_answers=True)
    problem = parse_row(
        {"question": "Q", "final_answer": value}, fields, default_id="x", source="s"
    )
    assert problem.answer == answer
    if all(isinstance(v, str) for v in value):  # the verifier reads string lists the same way
        assert extract_reference(value) == answer


def test_tier_prefix_applies_to_integer_tiers_only():
    fields = FieldSpec(tier_prefix="Level ")
    tiers = [
        parse_row({"prompt": "Q", "answer": "1", "level": level}, fields, default_id="x", source="")
        for level in (4, "Level 2", "hard")
    ]
    assert [p.tier for p in tiers] == ["Level 4", "Level 2", "hard"]
    default = parse_row(
        {"prompt": "Q", "answer": "1", "level": 4}, FieldSpec(), default_id="x", source=""
    )
    assert default.tier == "4"
