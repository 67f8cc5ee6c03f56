"""`da3po_jax.sample` / `sample_from_folder` flags: --dtype, --template and --mesh; every
argument refused before the weights are read, and the command's exit status and last
stderr line on errors."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags
from absl.testing import flagsaver
from flax import nnx
from sample_mesh_worker import GEN, MESHES, PROMPTS
from sampling_helpers import tiny_model

from da3po_jax import sample as sample_cli
from da3po_jax.data import MathProblem
from da3po_jax.models import save_model
from da3po_jax.models.tokenizer import Tokenizer
from da3po_jax.parallel import make_mesh
from da3po_jax.run.inputs import prompt_renderer
from da3po_jax.sampling import Sampler, host
from da3po_jax.sampling.host import (
    config_for,
    encode_prompts,
    load_on_mesh,
    sample_from_folder,
    sample_text,
)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
QUESTION = "  What is 3 + 4?\n"


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return Tokenizer.load(tokenizer_dir)


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tokenizer_dir):
    _, _, _, model = tiny_model()
    return save_model(
        model, str(tmp_path_factory.mktemp("sample") / "model"), tokenizer_dir=tokenizer_dir
    )


def _training_render(tok, template: str) -> str:
    """What training feeds the policy for QUESTION under config.data.template=`template`."""
    spec = importlib.util.spec_from_file_location("base", os.path.join(ROOT, "configs", "base.py"))
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    cfg = base.get_config()
    cfg.data.template = template
    return prompt_renderer(cfg, tok)(MathProblem(id="q", prompt=QUESTION, answer="7"))


def _run_cli(**values) -> None:
    """`sample.main` with these flag values. Only these flags are set (and validated): a
    full parse would also check the required flags of other commands' modules that this
    test process imported (e.g. da3po_jax.export's --workdir)."""
    flags.FLAGS.mark_as_parsed()
    with flagsaver.flagsaver(**values):
        sample_cli.main(["sample"])


class WeightsRead(Exception):
    """Raised in place of reading a model's weights (`no_weights`)."""


@pytest.fixture
def no_weights(monkeypatch):
    """`sample_from_folder` stops with `WeightsRead` where it would read the weights: a
    refusal must come before it (and a huge cache is never allocated)."""

    def read(*args, **kwargs):
        raise WeightsRead

    monkeypatch.setattr(host, "load_on_mesh", read)


def _cli_error(capsys, **values) -> str:
    """The last stderr line of `sample.main` with these flag values; it must exit 1."""
    with pytest.raises(SystemExit) as exit_info:
        _run_cli(**values)
    assert exit_info.value.code == 1
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_dtype_bfloat16_loads_bf16_params_and_samples(folder, tok):
    model = load_on_mesh(folder, make_mesh(), "bfloat16")
    assert (model.config.param_dtype, model.config.dtype) == ("bfloat16", "bfloat16")
    leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
    assert leaves and all(x.dtype == jnp.bfloat16 for x in leaves)
    got = sample_from_folder(folder, PROMPTS, dtype="bfloat16", **GEN)
    graphdef, state = nnx.split(model)
    want = sample_text(
        Sampler(graphdef, model.config, config_for(tok, **GEN)), state, tok, PROMPTS, 0
    )
    np.testing.assert_array_equal(got.output.tokens, want.output.tokens)
    assert got.texts == want.texts and got.output.lengths.min() > 0
    f32 = nnx.state(load_on_mesh(folder, make_mesh()), nnx.Param)  # default: as load_model
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(f32))


@pytest.mark.parametrize("template", ["dapo", "boxed", "raw", "Q: {problem}\nA:"])
def test_template_renders_the_training_prompt(tok, template):
    want = tok.encode([_training_render(tok, template)])[0]
    batch = encode_prompts(tok, [QUESTION], template=template)
    np.testing.assert_array_equal(batch.tokens[0][batch.mask[0]], want)


