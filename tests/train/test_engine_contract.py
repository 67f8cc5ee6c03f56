"""The rollout-engine contract (`rollout/protocol.py: RolloutEngine`) is the whole of what
the RL loop, the collector and evaluation use of an engine: every member they reach on one
(read from their source with `ast`) is declared by the protocol, the loop reaches the
engine and the data position only through the collector, and every registered engine
class (`rollout/engines.py: ENGINES`) implements every member of the protocol with a
compatible signature. Nothing is built: classes and sources are read with `inspect`."""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Protocol

import pytest

from da3po_jax.rollout import ENGINES, RolloutEngine, collector
from da3po_jax.rollout.protocol import EngineParts
from da3po_jax.run import evaluation, loop

# the modules that drive an engine (the loop through the collector only)
DRIVERS = (collector, loop, evaluation)
# what the collector and the loop call at least (the scan below must find these)
KNOWN_CALLS = {
    "sync_weights",
    "capacity",
    "admit",
    "in_flight",
    "overdue",
    "finished",
    "release",
    "tokens_generated",
    "snapshot",
    "snapshot_shapes",
    "restore",
    "max_staleness",
    "max_in_flight",
}


def protocol_members(protocol: type) -> dict[str, str]:
    """name -> "method" or "attribute" for every member `protocol` declares."""
    members = {name: "attribute" for name in getattr(protocol, "__annotations__", {})}
    for name, value in vars(protocol).items():
        if not name.startswith("_") and inspect.isfunction(value):
            members[name] = "method"
    return members


def _is_engine(node: ast.AST, aliases: set[str]) -> bool:
    """`x.engine` (any object's engine: the collector's, the trainer's collector's, an
    evaluation's) or a name bound to an engine."""
    if isinstance(node, ast.Attribute):
        return node.attr == "engine"
    return isinstance(node, ast.Name) and node.id in aliases


def _aliases(tree: ast.AST) -> set[str]:
    """Names that hold an engine: parameters called `engine` or annotated `RolloutEngine`,
    and names assigned from an engine (`e = self.engine`, `cfg, engine = ..., self.engine`)."""
    names = {"engine"}
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            if "RolloutEngine" in ast.unparse(node.annotation):
                names.add(node.arg)
    changed = True
    while changed:
        changed = False
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                pairs = [(target, node.value)]
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = list(zip(target.elts, node.value.elts))
                for t, v in pairs:
                    if isinstance(t, ast.Name) and t.id not in names and _is_engine(v, names):
                        names.add(t.id)
                        changed = True
    return names


def engine_uses(source: str) -> set[str]:
    """Every member reached on an engine in `source` (`engine.x`, `self.engine.x`, ...)."""
    tree = ast.parse(textwrap.dedent(source))
    aliases = _aliases(tree)
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and _is_engine(node.value, aliases)
    }


def undeclared(protocol: type, modules=DRIVERS) -> dict[str, set[str]]:
    """module name -> the members its code reaches on an engine that `protocol` lacks."""
    declared = set(protocol_members(protocol))
    out = {}
    for module in modules:
        missing = engine_uses(inspect.getsource(module)) - declared
        if missing:
            out[module.__name__] = missing
    return out


def test_every_call_on_an_engine_is_declared_by_the_protocol():
    found = set().union(*(engine_uses(inspect.getsource(m)) for m in DRIVERS))
    assert KNOWN_CALLS <= found, f"the scan missed {sorted(KNOWN_CALLS - found)}"
    assert undeclared(RolloutEngine) == {}


def test_the_check_catches_a_call_the_protocol_lacks():
    """The protocol before the checkpoint calls were declared: the scan names them."""

    class Partial(Protocol):
        group_size: int
        prompt_len: int
        max_new_tokens: int
        max_in_flight: int
        max_staleness: int

        def sync_weights(self, params, version: int = 0) -> None: ...
        def capacity(self) -> int: ...
        def admit(self, problems, keys) -> None: ...
        def in_flight(self) -> int: ...
        def overdue(self, version: int) -> int: ...
        def finished(self) -> list: ...
        def release(self) -> None: ...

    missing = set().union(*undeclared(Partial).values())
    assert {"snapshot", "snapshot_shapes", "restore", "tokens_generated"} <= missing
    assert engine_uses("def f(c):\n    e = c.engine\n    return e.warm_up()") == {"warm_up"}


