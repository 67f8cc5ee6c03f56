"""The rollout engines a run can use, by the name `rollout.engine` takes.

A new engine is a class with the `RolloutEngine` calls (`rollout/protocol.py`), a
`from_parts(EngineParts)` constructor, `max_in_flight_for(round_size, slots, group_size)`
and `uses_slots`, registered here with one `ENGINES.register(name, cls)`; the config
accepts the name and the run builds it (`run/build.py: make_engine`).
"""

from __future__ import annotations

from da3po_jax.rl import Registry
from da3po_jax.rollout.continuous import ContinuousEngine
from da3po_jax.rollout.protocol import EngineParts, RolloutEngine
from da3po_jax.rollout.static import StaticEngine

ENGINES: Registry[type] = Registry("rollout engine")
ENGINES.register("static", StaticEngine)
ENGINES.register("continuous", ContinuousEngine)


def build_engine(name: str, parts: EngineParts) -> RolloutEngine:
    """The engine registered as `name`, built from `parts`."""
    return ENGINES.get(name).from_parts(parts)