def test_no_template_keeps_the_chat_template_alone(tok):
    batch = encode_prompts(tok, [QUESTION])
    want = tok.encode([tok.render_prompt(QUESTION)])[0]
    np.testing.assert_array_equal(batch.tokens[0][batch.mask[0]], want)


def test_sample_from_folder_feeds_the_training_prompt(folder, tok):
    result = sample_from_folder(folder, [QUESTION], template="dapo", max_new_tokens=2)
    want = tok.encode([_training_render(tok, "dapo")])[0]
    batch = result.prompts
    np.testing.assert_array_equal(batch.tokens[0][batch.mask[0]], want)
    assert "Answer:" in tok.hf.decode(want)


def test_cli_passes_the_new_flags(folder, capsys):
    _run_cli(
        model=folder,
        prompt=[QUESTION],
        num_samples=2,
        max_new_tokens=6,
        temperature=0.0,
        dtype="bfloat16",
        template="dapo",
        mesh="1,-1,1",
    )
    printed = capsys.readouterr().out
    want = sample_from_folder(
        folder,
        [QUESTION],
        dtype="bfloat16",
        template="dapo",
        num_samples=2,
        max_new_tokens=6,
        temperature=0.0,
    )
    for g in range(2):
        n = int(want.output.lengths[0, g])
        assert f"--- sample {g} ({n} tokens)\n{want.texts[0][g]}\n" in printed + "\n"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dtype": "float64"}, r"dtype='float64'; expected one of \['float32', 'bfloat16'"),
        ({"template": "nope"}, r"unknown prompt template 'nope': use one of \['boxed', 'dapo'"),
        ({"mesh_shape": "1,1"}, r"must have 3 entries"),
        ({"mesh_shape": "a,1,1"}, r"mesh shape 'a,1,1' is not comma-separated integers"),
        ({"mesh_shape": "2,1,1"}, r"has 2 devices but 1 are available"),
    ],
)
def test_bad_values_are_refused_before_loading(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        sample_from_folder(str(tmp_path / "missing"), ["x"], **kwargs)


@pytest.mark.parametrize(
    "flag, value, match",
    [
        ("dtype", "float64", r"--dtype=float64: dtype='float64'; expected one of"),
        ("template", "nope", r"--template=nope: unknown prompt template 'nope': use one of"),
        ("mesh", "0,1,1", r"--mesh=0,1,1: mesh.shape=\(0, 1, 1\): entries must be positive"),
    ],
)
def test_cli_refuses_bad_values_naming_the_flag(flag, value, match):
    with pytest.raises(flags.IllegalFlagValueError, match=match):
        _run_cli(model="unused", prompt=["x"], **{flag: value})


def test_cli_subprocess_exits_with_the_flag_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "da3po_jax.sample", f"--model={tmp_path}", "--prompt=x"]
        + ["--dtype=float64"],
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "--dtype=float64" in proc.stderr, proc.stderr[-2000:]
    assert "expected one of ['float32', 'bfloat16', 'float16']" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_samples": 0}, r"^num_samples=0: must be >= 1$"),
        ({"max_new_tokens": 0}, r"^max_new_tokens=0: must be >= 1$"),
        ({"temperature": -0.5}, r"^temperature=-0.5: must be >= 0 \(0 = greedy\)$"),
        ({"top_k": -1}, r"^top_k=-1: must be >= 0 \(0 = off\)$"),
        ({"top_p": 0.0}, r"^top_p=0.0: must be in \(0, 1\] \(1 = off\)$"),
        ({"top_p": 1.5}, r"^top_p=1.5: must be in \(0, 1\]"),
    ],
)
def test_generate_settings_are_refused_before_loading(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        sample_from_folder(str(tmp_path / "missing"), ["x"], **kwargs)


def test_folders_are_checked_before_the_weights(folder, tmp_path, no_weights):
    missing = str(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match=f"model folder '{missing}' does not exist"):
        sample_from_folder(missing, ["x"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json in model folder"):
        sample_from_folder(str(tmp_path / "empty"), ["x"])
    with pytest.raises(FileNotFoundError, match=f"tokenizer folder '{missing}' does not exist"):
        sample_from_folder(folder, ["x"], tokenizer_path=missing)
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in os.listdir(folder):  # the tokenizer's files beside a broken config.json
        if not name.endswith(".safetensors") and name != "config.json":
            shutil.copy(os.path.join(folder, name), broken / name)
    (broken / "config.json").write_text("{")
    with pytest.raises(ValueError, match=r"model config .*broken/config.json is not valid JSON"):
        sample_from_folder(str(broken), ["x"])


def _room(tok) -> tuple[int, int]:
    """(tokens of the longest of PROMPTS as rendered, new tokens that fit tiny-qwen2's
    max_position_embeddings=1024 after it)."""
    longest = max(map(len, tok.encode([tok.render_prompt(p) for p in PROMPTS])))
    return longest, 1024 - longest


def test_max_new_tokens_beyond_the_model_positions_is_refused(folder, tok, no_weights):
    """The longest prompt plus max_new_tokens may reach max_position_embeddings, not pass
    it; the refusal comes before the weights are read."""
    longest, room = _room(tok)
    match = (
        rf"^max_new_tokens={room + 1}: the longest prompt \({longest} tokens\) plus "
        rf"{room + 1} new tokens exceeds the model's max_position_embeddings=1024: at most "
        rf"{room} new tokens fit$"
    )
    with pytest.raises(ValueError, match=match):
        sample_from_folder(folder, PROMPTS, max_new_tokens=room + 1)
    with pytest.raises(WeightsRead):  # exactly full: accepted
        sample_from_folder(folder, PROMPTS, max_new_tokens=room)


@pytest.mark.parametrize(
    "values, named",
    [
        ({"max_new_tokens": 100_000_000}, "--max_new_tokens=100000000: the longest prompt ("),
        ({"max_new_tokens": 0}, "--max_new_tokens=0: must be >= 1"),
        ({"num_samples": 0}, "--num_samples=0: must be >= 1"),
        ({"temperature": -1.0}, "--temperature=-1.0: must be >= 0 (0 = greedy)"),
        ({"top_k": -2}, "--top_k=-2: must be >= 0 (0 = off)"),
        ({"top_p": 0.0}, "--top_p=0.0: must be in (0, 1] (1 = off)"),
    ],
)
def test_cli_names_the_refused_flag_on_the_last_line(
    folder, tok, capsys, no_weights, values, named
):
    last = _cli_error(capsys, model=folder, prompt=PROMPTS, **values)
    assert last.startswith(f"da3po_jax: error: ValueError: {named}"), last
    if values.get("max_new_tokens", 0) > 1:
        room = _room(tok)[1]
        assert last.endswith(f"max_position_embeddings=1024: at most {room} new tokens fit")


def test_cli_subprocess_ends_with_the_error_line(tmp_path):
    """A missing model folder: exit status 1, the last stderr line names the folder."""
    missing = str(tmp_path / "missing")
    proc = subprocess.run(
        [sys.executable, "-m", "da3po_jax.sample", f"--model={missing}", "--prompt=x"],
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last == f"da3po_jax: error: FileNotFoundError: model folder '{missing}' does not exist"


@pytest.mark.multidevice
def test_greedy_samples_on_8_devices_equal_one_device(folder, tmp_path):
    out = tmp_path / "mesh.npz"
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu"
    )
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "sample_mesh_worker.py"), folder, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    want = sample_from_folder(folder, PROMPTS, **GEN)  # this pytest process: one device
    got = np.load(out)
    for flag, _ in MESHES:
        np.testing.assert_array_equal(got[f"{flag}/prompt_tokens"], want.prompts.tokens)
        np.testing.assert_array_equal(got[f"{flag}/tokens"], want.output.tokens, err_msg=flag)
        np.testing.assert_array_equal(got[f"{flag}/lengths"], want.output.lengths, err_msg=flag)
