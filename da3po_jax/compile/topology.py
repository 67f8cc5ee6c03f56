"""TPU products as libtpu topologies, for compiling without a TPU; GPU nodes, for lowering.

A product name (`v5e-8`, `v5p-16`, ...) maps to the topology libtpu compiles for: the chip
grid, the chips each host holds (more than one host = a multi-host slice, compiled in one
process all the same), the chip's HBM, and its peak bf16 FLOP/s and HBM bandwidth for the
roofline. v4 and v5p names count TensorCores (two per chip, one JAX device per chip:
megacore); v5e and v6e names count chips.

Per-chip figures (Google Cloud's TPU system architecture pages; nominal):

| chip | HBM GiB | bf16 TFLOP/s | HBM GB/s | host holds |
|------|---------|--------------|----------|------------|
| v4   | 32      | 275          | 1200     | 4 chips (2x2x1) |
| v5e  | 16      | 197          | 819      | up to 8 chips; 4 (2x2) in slices over 8 |
| v5p  | 95      | 459          | 2765     | 4 chips (2x2x1); v5p-2 is one chip |
| v6e  | 32      | 918          | 1640     | up to 8 chips; 4 (2x2) in slices over 8 |

GPUs (`h100-8`: 8 x H100 SXM 80 GiB, 989 dense bf16 TFLOP/s, 3350 GB/s; `h200-N`: 141 GiB,
989, 4800) cannot be compiled for here: XLA's GPU compiler needs a visible device (the
CUDA plugin's topology call fails with "No visible GPU devices", and jax has no
deviceless GPU topology), so their programs are traced and lowered for CUDA
(`lowering_platforms=("cuda",)`) on as many simulated CPU devices, where tracing and
sharding errors surface, and nothing is measured.
"""

from __future__ import annotations

