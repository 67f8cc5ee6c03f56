"""Evaluation suites the tiny model can be scored on: synthetic arithmetic problems written
in three published benchmark layouts (MATH-500, AIME 2024 as Maxwell-Jia/AIME_2024,
OlympiadBench), each read back through its built-in field map with the `tiny` template.

    python tests/suite_fixtures.py FOLDER [SCALE]   # writes the files, prints the suites
"""

from __future__ import annotations

import json
import os
import sys

from da3po_jax.data import generate_split

# name -> (k, first problem, count) of the synthetic held-out split
SUITES = {"math500": (2, 0, 6), "aime2024": (4, 6, 4), "olympiadbench": (1, 10, 5)}


def _rows(name: str, problems) -> list[dict]:
    """The problems as rows of the benchmark's published layout."""
    rows = []
    for i, p in enumerate(problems):
        if name == "math500":
            level = {"easy": 1, "medium": 2, "hard": 3, "harder": 4}[p.tier]
            rows.append(
                {
                    "problem": p.prompt,
                    "solution": f"\\boxed{{{p.answer}}}",
                    "answer": p.answer,
                    "subject": "Prealgebra",
                    "level": level,
                    "unique_id": f"test/prealgebra/{i}.json",
                }
            )
        elif name == "aime2024":
            rows.append(
                {"ID": f"2024-I-{i + 1}", "Problem": p.prompt, "Solution": "", "Answer": p.answer}
            )
        else:
            rows.append(
                {
                    "id": 1600 + i,
                    "question": p.prompt,
                    "solution": [f"So the answer is {p.answer}."],
                    "final_answer": [f"${p.answer}$"],
                    "context": None,
                    "image_1": None,
                    "is_multiple_answer": False,
                    "unit": None,
                    "answer_type": "Numerical",
                    "error": None,
                    "question_type": "Open-ended",
                    "subfield": "Algebra",
                    "subject": "Math",
                    "language": "English",
                    "difficulty": "Competition",
                }
            )
    return rows


def write_suites(folder: str, seed: int = 0, scale: int = 1) -> tuple[str, ...]:
    """Writes the three suites' JSONL files into `folder` (`scale` times `SUITES`'
    problem counts); their `eval.suites` strings."""
    os.makedirs(folder, exist_ok=True)
    problems = generate_split("heldout", 15 * scale, seed=seed)
    specs = []
    for name, (k, start, count) in SUITES.items():
        path = os.path.join(folder, f"{name}.jsonl")
        with open(path, "w") as f:
            for row in _rows(name, problems[scale * start : scale * (start + count)]):
                f.write(json.dumps(row) + "\n")
        specs.append(f"{name} path={path} template=tiny k={k}")
    return tuple(specs)


if __name__ == "__main__":
    scale = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    print(json.dumps(write_suites(sys.argv[1], scale=scale)))
