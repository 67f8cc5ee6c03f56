"""Name -> function registries (advantage estimators, DAA lambda rules).

A config field that picks an algorithm variant by name (`AdvantageConfig.estimator`,
`DAAConfig.estimator`) is validated against, and dispatched through, one `Registry`, so a
new variant is one function plus one `register` call::

    from da3po_jax.rl import ADVANTAGE_ESTIMATORS

    @ADVANTAGE_ESTIMATORS.register("mean-baseline")
    def mean_baseline(rewards, valid, config):
        ...

Lookups happen at call time, so an entry registered after import (e.g. in a test) is
accepted by the configs and used by the functions that dispatch on it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar, overload

T = TypeVar("T")


class Registry(Generic[T]):
    """An ordered mapping from names to entries (functions, or records holding them).

    Args:
      kind: what the registry holds, e.g. `"advantage estimator"` (used in error messages).
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    @overload
    def register(
        self, name: str, fn: None = None, *, replace: bool = False
    ) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, fn: T, *, replace: bool = False) -> T: ...

    def register(self, name, fn=None, *, replace=False):
        """Adds `fn` under `name`; without `fn`, returns a decorator that does.

        Args:
          name: a non-empty string.
          fn: the entry; None to use `register(name)` as a decorator.
          replace: allow overwriting an existing entry of the same name.

        Returns:
          `fn` (or the decorator, which returns the function it decorates).

        Raises:
          ValueError: `name` is already registered and `replace` is False, or is not a
            non-empty string.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if fn is None:
            return lambda f: self.register(name, f, replace=replace)
        if name in self._entries and not replace:
            raise ValueError(
                f"{self.kind} {name!r} is already registered (pass replace=True to overwrite)"
            )
        self._entries[name] = fn
        return fn

    def unregister(self, name: str) -> T:
        """Removes and returns the entry `name` (ValueError, as `get`, if it is unknown)."""
        entry = self.get(name)
        del self._entries[name]
        return entry

    def get(self, name: str) -> T:
        """The entry registered under `name`.

        Raises:
          ValueError: naming the registry, the bad value and the sorted choices.
        """
        if isinstance(name, str) and name in self._entries:
            return self._entries[name]
        raise ValueError(f"unknown {self.kind} {name!r}; choices: {sorted(self._entries)}")

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def check(self, value, *, exclude: Iterable[str] = ()) -> str | None:
        """Config validation: None if `value` is a registered name (and not in `exclude`),
        else `"must be one of [...]"` (registered names minus `exclude`, in order)."""
        exclude = tuple(exclude)
        allowed = [n for n in self._entries if n not in exclude]
        if isinstance(value, str) and value in allowed:
            return None
        return f"must be one of {allowed}"

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._entries)})"
