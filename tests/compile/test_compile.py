"""Compiling a run's programs for TPU topologies on this CPU machine (`plan --compile`).

The compile tests run the command line in a subprocess (JAX must start on the CPU
platform with libtpu present, and the compiled programs' memory goes with the process);
they need libtpu, which the test extra installs on Linux x86-64, and skip elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from da3po_jax.compile import Program, compile_all, known_topologies, print_report, topology

ROOT = Path(__file__).resolve().parents[2]
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
needs_libtpu = pytest.mark.skipif(
    not HAS_LIBTPU, reason="needs libtpu (pip install -e '.[tpu]'; Linux x86-64 only)"
)
PROGRAMS = {
    "update_packed",
    "update_padded",
    "ds_round",
    "sampler",
    "eval_generate",
    "admit_groups",
    "decode_steps",
    "eval_admit_groups",
    "eval_decode_steps",
}


@pytest.mark.parametrize(
    "name, chips, hosts, libtpu_name",
    [
        ("v4-8", 4, 1, "v4:2x2x1"),
        ("v5e-4", 4, 1, "v5e:2x2"),
        ("v5e-8", 8, 1, "v5e:2x4"),
        ("v5e-16", 16, 4, "v5e:4x4"),
        ("v5p-2", 1, 1, "v5p:1x1x1"),
        ("v5p-8", 4, 1, "v5p:2x2x1"),
        ("v5p-16", 8, 2, "v5p:2x2x2"),
        ("v6e-8", 8, 1, "v6e:2x4"),
    ],
)
def test_topology_names(name, chips, hosts, libtpu_name):
    t = topology(name)
    assert (t.chips, t.hosts, t.libtpu_name) == (chips, hosts, libtpu_name)
    assert t.chip.hbm_gib == {"v4": 32, "v5e": 16, "v5p": 95, "v6e": 32}[name.split("-")[0]]


@pytest.mark.parametrize("bad", ["v5p-6", "v7-8", "v5e", "tpu-8", "v5e-3"])
def test_an_unknown_topology_is_refused_naming_the_known_ones(bad):
    with pytest.raises(ValueError, match=f"unknown TPU topology '{bad}'.*v5e-8"):
        topology(bad)
    assert "v5p-16" in known_topologies()


def test_the_default_is_the_runs_own_programs_and_unknown_names_are_refused():
    from da3po_jax.compile import select

    progs = [Program("update_packed", True, None), Program("update_padded", False, None)]
    assert [p.name for p in select(progs, [])] == ["update_packed"]
    assert [p.name for p in select(progs, ["all"])] == ["update_packed", "update_padded"]
    assert [p.name for p in select(progs, ["update_padded"])] == ["update_padded"]
    with pytest.raises(ValueError, match="unknown programs"):
        select(progs, ["sampler"])


def test_a_program_that_fails_is_reported_and_the_exit_status_is_1(capsys):
    def broken():
        raise ValueError("config.rl.pack_rows=3 must be a multiple of 4")

    compiled = compile_all([Program("update_packed", True, broken)], "tpu", mesh=_cpu_mesh())
    assert not compiled[0].ok and "pack_rows=3" in compiled[0].error
    report = {"programs": {"update_packed": compiled[0].to_dict()}, "failed": ["update_packed"]}
    assert print_report(report, as_json=True) == 1
    err = capsys.readouterr().err
    assert "update_packed did not compile: ValueError: config.rl.pack_rows=3" in err


def _cpu_mesh():
    from da3po_jax.parallel import make_mesh

    return make_mesh((1, 1, 1))


def _compile(topo: str, *overrides: str) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    cmd = [sys.executable, "-m", "da3po_jax.plan", "--config=configs/tiny_math.py"]
    proc = subprocess.run(
        [*cmd, *overrides, f"--compile={topo}", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    verb = "lowering" if topo.startswith("h") else "compiling"
    for name in json.loads(proc.stdout)["programs"]:  # progress: a start and an end line
        assert f"{verb} {name} ..." in proc.stderr and f"{name}: ok" in proc.stderr
    return json.loads(proc.stdout)


def _check(report: dict, used: set[str]) -> None:
    """`used`: the run's own programs, which the command compiles by default."""
    assert set(report["programs"]) == used and not report["failed"]
    for name, p in report["programs"].items():
        assert p["used"] and p["compile_s"] > 0 and p["argument_bytes"] > 0, name
        assert p["generated_code_bytes"] > 0 and p["bytes_accessed"] > 0, name
        assert p["flops"] > 0 or name == "ds_round", name
    # the donated train state comes back in place
    update = next(p for n, p in report["programs"].items() if n.startswith("update"))
    assert update["alias_bytes"] > 0.9 * update["output_bytes"] - 4096
    assert 0 < report["compiled_peak_gib"] < report["device_gib"] and report["fits"]
    assert report["planned_peak_gib"] > 0 and report["roofline"]["step_s"] > 0
    assert report["estimate"]["step_s"] > report["roofline"]["step_s"]  # efficiencies < 1
    # splash (with the packing's segment ids) is a Mosaic kernel in the updates, and the
    # ragged kernel in the continuous decode step
    for name in used & {"update_packed", "update_padded", "decode_steps", "eval_decode_steps"}:
        assert report["programs"][name]["kernels"] > 0, name
    assert not report["checks"]["full_remats"], report["checks"]
    assert not report["checks"]["gathers_beyond_one_layer"], report["checks"]


