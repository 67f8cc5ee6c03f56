"""The reward verifiers, by the name `reward.verifier` takes: `VERIFIERS`.

A verifier is one factory `() -> Verifier` plus one registration::

    from da3po_jax.rewards.verifiers import Verifier, register_verifier

    @register_verifier("exact")
    def exact() -> Verifier:
        return Verifier(exact_match)  # a module-level (answer, reference) -> bool

`RewardScorer(verifier=name)` calls the factory once, when it is built, so a factory
checks there what it needs (an optional package: a clear error at start-up, not a worker
crash at the first batch) and returns what the scorer runs. `VERIFIERS` is the registry
(a read-only mapping: name -> factory): it iterates over the names in registration order
(`choice(*VERIFIERS)`), answers `name in VERIFIERS`, and `verifier_names()` gives them as
a tuple. Lookups happen when a scorer is built, so a verifier registered after import
(e.g. in a test) is used by the scorers built after it; `unregister_verifier` removes one.

This module imports nothing from the package outside `rewards/` (docs/design.md, "Layers"),
so it keeps its own small registry rather than `rl.Registry`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping

from da3po_jax.rewards.math_verify_backend import math_verify_equivalent, require_math_verify

__all__ = [
    "VERIFIERS",
    "Verifier",
    "VerifyFn",
    "custom_verifier",
    "register_verifier",
    "unregister_verifier",
    "verifier_names",
]

VerifyFn = Callable[[str, str], bool]


@dataclasses.dataclass(frozen=True)
class Verifier:
    """What a verifier gives the scorer (`RewardScorer`).

    Attributes:
      verify_fn: `(answer, reference) -> bool`, a picklable module-level function that the
        worker processes call on every extracted answer (no parent fast path), under the
        hard timeout. None: this package's verifier (the bounded `fast_verdict` in the
        parent, then sympy's `verify.is_equivalent` in the workers for the rest).
      exact_first: an answer equal to the reference up to whitespace is correct without
        any check (whatever its size).
      warm_up: a new worker calls the function once on a small pair before it reports
        ready (imports and warms up a slow library, so the first batch's timeouts are
        not spent there).
    """

    verify_fn: VerifyFn | None
    exact_first: bool = True
    warm_up: bool = True


VerifierFactory = Callable[[], Verifier]


class VerifierRegistry(Mapping[str, VerifierFactory]):
    """Name -> verifier factory, in registration order (see the module docstring)."""

    def __init__(self) -> None:
        self._factories: dict[str, VerifierFactory] = {}

    def __getitem__(self, name: str) -> VerifierFactory:
        return self._factories[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._factories)

    def __len__(self) -> int:
        return len(self._factories)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._factories

    def __repr__(self) -> str:
        return f"VERIFIERS{tuple(self._factories)}"


VERIFIERS = VerifierRegistry()


def register_verifier(name: str, factory: VerifierFactory | None = None, *, replace=False):
    """Adds `factory` under `name`; without `factory`, returns a decorator that does.

    Returns:
      `factory` (or the decorator, which returns the function it decorates).

    Raises:
      ValueError: `name` is not a non-empty string, or is registered and `replace` is
        False.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"verifier name must be a non-empty string, got {name!r}")
    if factory is None:
        return lambda f: register_verifier(name, f, replace=replace)
    if name in VERIFIERS and not replace:
        raise ValueError(
            f"verifier {name!r} is already registered (pass replace=True to overwrite)"
        )
    VERIFIERS._factories[name] = factory
    return factory


def unregister_verifier(name: str) -> VerifierFactory:
    """Removes and returns the factory registered as `name`.

    Raises:
      ValueError: no verifier is registered as `name`.
    """
    if name not in VERIFIERS:
        raise ValueError(f"unknown verifier {name!r}; choices: {sorted(VERIFIERS)}")
    return VERIFIERS._factories.pop(name)


def verifier_names() -> tuple[str, ...]:
    """The registered names, in registration order."""
    return tuple(VERIFIERS)


def custom_verifier(verify_fn: VerifyFn) -> Verifier:
    """The verifier of a caller's own `verify_fn` (`RewardScorer(verify_fn=...)`): it
    decides alone (no exact match first, no warm-up), except Math-Verify's own function,
    which is the `math_verify` verifier without its install check."""
    own = verify_fn is math_verify_equivalent
    return Verifier(verify_fn, exact_first=own, warm_up=own)


@register_verifier("builtin")
def builtin() -> Verifier:
    """This package's verifier: the fast path in the parent, sympy in the workers."""
    return Verifier(None)


@register_verifier("math_verify")
def math_verify() -> Verifier:
    """Math-Verify (`math_verify_backend`) in the workers for every answer (needs
    `pip install math-verify`: ImportError with the command otherwise)."""
    require_math_verify()
    return Verifier(math_verify_equivalent)
