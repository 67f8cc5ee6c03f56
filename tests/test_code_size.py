"""Size limits of docs/design.md ("Stages of one step"): the RL loop stays a sequence of
named stages, not a god-object. Every function in `train/` fits in 60 lines (docstring
included), the loop class in 150, and every module of the package in 600."""

from __future__ import annotations

import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "da3po_jax")


def _modules(folder: str = "") -> list[str]:
    root = os.path.join(PACKAGE, folder)
    return sorted(
        os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.endswith(".py")
    )


def _length(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


@pytest.mark.parametrize("path", _modules("train"), ids=os.path.basename)
def test_functions_in_train_are_short(path):
    with open(path) as f:
        tree = ast.parse(f.read())
    long = [
        f"{node.name} ({_length(node)} lines, line {node.lineno})"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _length(node) > 60
    ]
    assert not long, f"{os.path.relpath(path, PACKAGE)}: over 60 lines: {long}"


def test_the_loop_class_is_small():
    with open(os.path.join(PACKAGE, "train", "trainer.py")) as f:
        tree = ast.parse(f.read())
    (loop,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RLTrainer"]
    assert _length(loop) < 150


@pytest.mark.parametrize("path", _modules(), ids=lambda p: os.path.relpath(p, PACKAGE))
def test_modules_stay_under_600_lines(path):
    with open(path) as f:
        assert sum(1 for _ in f) <= 600