import dataclasses
import math
import os


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU generation: what libtpu calls it and what one chip has."""

    generation: str  # the planner's device key (`plan.DEVICE_GIB`)
    hbm_gib: float
    peak_tflops: float  # dense bf16
    hbm_gbs: float  # GB/s (1e9 bytes)
    cores_per_chip: int  # TensorCores a product name counts per chip
    chip_config: str  # libtpu's chip config ("megacore": one device per chip)
    grids: dict[int, tuple[int, ...]]  # chips -> the chip grid
    platform: str = "tpu"  # "cuda": lowered only (module docstring)


_GRIDS_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4)}
_GRIDS_2D = {
    1: (1, 1),
    4: (2, 2),
    8: (2, 4),
    16: (4, 4),
    32: (4, 8),
    64: (8, 8),
    128: (8, 16),
    256: (16, 16),
}

CHIPS: dict[str, Chip] = {
    "v4": Chip("v4", 32, 275, 1200, 2, "megacore", _GRIDS_3D),
    "v5e": Chip("v5e", 16, 197, 819, 1, "default", _GRIDS_2D),
    "v5p": Chip("v5p", 95, 459, 2765, 2, "megacore", {1: (1, 1, 1), **_GRIDS_3D}),
    "v6e": Chip("v6e", 32, 918, 1640, 1, "default", _GRIDS_2D),
    "h100": Chip("h100", 80, 989, 3350, 1, "", {n: (n,) for n in (1, 2, 4, 8)}, "cuda"),
    "h200": Chip("h200", 141, 989, 4800, 1, "", {n: (n,) for n in (1, 2, 4, 8)}, "cuda"),
}


@dataclasses.dataclass(frozen=True)
class Topology:
    """A TPU product: `name` (e.g. "v5p-16"), its chip, grid and chips per host."""

    name: str
    chip: Chip
    grid: tuple[int, ...]
    host_bounds: tuple[int, int, int]

    @property
    def chips(self) -> int:
        return math.prod(self.grid)

    @property
    def hosts(self) -> int:
        return self.chips // math.prod(self.host_bounds)

    @property
    def platform(self) -> str:
        return self.chip.platform

    @property
    def libtpu_name(self) -> str:
        return f"{self.chip.generation}:{'x'.join(map(str, self.grid))}"

    def describe(self) -> str:
        if self.platform == "cuda":
            return f"{self.name}: {self.chips} x {self.chip.generation.upper()} (lowered only)"
        return (
            f"{self.name}: {self.chips} x TPU {self.chip.generation} ({self.libtpu_name}), "
            f"{self.hosts} host{'s' if self.hosts > 1 else ''}, "
            f"{self.chip.hbm_gib:g} GiB HBM per chip"
        )


def _host_bounds(chip: Chip, grid: tuple[int, ...]) -> tuple[int, int, int]:
    if chip.platform == "cuda":  # one node of up to 8 GPUs
        return (grid[0], 1, 1)
    if len(grid) == 3:
        return (2, 2, 1) if math.prod(grid) >= 4 else grid
    if math.prod(grid) <= 8:  # one host holds the whole slice
        return (grid[0], grid[1], 1)
    return (2, 2, 1)


def topology(name: str) -> Topology:
    """The product `name` ("v4-8", "v5e-4", "v5p-16", "v6e-8", ..., "h100-8", "h200-1").

    Raises:
      ValueError: naming the product and listing the known ones.
    """
    gen, _, count = name.lower().partition("-")
    chip = CHIPS.get(gen)
    if chip is None or not count.isdigit() or int(count) % chip.cores_per_chip:
        raise ValueError(f"unknown TPU topology {name!r}; known: {', '.join(known_topologies())}")
    grid = chip.grids.get(int(count) // chip.cores_per_chip)
    if grid is None:
        raise ValueError(f"unknown TPU topology {name!r}; known: {', '.join(known_topologies())}")
    return Topology(name.lower(), chip, grid, _host_bounds(chip, grid))


def known_topologies() -> list[str]:
    return [
        f"{gen}-{chips * chip.cores_per_chip}"
        for gen, chip in CHIPS.items()
        for chips in chip.grids
    ]


def tpu_devices(topo: Topology) -> list:
    """The topology's TPU devices, from libtpu, on a machine without a TPU (for
    `jit(...).lower(...).compile()`; nothing runs on them).

    JAX must not have started a backend yet: this keeps JAX on the CPU platform
    (`jax_platforms=cpu`, so libtpu is not asked for local chips) and skips the TPU VM
    metadata query.

    Raises:
      RuntimeError: when libtpu is not installed (`pip install -e ".[tpu]"`).
    """
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    # another process of this machine (a test worker) may have loaded libtpu already
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    import jax

    jax.config.update("jax_platforms", "cpu")
    try:
        import libtpu  # noqa: F401
    except ImportError:
        raise RuntimeError(
            f"compiling for {topo.name} needs libtpu: pip install -e '.[tpu]'"
        ) from None
    from jax.experimental import topologies

    desc = topologies.get_topology_desc(
        platform="tpu",
        topology_name=topo.libtpu_name,
        chip_config_name=topo.chip.chip_config,
        chips_per_host_bounds=topo.host_bounds,
        num_slices=1,
    )
    devices = list(desc.devices)
    if len(devices) != topo.chips:
        raise RuntimeError(f"libtpu gave {len(devices)} devices for {topo.describe()}")
    return devices


def devices_for(topo: Topology) -> list:
    """Devices to build the run's mesh from: the TPU topology's (`tpu_devices`), or for a
    GPU node as many CPU devices (XLA's host device count is raised before JAX starts)."""
    if topo.platform == "tpu":
        return tpu_devices(topo)
    flag = f"--xla_force_host_platform_device_count={topo.chips}"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
    import jax

    jax.config.update("jax_platforms", "cpu")
    devices = jax.devices("cpu")
    if len(devices) < topo.chips:
        raise RuntimeError(
            f"lowering for {topo.name} needs {topo.chips} CPU devices; JAX started with "
            f"{len(devices)} (set XLA_FLAGS={flag} before it starts)"
        )
    return devices[: topo.chips]
