"""Two local processes (4 CPU devices each, gloo collectives) under `jax.distributed`
run the same 2 RL steps as one process with 8 devices, and agree with it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "multiprocess_worker.py")


def _env(devices: int) -> dict[str, str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _rows(workdir: str, kind: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if r["kind"] == kind]


def _weights(folder: str) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(folder, name)))
    return out


@pytest.mark.multidevice
@pytest.mark.slow
def test_two_processes_match_one_process_with_8_devices(tmp_path):
    single = str(tmp_path / "single")
    ref = subprocess.run(
        [sys.executable, WORKER, single], env=_env(8), capture_output=True, text=True, timeout=900
    )
    assert ref.returncode == 0, ref.stderr[-4000:]

    multi = str(tmp_path / "multi")
    addr = f"localhost:{_free_port()}"
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, multi, addr, "2", str(i)],
            env=_env(4),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-4000:]
    assert "process 1 of 2: 4 local / 8 global devices" in outs[1][0]
    assert os.path.isfile(os.path.join(multi, "log.1.txt"))

    want, got = _rows(single, "train"), _rows(multi, "train")
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2]
    for w, g in zip(want, got):
        for key, value in w.items():
            measured = ("time/", "throughput/", "compile/", "perf/")  # of the process
            if key.startswith(measured) or key in ("kind", "wall_time"):
                continue
            np.testing.assert_allclose(g[key], value, rtol=1e-5, atol=1e-5, err_msg=key)
    assert want[-1]["loss/num_tokens"] > 0
    assert (
        _rows(multi, "eval")[-1]["eval/num_prompts"]
        == _rows(single, "eval")[-1]["eval/num_prompts"]
    )

    a, b = (
        _weights(os.path.join(single, "final_model")),
        _weights(os.path.join(multi, "final_model")),
    )
    assert a.keys() == b.keys() and a
    for name in a:
        np.testing.assert_allclose(b[name], a[name], atol=1e-5, err_msg=name)
    ckpts = os.listdir(os.path.join(multi, "checkpoints"))
    assert "2" in ckpts, ckpts
