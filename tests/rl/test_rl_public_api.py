"""Public API: exports, light import, jit with static configs, the example script."""

import dataclasses
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

import da3po_jax.rl as rl

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def test_all_lists_required_names():
    required = {
        "da3po_loss",
        "compute_advantages",
        "apply_daa",
        "LossConfig",
        "DAAConfig",
        "AdvantageConfig",
        "OverlongConfig",
        "ds_keep_mask",
        "select_kept",
        "ds_add_round",
        "ds_group_metrics",
        "soft_overlong_punishment",
        "overlong_filter_mask",
        "fit_beta_prior",
        "update_prior_state",
        "loss_normalizer",
    }
    assert required <= set(rl.__all__)
    assert len(set(rl.__all__)) == len(rl.__all__)
    for name in rl.__all__:
        assert getattr(rl, name) is not None


def test_rl_package_imports_nothing_else_from_da3po_jax():
    for path in (ROOT / "da3po_jax" / "rl").glob("*.py"):
        for line in path.read_text().splitlines():
            s = line.strip()
            if s.startswith(("import ", "from ")) and "da3po_jax" in s:
                assert s.startswith("from da3po_jax.rl"), f"{path.name}: {s}"
            assert not s.startswith(("import flax", "from flax", "import transformers"))


def test_top_level_import_is_light():
    code = (
        "from da3po_jax import da3po_loss; import sys; "
        "bad = [m for m in sys.modules if m.startswith(('transformers', 'torch', 'flax', "
        "'da3po_jax.models'))]; assert not bad, bad"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr


def test_example_runs_and_prints_results():
    res = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "da3po_loss_example.py")],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    lines = {ln.split(":")[0]: ln for ln in res.stdout.splitlines()}
    assert "kept groups" in lines and "advantages" in lines
    loss = float(lines["loss"].split(":")[1])
    assert np.isfinite(loss)
    assert "'daa/lambda_max': 1.7321" in res.stdout  # sqrt(odds(.5) / odds(.25))


def test_configs_are_static_jit_args():
    @jax.jit
    def f(x):
        return rl.da3po_loss(x, x, jnp.ones(2), jnp.ones((2, 3)), eps_high=0.3)[0]

    np.testing.assert_allclose(f(jnp.zeros((2, 3))), -1.0)
    for cfg in (
        rl.LossConfig(),
        rl.DAAConfig(),
        rl.AdvantageConfig(),
        rl.OverlongConfig(max_len=8),
    ):
        assert dataclasses.is_dataclass(cfg) and hash(cfg) == hash(dataclasses.replace(cfg))
        g = jax.jit(lambda x, c: x + 1, static_argnums=1)
        np.testing.assert_allclose(g(jnp.ones(1), cfg), [2.0])