def test_the_loop_reaches_the_engine_and_the_data_only_through_the_collector():
    tree = ast.parse(inspect.getsource(loop))
    reached = {
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in ("engine", "iterator")
    }
    assert not reached, f"run/loop.py reaches into the collector: {sorted(reached)}"


def _assigned_in_init(cls: type) -> set[str]:
    """`self.<name>` targets of `cls.__init__` (tuple targets included)."""
    init = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    out = set()
    for node in ast.walk(init):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for t in targets:
            elts = t.elts if isinstance(t, ast.Tuple) else [t]
            for e in elts:
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name):
                    if e.value.id == "self":
                        out.add(e.attr)
    return out


def signature_problems(declared, implemented) -> list[str]:
    """How `implemented` fails to accept every call `declared` allows (empty: compatible):
    the declared parameters by name, kind and position (a declared default kept, with the
    same value), any extra parameter optional."""
    want = list(inspect.signature(declared).parameters.values())[1:]  # without self
    have = list(inspect.signature(implemented).parameters.values())[1:]
    by_name = {p.name: (i, p) for i, p in enumerate(have)}
    problems = []
    for i, p in enumerate(want):
        if p.name not in by_name:
            problems.append(f"no parameter {p.name!r}")
            continue
        j, q = by_name[p.name]
        if q.kind != p.kind or (p.kind is p.POSITIONAL_OR_KEYWORD and i != j):
            problems.append(f"{p.name!r} is {q.kind.description} at {j}, not {i}")
        if p.default is not p.empty and q.default != p.default:
            problems.append(f"{p.name!r} defaults to {q.default!r}, not {p.default!r}")
    extra = [q for q in have if q.name not in {p.name for p in want}]
    for q in extra:
        if q.default is q.empty and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD):
            problems.append(f"extra required parameter {q.name!r}")
    return problems


def _engines():
    names = ENGINES.names()
    assert {"static", "continuous"} <= set(names)
    return [pytest.param(ENGINES.get(n), id=n) for n in names]


@pytest.mark.parametrize("cls", _engines())
def test_registered_engines_implement_every_member(cls):
    assigned = _assigned_in_init(cls)
    for name, kind in protocol_members(RolloutEngine).items():
        if kind == "attribute":
            assert hasattr(cls, name) or name in assigned, f"{cls.__name__} lacks {name}"
            continue
        impl = inspect.getattr_static(cls, name, None)
        assert inspect.isfunction(impl), f"{cls.__name__}.{name} is not a method"
        problems = signature_problems(getattr(RolloutEngine, name), impl)
        assert not problems, f"{cls.__name__}.{name}: {problems}"


@pytest.mark.parametrize("cls", _engines())
def test_registered_engines_have_the_class_level_calls(cls):
    """What the registry and the settings read of an engine class."""
    assert isinstance(cls.uses_slots, bool)
    assert isinstance(inspect.getattr_static(cls, "from_parts"), classmethod)
    assert list(inspect.signature(cls.from_parts).parameters) == ["parts"]
    assert inspect.signature(cls.from_parts).parameters["parts"].annotation in (
        EngineParts,
        "EngineParts",
    )
    for name in ("max_in_flight_for", "return_size_for"):
        assert isinstance(inspect.getattr_static(cls, name), staticmethod), name
        params = list(inspect.signature(getattr(cls, name)).parameters)
        assert params == ["round_size", "slots", "group_size"], name


def test_a_signature_mismatch_is_reported():
    class Engine:
        def overdue(self, steps: int) -> int: ...
        def sync_weights(self, params, version: int = 1, *, extra) -> None: ...

    assert signature_problems(RolloutEngine.overdue, Engine.overdue) == [
        "no parameter 'version'",
        "extra required parameter 'steps'",
    ]
    assert signature_problems(RolloutEngine.sync_weights, Engine.sync_weights) == [
        "'version' defaults to 1, not 0",
        "extra required parameter 'extra'",
    ]