@needs_libtpu
@pytest.mark.slow
def test_the_tiny_run_compiles_for_v5e_4():
    report = _compile("v5e-4", "--config.rollout.engine=static")  # the default: below
    assert report["mesh"] == [4, 1, 1] and report["attention"] == "splash"
    _check(report, {"update_packed", "ds_round", "sampler", "eval_generate"})


@needs_libtpu
@pytest.mark.slow
def test_the_tiny_run_compiles_for_two_hosts_with_the_continuous_engine():
    """Two hosts of 4 chips, FSDP over 4; the padded update and the continuous engine (the
    v5e-4 test compiles the packed update and the static sampler)."""
    report = _compile(
        "v5p-16",
        "--config.mesh.shape=2,-1,1",
        "--config.rollout.engine=continuous",
        "--config.rollout.slots=8",
        "--config.rl.packing=False",
    )
    assert "2 hosts" in report["describe"] and report["mesh"] == [2, 4, 1]
    programs = {"admit_groups", "decode_steps", "eval_admit_groups", "eval_decode_steps"}
    _check(report, {"update_padded", "ds_round"} | programs)


@needs_libtpu
@pytest.mark.parametrize("topo, shape", [("v5e-4", (2, 2, 1)), ("v5p-2", (1, 1, 1))])
def test_the_ragged_decode_kernel_compiles_for_tpu_under_a_mesh(topo, shape):
    """The Pallas kernel lowers through Mosaic (not interpreted) per shard of slots; on one
    chip too (the kernel reads the chip's kind from the mesh, not from this CPU host)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from da3po_jax.compile.programs import lowering_for
    from da3po_jax.compile.topology import tpu_devices
    from da3po_jax.models.decode_kernel import ragged_decode_attention
    from da3po_jax.parallel import make_mesh

    mesh = make_mesh(shape, tpu_devices(topology(topo)))
    split = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
    s, cap, kv, g, d = 16, 512, 2, 7, 128
    q = jax.ShapeDtypeStruct((s, kv, g, d), jnp.bfloat16, sharding=split)
    k = jax.ShapeDtypeStruct((s, cap, kv, d), jnp.bfloat16, sharding=split)
    lengths = jax.ShapeDtypeStruct((s,), jnp.int32, sharding=split)
    with lowering_for("tpu", mesh):
        lowered = jax.jit(lambda *a: ragged_decode_attention(*a, 128)).lower(q, k, k, lengths)
    hlo = lowered.compile().as_text()
    assert hlo.count('custom_call_target="tpu_custom_call"') == 1
    assert "all-gather" not in hlo  # each device attends its own slots


def test_the_tiny_run_lowers_for_an_8_gpu_node():
    """No GPU compile without a GPU (compile/topology.py): every program is traced and
    lowered for CUDA on 8 simulated devices, with cuDNN-choosing kernels, and nothing is
    measured."""
    report = _compile("h100-8", "--programs=all")
    assert report["compiled"] is False and report["fits"] is None
    assert set(report["programs"]) == PROGRAMS and not report["failed"]
    assert report["compiled_peak_gib"] is None and report["planned_peak_gib"] > 0


def _tiny_programs(engine: str, *suites: str, **overrides):
    """(settings, programs) of the tiny run with `suites` on one CPU device."""
    from da3po_jax.compile import run_programs
    from da3po_jax.config import resolve_settings
    from da3po_jax.run.model_shapes import policy_config

    sys.path.insert(0, str(ROOT / "configs"))
    import tiny_math

    config = tiny_math.get_config()
    config.rollout.engine = engine
    config.eval.suites = suites
    for key, value in overrides.items():
        section, field = key.split(".")
        setattr(config[section], field, value)
    settings = resolve_settings(config, inputs=False)
    tp = max(settings.rollout.prompt_buckets)
    _, programs = run_programs(settings, policy_config(settings), _cpu_mesh(), prompt_len=tp)
    return settings, {p.name: p for p in programs}


@pytest.mark.parametrize("engine", ["continuous", "static"])
def test_each_eval_k_is_a_program_of_its_own(engine):
    """An eval samples with its own static GenerateConfig: one set of eval programs per
    distinct k (the held-out set's eval.num_samples = 4 and each suite's), named @kN when
    there are several, traced with that k's shapes; used by the run's engine when it
    evaluates."""
    settings, programs = _tiny_programs(engine, "a path=/a.jsonl k=2", "b path=/b.jsonl k=6")
    assert settings.eval_sample_counts == (2, 4, 6)
    static = engine == "static"
    names = ("eval_generate", "eval_admit_groups", "eval_decode_steps")
    for k in (2, 4, 6):
        for name in names:
            assert programs[f"{name}@k{k}"].used == (static == (name == "eval_generate"))
    slots, tn = settings.rollout.slots, settings.eval_max_new_tokens
    with lowering_for_cpu():
        if static:  # the KV cache of a call's prompts x k rows
            rows = settings.eval.prompts_per_call * 6
            assert rows in {s[0] for s in _arg_shapes(programs["eval_generate@k6"]) if s}
        else:  # the k slots of each of the S // k prompts one admission takes
            assert (slots // 6, 6) in _arg_shapes(programs["eval_admit_groups@k6"])
            assert (slots, tn) in _arg_shapes(programs["eval_decode_steps@k6"])
    # one k: the names the eval programs had before suites
    _, programs = _tiny_programs(engine)
    assert {n for n in programs if n.startswith("eval_")} == set(names)
    # a run that never evaluates uses none of them
    _, programs = _tiny_programs(engine, **{"train.eval_every": 0})
    assert not any(p.used for n, p in programs.items() if n.startswith("eval_"))


def _arg_shapes(program) -> set[tuple[int, ...]]:
    import jax

    return {tuple(a.shape) for a in jax.tree.leaves(program.trace().args_info)}


def lowering_for_cpu():
    from da3po_jax.compile.programs import lowering_for

    return lowering_for("cpu", _cpu_mesh())


def test_the_plan_counts_the_largest_eval_k():
    """The static engine's eval cache is counted for the largest k of the run."""
    from da3po_jax.plan import plan_memory

    settings, _ = _tiny_programs("static", "a path=/a.jsonl k=16")
    plan = plan_memory(settings, (1, 1, 1), num_devices=1)
    assert plan.info["eval_rows"] == settings.eval.prompts_per_call * 16
