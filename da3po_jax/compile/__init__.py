"""Compiling a run's programs for accelerators that are not here (`plan --compile`).

- `topology`: TPU product names (v5e-8, v5p-16, ...) as libtpu topologies, with each
  chip's HBM, peak FLOP/s and bandwidth; `tpu_devices` builds their devices on a CPU host.
- `programs`: every jitted program of a run, lowered through the trainer's own functions
  with abstract, sharded arguments.
- `report`: compiles them and reads memory and cost per device; the run's compiled peak
  beside the planner's estimate, and a roofline step time.
"""

from da3po_jax.compile.programs import Program, abstract_run, run_programs, select
from da3po_jax.compile.report import (
    Compiled,
    compile_all,
    compile_run,
    parameter_shapes,
    print_report,
    summary,
    table,
)
from da3po_jax.compile.topology import (
    Topology,
    devices_for,
    known_topologies,
    topology,
    tpu_devices,
)

__all__ = [
    "Compiled",
    "Program",
    "Topology",
    "abstract_run",
    "compile_all",
    "compile_run",
    "devices_for",
    "known_topologies",
    "parameter_shapes",
    "print_report",
    "run_programs",
    "select",
    "summary",
    "table",
    "topology",
    "tpu_devices",
]
