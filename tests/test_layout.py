"""The package's shape (docs/design.md, "Layers"): each folder imports only the layers
below it, no two files import each other (directly or through others), only the settings
boundary and the command lines touch ml_collections, and files, functions, the loop class
and folders stay small enough to read. Read from the source with `ast`; nothing is
imported."""

from __future__ import annotations

import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "da3po_jax")

# folder (or top-level module) -> the package's layers it may import (docs/design.md)
ALLOWED = {
    "rl": set(),
    "models": set(),
    "rewards": set(),
    "data": {"rewards"},  # a reference answer is read as the verifier reads it
    "parallel": set(),
    "sampling": {"models", "data", "parallel"},
    "rollout": {"rl", "sampling", "models", "rewards", "data", "parallel"},
    "update": {"rollout", "rl", "models", "parallel"},
    "runtime": {"models", "parallel"},
    "config": {"rollout", "rl", "models", "rewards", "data"},
    "run": {
        "config",
        "runtime",
        "update",
        "rollout",
        "rl",
        "sampling",
        "models",
        "rewards",
        "data",
        "parallel",
    },
}
# compile/ lowers the run's programs through the trainer's own builders (run/)
ALLOWED["compile"] = (ALLOWED["run"] - {"rewards", "data"}) | {"run"}
COMMANDS = ("main", "eval", "export", "sample", "plan", "prepare", "cli")  # CLIs over every layer


def _modules() -> dict[str, str]:
    """module name -> path of every file of the package."""
    out = {}
    for d, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                rel = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].split(os.sep)
                name = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
                out[name] = path
    return out


MODULES = _modules()


def _imports(path: str) -> set[str]:
    """Every module `path` imports (top level and inside functions)."""
    out = set()
    with open(path) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _layer(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def _graph() -> dict[str, set[str]]:
    return {m: {t for t in _imports(p) if t in MODULES and t != m} for m, p in MODULES.items()}


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_layer_imports_only_the_layers_below_it(layer):
    crossing = {
        (m, t)
        for m, targets in _graph().items()
        if _layer(m) == layer
        for t in targets
        if _layer(t) != layer and _layer(t) not in ALLOWED[layer]
    }
    assert not crossing, f"{layer}/ imports outside {sorted(ALLOWED[layer])}: {sorted(crossing)}"


def test_every_layer_is_in_the_table():
    layers = {_layer(m) for m in MODULES if "." in m} - {""}
    assert layers <= set(ALLOWED) | set(COMMANDS), layers - set(ALLOWED) - set(COMMANDS)


def test_no_import_circles():
    """Strongly connected groups of files (Tarjan), `__init__` re-exports included."""
    graph, index, low, stack, on, circles = _graph(), {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, circles


def test_only_the_settings_boundary_and_the_commands_read_ml_collections():
    readers = {
        m for m, p in MODULES.items() if any(t.startswith("ml_collections") for t in _imports(p))
    }
    allowed = {f"da3po_jax.{c}" for c in COMMANDS}
    assert readers <= allowed | {m for m in MODULES if _layer(m) == "config"}, readers


def _length(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def _exempt(lines: list[str], node: ast.AST) -> bool:
    """A comment block right above the `def` (or its decorators) that says why it is long,
    starting `# over 60 lines:`."""
    i = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 2
    while i >= 0 and lines[i].strip().startswith("#"):
        if lines[i].strip().startswith("# over 60 lines:"):
            return True
        i -= 1
    return False


@pytest.mark.parametrize(
    "path", sorted(MODULES.values()), ids=lambda p: os.path.relpath(p, PACKAGE)
)
def test_functions_are_short(path):
    with open(path) as f:
        source = f.read()
    lines = source.split("\n")
    long = [
        f"{node.name} ({_length(node)} lines, line {node.lineno})"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and _length(node) > 60
        and not _exempt(lines, node)
    ]
    assert not long, f"{os.path.relpath(path, PACKAGE)}: over 60 lines (docstring included): {long}"


def test_the_loop_class_is_small():
    with open(os.path.join(PACKAGE, "run", "loop.py")) as f:
        tree = ast.parse(f.read())
    (loop,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RLTrainer"]
    assert _length(loop) < 150


@pytest.mark.parametrize(
    "path", sorted(MODULES.values()), ids=lambda p: os.path.relpath(p, PACKAGE)
)
def test_modules_stay_under_600_lines(path):
    with open(path) as f:
        assert sum(1 for _ in f) <= 600


def test_folders_stay_under_3500_lines():
    sizes = {}
    for module, path in MODULES.items():
        with open(path) as f:
            sizes[_layer(module)] = sizes.get(_layer(module), 0) + sum(1 for _ in f)
    assert max(sizes.values()) <= 3500, sizes
