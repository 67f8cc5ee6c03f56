"""Every command of the ```bash blocks of README.md and of the documentation pages that
show how to use the library (`PAGES`) runs here, so a broken example fails CI.

`COMMANDS` maps each documented command (continuation lines joined, comments dropped; the
same command on several pages counts once) to how it is run: training commands get short
config overrides appended (a few SFT steps, 1-2 RL steps, a tiny eval); the recipes'
downloaded models and datasets (`/data/...`) are replaced by tiny local fixtures built here
(a random model saved as a HF folder with a BPE tokenizer, a DAPO-Math-style Parquet file,
a JSONL eval set, the benchmarks' release-shaped files); `/tmp/...` workdirs move into
pytest's temporary directory; launch scripts run with `--dry-run`; benchmarks get small
flags; the `pip install` before a command is checked against the two documented installs
and not rerun, and the test command itself (`python -m pytest`) must be a line of
`.ci/run`, which runs it verbatim; the install page's own installs (`Run.install`) are
checked against pyproject.toml's extras and the files they name, not run.
`test_every_readme_command_is_covered` fails when a page gains a command the table does
not cover (or the table keeps one the pages dropped), so no example goes untested. Of the
```python blocks (docs/api.md), the models example runs on the fixture model and the loss
fragment is compiled (its runnable version is examples/da3po_loss_example.py).

The commands run as subprocesses (`bash -c`, cwd = the repo root, `python` = this
interpreter, JAX_PLATFORMS=cpu), a few at a time in a background pool started when the
first of them is needed; commands of one `job` run one after the other in page order
(the sampling command reads the quick start's exported model, the OPD seeds reuse the
teacher the first OPD run builds).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The pages whose commands run here, in this order (a job's commands run in it). The other
# pages' commands (results.md's studies, prepare.md's and evaluation.md's examples) are
# checked by tests/test_docs.py: every module, flag, field and file they name exists.
PAGES = tuple(
    ROOT / p
    for p in (
        "README.md",
        "docs/install.md",
        "docs/quickstart.md",
        "docs/recipes.md",
        "docs/scaling.md",
        "docs/api.md",
        "docs/tools.md",
        "docs/benchmarks.md",
        "docs/testing.md",
    )
)

# The two documented installs; the test environment already has the package.
INSTALLS = ("pip install -e .", 'pip install -e ".[test]"')


@dataclasses.dataclass(frozen=True)
class Run:
    """How one README command runs here.

    Attributes:
      id: the test id.
      job: commands of one job run one after the other, in README order (None: not run).
      append: arguments appended to the command (config overrides, small flags).
      replace: (old, new) rewrites of the command text, applied first.
      env: extra environment variables.
      expect: text the output must contain.
      needs: modules that must be importable (else the test is skipped).
      slow: marked `slow` (still runs in CI).
      extended: marked `extended` (left out of the README's test command).
      install: a `pip install` of the install page: its extras must be pyproject.toml's
        and its files must exist (not run: the tests run in an installed environment).
    """

    id: str
    job: str | None
    append: tuple[str, ...] = ()
    replace: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    expect: str = ""
    needs: tuple[str, ...] = ()
    slow: bool = True
    extended: bool = False
    install: bool = False


def _o(**overrides) -> tuple[str, ...]:
    """`--config.a.b=v` flags from a_b=v keywords (a double underscore is a dot)."""
    return tuple(f"--config.{k.replace('__', '.')}={v}" for k, v in overrides.items())


# The embedded tiny task: a few SFT steps, small rounds, a tiny held-out set.
TINY = _o(
    sft__steps=4,
    sft__stop_acc=0,
    sft__batch_size=8,
    data__synthetic_train=64,
    data__synthetic_eval=8,
    data__synthetic_sft=64,
    rollout__prompts_per_round=4,
    rollout__group_size=2,
    rollout__max_new_tokens=16,
    rl__train_prompts=4,
    rl__mini_batch_prompts=2,
    ds__max_prompts=4,
    eval__num_samples=2,
    eval__max_prompts=4,
    eval__prompts_per_call=4,
)
TWO_STEPS = _o(train__steps=2, train__eval_every=2, train__checkpoint_every=2)
ONE_STEP = _o(train__steps=1, train__eval_every=1, train__checkpoint_every=1)
# The real recipes on the fixture model: 2 prompts x 2 samples of 8 tokens, one step. The
# recipes' dtypes, remat and mesh stay as written.
REAL = ONE_STEP + _o(
    rollout__prompts_per_round=2,
    rollout__group_size=2,
    rollout__max_new_tokens=8,
    rollout__prompt_buckets="128,256",
    overlong__buffer=2,
    rl__train_prompts=2,
    rl__mini_batch_prompts=1,
    ds__max_prompts=2,
    eval__num_samples=2,
    eval__max_prompts=2,
    eval__prompts_per_call=2,
    reward__num_workers=1,
    model__logits_chunk=64,
    rollout__slots=8,  # the continuous engine's (a multiple of the 8 simulated devices)
)
# configs/tiny_opd.py caches its teacher and student under /tmp/da3po_tiny_opd.
TINY_OPD = TINY + ONE_STEP + ("--config.teacher.sft_steps=4",)
TINY_OPD_CACHE = (
    "--config.teacher.path=/tmp/da3po_tiny_opd/teacher",
    "--config.sft.out_dir=/tmp/da3po_tiny_opd/student",
)
# "..." in the mesh examples: the rest of the qwen_math command above them.
QWEN_MATH_REST = (
    "--config.model.path=/data/Qwen2.5-Math-7B "
    "--config.data.train_path=/data/dapo-math-17k.parquet --workdir=/tmp/runs/mesh"
)
EIGHT_DEVICES = (("XLA_FLAGS", "--xla_force_host_platform_device_count=8"),)
# `prepare` offline: the fixture model and the benchmarks' release-shaped fixture files
# (relative to the repository root, the commands' cwd: a clone under /tmp/ keeps them).
BENCHMARK_FIXTURES = "tests/data/fixtures/benchmarks"
PREPARE_OFFLINE = "--offline --model=/data/qwen3-model --files=" + ",".join(
    f"{name}={BENCHMARK_FIXTURES}/{file}"
    for name, file in (
        ("dapo_math_17k", "dapo_math_17k.parquet"),
        ("aime2024", "aime2024.jsonl"),
        ("aime2025", "aime2025.jsonl"),
        ("aime2026", "aime2026.jsonl"),
        ("amc23", "amc23.jsonl"),
        ("minerva", "minerva.jsonl"),
        ("olympiadbench", "olympiadbench.jsonl"),
        ("math500", "math500.jsonl"),
    )
)

COMMANDS: dict[str, Run] = {
    # --- quick start
    "pip install -e . && python -m da3po_jax.main --config=configs/tiny_math.py "
    "--workdir=/tmp/da3po_run": Run("quickstart", "quickstart", TINY + TWO_STEPS),
    'pip install -e ".[test]" && python -m pytest -n 2 --dist loadfile -m "not extended"': Run(
        "tests", None, slow=False
    ),
    # --- installs of docs/install.md (checked, not run) and its device check
    "pip install -e .": Run("install_cpu", None, install=True, slow=False),
    'pip install -e ".[gpu]"': Run("install_gpu", None, install=True, slow=False),
    "pip install -c .ci/constraints.txt -e .": Run(
        "install_constraints", None, install=True, slow=False
    ),
    'python -c "import jax; print(jax.devices())"': Run(
        "jax_devices", "jax_devices", expect="CpuDevice", slow=False
    ),
    # --- the DA3PO paper's experiment: prepare offline from the release-shaped fixtures
    # (tests/test_prepare.py), plan the recipe, run it one step on the fixture model with
    # the prepared flag file (4 simulated devices: the v5p-8 mesh is (1, 4, 1); 32 slots:
    # the suites' largest k; buckets up to the fixture model's 1024 positions)
    "python -m da3po_jax.prepare --out=/data/da3po --files=aime2026=/data/raw/aime_2026.jsonl": Run(
        "prepare",
        "paper",
        replace=(("--files=aime2026=/data/raw/aime_2026.jsonl", PREPARE_OFFLINE),),
        expect="overrides for --config=...",
    ),
    "python -m da3po_jax.plan --config=configs/da3po_qwen3_4b.py:v5p-8 --device=v5p "
    "--num_devices=4": Run("plan_paper", "paper", expect="PEAK", extended=True),
    "python -m da3po_jax.main --config=configs/da3po_qwen3_4b.py:v5p-8 "
    "--flagfile=/data/da3po/overrides.flags --workdir=/data/runs/da3po_4b": Run(
        "paper",
        "paper",
        REAL + _o(rollout__slots=32, rollout__prompt_buckets="512,1008"),  # the BPE's long rows
        env=(("XLA_FLAGS", "--xla_force_host_platform_device_count=4"),),
        expect="aime2024",
        extended=True,
    ),
    # --- a real model
    "python -m da3po_jax.main --config=configs/qwen_math.py "
    "--config.model.path=/data/Qwen2.5-Math-7B "
    "--config.data.train_path=/data/dapo-math-17k.parquet "
    "--config.data.eval_path=/data/aime-2024.jsonl "
    "--workdir=/data/runs/qwen_math": Run("qwen_math", "qwen_math", REAL, extended=True),
    # --- on-policy distillation (extended: CI time; tests/train/test_opd.py and the
    # ra_opd metric reference run the same trainer on every CI run; the qwen_opd command
    # below too)
    "python -m da3po_jax.main --config=configs/tiny_opd.py --workdir=/tmp/opd_s0": Run(
        "tiny_opd", "tiny_opd", TINY_OPD + TINY_OPD_CACHE, extended=True
    ),
    "python -m da3po_jax.main --config=configs/tiny_opd.py --config.algo=ra_opd "
    "--workdir=/tmp/ra_opd_s0": Run(
        "tiny_ra_opd", "tiny_opd", TINY_OPD + TINY_OPD_CACHE, extended=True
    ),
    "python -m da3po_jax.main --config=configs/tiny_opd.py --config.seed=1 "
    "--workdir=/tmp/opd_s1": Run(
        "tiny_opd_seed1", "tiny_opd", TINY_OPD + TINY_OPD_CACHE, extended=True
    ),
    "python -m da3po_jax.main --config=configs/qwen_opd.py "
    "--config.model.path=/data/Qwen3-1.7B --config.teacher.path=/data/Qwen3-8B "
    "--config.data.train_path=/data/dapo-math-17k.parquet "
    "--workdir=/data/runs/qwen_opd": Run("qwen_opd", "qwen_opd", REAL, extended=True),
    # --- meshes (8 simulated CPU devices) and the planner; FSDP over 8 devices and the
    # planner's command are extended (CI time): the (1, 4, 2) command runs FSDP and tensor
    # parallelism together, tests/parallel runs FSDP meshes, test_plan the planner
    "python -m da3po_jax.main --config=configs/qwen_math.py --config.mesh.shape=1,-1,1 ...": Run(
        "mesh_fsdp",
        "mesh_fsdp",
        REAL,
        replace=(("...", QWEN_MATH_REST + "_fsdp"),),
        env=EIGHT_DEVICES,
        extended=True,
    ),
    "python -m da3po_jax.main --config=configs/qwen_math.py --config.mesh.shape=1,4,2 ...": Run(
        "mesh_fsdp_tensor",
        "mesh_fsdp_tensor",
        REAL,
        replace=(("...", QWEN_MATH_REST + "_fsdp_tensor"),),
        env=EIGHT_DEVICES,
    ),
    "python -m da3po_jax.plan --config=configs/qwen_math.py --config.mesh.shape=1,8,1 "
    "--device=h100": Run("plan", "plan", expect="PEAK", slow=False, extended=True),
    # --- compiling for TPUs without a TPU (libtpu): the tiny run, one small program
    "python -m da3po_jax.plan --config=configs/qwen_math_1p5b_v5e8.py --compile=v5e-8": Run(
        "compile_v5e8",
        "compile",
        ("--programs=ds_round",),
        replace=(("configs/qwen_math_1p5b_v5e8.py", "configs/tiny_math.py"),),
        expect="ds_round: ok",
        needs=("libtpu",),
        slow=False,
    ),
    # --- TPU VM and SLURM launch scripts: every command with --dry-run
    "export TPU_NAME=my-tpu TPU_ZONE=us-east5-a": Run("tpu_env", "tpu", slow=False),
    "launch/tpu_vm.sh create --type v5p-8": Run(
        "tpu_create", "tpu", expect="gcloud compute tpus tpu-vm create my-tpu", slow=False
    ),
    "launch/tpu_vm.sh copy": Run("tpu_copy", "tpu", expect="git -C", slow=False),
    "launch/tpu_vm.sh setup": Run("tpu_setup", "tpu", expect="tpu_scripts/setup.sh", slow=False),
    "launch/tpu_vm.sh run -- --config=configs/qwen_math.py --workdir=/mnt/shared/run1": Run(
        "tpu_run", "tpu", expect="da3po_jax.main", slow=False
    ),
    "launch/tpu_vm.sh logs --follow": Run("tpu_logs", "tpu", expect="tail -n 50 -F", slow=False),
    "launch/tpu_vm.sh stop && launch/tpu_vm.sh delete": Run(
        "tpu_stop_delete", "tpu", expect="tpu-vm delete my-tpu", slow=False
    ),
    # sbatch is not here: the script's own dry run on four named hosts stands in for it.
    "sbatch --nodes=4 --gpus-per-node=8 launch/slurm_gpu.sh --config=configs/qwen_math.py": Run(
        "slurm",
        "slurm",
        replace=(
            (
                "sbatch --nodes=4 --gpus-per-node=8 launch/slurm_gpu.sh",
                "launch/slurm_gpu.sh --dry-run --hosts=gpu0,gpu1,gpu2,gpu3",
            ),
        ),
        expect="--nodes=4",
        slow=False,
    ),
    # --- benchmarks: the tiny preset, small shapes (the last flag wins)
    "python benchmarks/forward.py --preset=qwen2.5-0.5b --batch=4 --seq=256": Run(
        "bench_forward",
        "bench_forward",
        ("--preset=tiny-qwen2", "--batch=1", "--seq=16", "--iters=1"),
        expect='"benchmark": "forward"',
    ),
    "python benchmarks/sampler.py --compare-hf": Run(
        "bench_sampler",
        "bench_sampler",
        ("--preset=tiny-qwen2", "--dtypes=float32", "--settings=1x2", "--prompt_len=8")
        + ("--new_tokens=4",),
        expect='"hf_over_ours"',
        needs=("torch",),
    ),
    "python benchmarks/rl_step.py": Run(
        "bench_rl_step",
        "bench_rl_step",
        ("--steps=2", "--prompts=2", "--group-size=2", "--max-new-tokens=4", "--mini-batch=1"),
        expect='"benchmark": "rl_step"',
    ),
    "python benchmarks/rl_step.py --preset=qwen2.5-0.5b --prompts=4 --group-size=4 "
    "--max-new-tokens=32": Run(
        "bench_rl_step_preset",
        "bench_rl_step_preset",
        ("--preset=tiny-qwen2", "--steps=2", "--prompts=2", "--group-size=2")
        + ("--max-new-tokens=4", "--mini-batch=1"),
        expect='"benchmark": "rl_step"',
    ),
    "python benchmarks/rl_step.py --engines=static,continuous": Run(
        "bench_rl_step_engines",
        "bench_rl_step_engines",
        ("--steps=2", "--prompts=2", "--group-size=2", "--max-new-tokens=4", "--mini-batch=1")
        + ("--slots=4", "--steps-per-call=2"),
        expect='"rollout_speedup"',
    ),
    "python benchmarks/rollout.py --workload=geometric --mean=150 --max_new=1024 --slots=64": Run(
        "bench_rollout",
        "bench_rollout",
        ("--max_new=16", "--slots=4", "--prompts=4", "--group=2", "--prompt_len=8")
        + ("--mean=6", "--block=8", "--steps_per_call=4"),
        expect='"speedup"',
    ),
    "python benchmarks/rollout.py --rl_steps=8": Run(
        "bench_rollout_steps",
        "bench_rollout",
        ("--rl_steps=2", "--max_new=16", "--slots=4", "--prompts=4", "--group=2")
        + ("--prompt_len=8", "--mean=6", "--block=8", "--steps_per_call=4"),
        expect='"speedup_recompute"',
    ),
    "python benchmarks/decode_step.py": Run(
        "bench_decode_step",
        "bench_decode_step",
        ("--mean=8", "--max_new=32", "--slots=4", "--block=8", "--repeats=2"),
        expect='"attention_share"',
    ),
    "python benchmarks/verifier.py": Run(
        "bench_verifier",
        "bench_verifier",
        ("--batch=40", "--repeats=1", "--no-math-verify"),
        expect='"throughput"',
    ),
    "python benchmarks/forward.py --suite=memory": Run(
        "bench_memory",
        "bench_forward_suites",
        ("--preset=tiny-qwen2", "--min_t=32", "--max_t=64", "--naive_run_max_t=32"),
        expect='"temp_increment_ratio"',
    ),
    "python benchmarks/forward.py --suite=packing": Run(
        "bench_packing",
        "bench_forward_suites",
        ("--preset=tiny-qwen2", "--prompts=2", "--group=2", "--prompt_bucket=8")
        + ("--prompt_min=2", "--cap=16", "--mean=4", "--logits_chunk=8", "--iters=1"),
        expect='"speedup_vs_padded"',
    ),
    "python benchmarks/forward.py --suite=compile": Run(
        "bench_compile",
        "bench_forward_suites",
        ("--preset=tiny-qwen2", "--seq=16"),
        expect='"unrolled_over_scanned"',
    ),
    "python benchmarks/forward.py --suite=torch": Run(
        "bench_torch",
        "bench_forward_suites",
        ("--preset=tiny-qwen2", "--batch=1", "--seq=16", "--iters=1", "--mem_wait=0"),
        expect='"ours_over_torch"',
        needs=("torch",),
    ),
    # --- exporting the quick start's newest checkpoint
    "python -m da3po_jax.export --workdir=/tmp/da3po_run --out=/tmp/da3po_export": Run(
        "export", "quickstart", expect="da3po_export"
    ),
    # --- evaluating the quick start's newest checkpoint
    "python -m da3po_jax.eval --checkpoint=/tmp/da3po_run": Run(
        "eval", "quickstart", expect="avg@"
    ),
    # --- sampling from the quick start's exported model
    'python -m da3po_jax.sample --model=/tmp/da3po_run/final_model --prompt="What is 47 + 8?" '
    "--num_samples=4 --max_new_tokens=32 --temperature=1.0": Run(
        "sample", "quickstart", expect="--- sample 3"
    ),
}

# README paths of downloaded models and data -> the local fixtures standing in for them.
FIXTURE_PATHS = {
    "/data/Qwen2.5-Math-7B": "qwen2",
    "/data/Qwen3-1.7B": "qwen3_student",
    "/data/Qwen3-8B": "qwen3_teacher",
    "/data/dapo-math-17k.parquet": "dapo-math.parquet",
    "/data/aime-2024.jsonl": "aime.jsonl",
    "/data/runs/": "runs/",
    "/data/qwen3-model": "qwen3_student",
    "/data/da3po": "da3po",
}

# ```python blocks, by their first line: "run" (on the fixture model) or "compile" (a
# fragment over the caller's arrays; its runnable version, examples/da3po_loss_example.py,
# runs in tests/rl/test_rl_public_api.py).
PYTHON_BLOCKS = {"import jax.numpy as jnp": "run", "import jax": "compile"}
PYTHON_PATHS = {"/path/to/Qwen2.5-Math-1.5B": "qwen2", "/tmp/export": "export"}


# --- README parsing ----------------------------------------------------------------------


def _blocks(lang: str) -> list[str]:
    """The ```lang blocks of `PAGES`, in page order."""
    pattern = rf"^```{lang}\n(.*?)^```"
    return [b for page in PAGES for b in re.findall(pattern, page.read_text(), flags=re.M | re.S)]


def _strip_comment(line: str) -> str:
    """`line` without a trailing shell comment (a `#` outside quotes, at a word start)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def readme_commands() -> list[str]:
    """Every command of the pages' bash blocks, continuation lines joined, each once (at
    its first place)."""
    commands = []
    for block in _blocks("bash"):
        pending = ""
        for raw in block.splitlines():
            line = raw.strip()
            if line.endswith("\\"):
                pending += line[:-1].strip() + " "
                continue
            line, pending = _strip_comment(pending + line).strip(), ""
            if line and line not in commands:
                commands.append(line)
        assert not pending, f"README bash block ends inside a continued line: {pending!r}"
    return commands


def test_every_readme_command_is_covered():
    commands = readme_commands()
    readme = README.read_text()
    for install in INSTALLS:  # the two commands of the README's top
        assert f"\n{install} && " in readme, f"README lost its install {install!r}"
    missing = [c for c in commands if c not in COMMANDS]
    stale = [c for c in COMMANDS if c not in commands]
    assert not missing, f"README commands missing from COMMANDS (add how to run them): {missing}"
    assert not stale, f"COMMANDS entries no longer in README.md (remove them): {stale}"
    chained = {
        c.partition(" && ")[0] for c in commands if c.startswith("pip install") and "&&" in c
    }
    assert chained == set(INSTALLS), f"installs before a command {chained} vs {INSTALLS}"
    first_lines = [b.splitlines()[0] for b in _blocks("python")]
    assert sorted(first_lines) == sorted(PYTHON_BLOCKS), (
        f"README python blocks {first_lines} vs PYTHON_BLOCKS {sorted(PYTHON_BLOCKS)}"
    )


# --- running ------------------------------------------------------------------------------


def _rewrite(command: str, run: Run, tmp: Path, fixtures: Path) -> str:
    """The shell command that runs README's `command` here."""
    for old, new in run.replace:
        assert old in command, (old, command)
        command = command.replace(old, new)
    first, _, rest = command.partition(" && ")
    if first.startswith("pip install"):
        assert first in INSTALLS, f"undocumented install {first!r} (documented: {INSTALLS})"
        command = rest
    command = command.replace("/tmp/", f"{tmp}/")  # first: the fixtures may lie in /tmp too
    for old, name in sorted(FIXTURE_PATHS.items(), key=lambda kv: -len(kv[0])):
        command = command.replace(old, str(fixtures / name) + ("/" if name.endswith("/") else ""))
    command = command.replace("launch/tpu_vm.sh ", "launch/tpu_vm.sh --dry-run ")
    if run.append:
        command += " " + " ".join(shlex.quote(a.replace("/tmp/", f"{tmp}/")) for a in run.append)
    # A documented path under /data/ (not the repository's own tests/data/) is left.
    assert not re.search(r"(^|[\s=,'\"])/data/", command), f"no fixture for /data/ in {command!r}"
    return command


def _environment(tmp: Path) -> dict[str, str]:
    """This process's environment without launch-script settings, `python` = this
    interpreter (a wrapper first on PATH), JAX on CPU, no network, temp files in `tmp`."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    wrapper.chmod(0o755)
    (tmp / "tmpdir").mkdir(exist_ok=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TPU_", "SLURM_", "DA3PO_", "COORDINATOR_", "XLA_FLAGS"))
    }
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        JAX_PLATFORMS="cpu",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        TMPDIR=str(tmp / "tmpdir"),
        MPLBACKEND="Agg",
        # One compilation cache for all the commands: the OPD seeds and the two RL-step
        # benchmarks compile the same programs.
        JAX_COMPILATION_CACHE_DIR=str(tmp / "jax_cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    )
    return env


def build_fixtures(root: Path) -> None:
    """Tiny random models saved as HF folders (with a BPE tokenizer), a DAPO-Math-17k-like
    Parquet file (chat-message prompts, `reward_model.ground_truth`) and a JSONL eval set."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from da3po_jax.models import get_preset, init_model, save_model
    from da3po_jax.models.tokenizer import build_bpe_tokenizer

    problems = [(f"What is {a} + {b}?", str(a + b)) for a in range(12) for b in range(0, 12, 3)]
    corpus = [f"{q} Let's think. The answer is {a}.\nAnswer: {a}" for q, a in problems]
    tok = build_bpe_tokenizer(str(root / "tokenizer"), corpus, vocab_size=300)
    vocab = 304  # room for the 300 token ids, padded to a multiple of 8 as checkpoints are
    qwen3 = dict(model_type="qwen3", qk_norm=True, attention_bias=False)
    for name, seed, overrides in (
        ("qwen2", 0, {}),
        ("qwen3_student", 0, qwen3),
        ("qwen3_teacher", 1, qwen3),
    ):
        model = init_model(get_preset("tiny-qwen2", vocab_size=vocab, **overrides), seed=seed)
        save_model(model, str(root / name), tokenizer_dir=tok)
    dapo = "Solve the following math problem step by step. {q}\nAnswer: $Answer"
    rows = [
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": dapo.format(q=q)}],
            "reward_model": {"ground_truth": a, "style": "rule-lm"},
        }
        for q, a in problems
    ]
    pq.write_table(pa.Table.from_pylist(rows + rows[:4]), root / "dapo-math.parquet")  # dupes
    with open(root / "aime.jsonl", "w") as f:
        for q, a in problems[:6]:
            f.write(json.dumps({"problem": q, "answer": a}) + "\n")
    (root / "runs").mkdir()


class Launcher:
    """Runs the selected README commands' jobs in a small thread pool of subprocesses."""

    def __init__(self, tmp: Path, selected: set[str]):
        self.tmp, self.fixtures = tmp, tmp / "fixtures"
        self.fixtures.mkdir()
        self.env = _environment(tmp)
        self._built, self._lock = False, threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2)))
        jobs: dict[str, list[str]] = {}
        for command in readme_commands():  # README order within a job
            run = COMMANDS.get(command)
            if run is not None and run.job is not None:
                jobs.setdefault(run.job, []).append(command)
        self.results: dict[str, Future] = {}
        # The longest jobs first (most slow commands), the rest in README order.
        for commands in sorted(jobs.values(), key=lambda cs: -sum(COMMANDS[c].slow for c in cs)):
            if selected & set(commands):
                # up to the last selected command: the earlier ones prepare it (an extended
                # command after it does not run in a run that deselects it)
                last = max(i for i, c in enumerate(commands) if c in selected)
                commands = commands[: last + 1]
                future = self.pool.submit(self._job, commands)
                for command in commands:
                    self.results[command] = future

    def build_fixtures(self) -> Path:
        """The fixtures, built by the first caller (the others wait)."""
        with self._lock:
            if not self._built:
                build_fixtures(self.fixtures)
                self._built = True
        return self.fixtures

    def _job(self, commands: list[str]) -> dict[str, tuple[str, subprocess.CompletedProcess]]:
        env, out = dict(self.env), {}
        for command in commands:
            run = COMMANDS[command]
            if command.startswith("export "):  # the block's later commands see these
                env.update(kv.split("=", 1) for kv in shlex.split(command)[1:])
                out[command] = (command, None)
                continue
            if any(importlib.util.find_spec(m) is None for m in run.needs):
                out[command] = (command, None)
                continue
            final = _rewrite(command, run, self.tmp, self.fixtures)
            if str(self.fixtures) in final:
                self.build_fixtures()
            proc = subprocess.run(
                ["bash", "-c", final],
                cwd=ROOT,
                env={**env, **dict(run.env)},
                capture_output=True,
                text=True,
                timeout=900,
            )
            out[command] = (final, proc)
        return out

    def result(self, command: str) -> tuple[str, subprocess.CompletedProcess | None]:
        return self.results[command].result(timeout=1800)[command]


@pytest.fixture(scope="module")
def launcher(request, tmp_path_factory):
    this = Path(__file__).resolve()
    selected = {
        item.callspec.params["command"]
        for item in request.session.items
        if Path(item.path).resolve() == this
        and hasattr(item, "callspec")
        and "command" in item.callspec.params
    }
    launch = Launcher(tmp_path_factory.mktemp("readme"), selected)
    yield launch
    launch.pool.shutdown(wait=True, cancel_futures=True)


def _params():
    params = []
    for i, command in enumerate(readme_commands()):
        run = COMMANDS.get(command)
        marks = [pytest.mark.slow] if run is not None and run.slow else []
        marks += [pytest.mark.extended] if run is not None and run.extended else []
        params.append(pytest.param(command, id=run.id if run else f"uncovered-{i}", marks=marks))
    return params


def _unquoted(output: str) -> str:
    """Each line's shell words joined by spaces (dry runs print commands shell-quoted)."""

    def words(line: str) -> str:
        try:
            return " ".join(shlex.split(line))
        except ValueError:
            return line

    return "\n".join(words(line) for line in output.splitlines())


def check_install(command: str) -> None:
    """A documented `pip install`: the extras it names are pyproject.toml's and the
    constraints file it names exists."""
    import tomllib

    words = shlex.split(command)
    assert words[:2] == ["pip", "install"], command
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = extras["optional-dependencies"]
    editable = words[words.index("-e") + 1]
    assert editable.startswith("."), command
    named = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", editable)
    assert named, f"not an install of this project: {editable!r}"
    for extra in (named.group(1) or "").split(","):
        assert not extra or extra in extras, f"{command}: no extra {extra!r} in pyproject.toml"
    if "-c" in words:
        assert (ROOT / words[words.index("-c") + 1]).is_file(), command


@pytest.mark.parametrize("command", _params())
def test_readme_command(command, launcher):
    run = COMMANDS.get(command)
    assert run is not None, f"README command not in COMMANDS: {command!r}"
    if run.install:
        check_install(command)
        return
    if run.job is None:  # the test command itself: .ci/run runs it verbatim
        ci = (ROOT / ".ci" / "run").read_text().splitlines()
        assert command in ci, f".ci/run must run the README's test command {command!r}"
        return
    final, proc = launcher.result(command)
    if command.startswith("export "):
        return  # applied to the environment of the commands after it
    if proc is None:
        pytest.skip(f"needs {run.needs}")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{final}\nexit {proc.returncode}\n{output[-6000:]}"
    assert run.expect in output or run.expect in _unquoted(output), (
        f"{final}\n{run.expect!r} not in output:\n{output[-3000:]}"
    )
    if final.startswith("python -m da3po_jax.main "):
        (workdir,) = re.findall(r"--workdir=(\S+)", final)
        summary = json.loads((Path(workdir) / "summary.json").read_text())
        assert summary["steps"] >= 1, summary


@pytest.mark.slow
def test_readme_python_blocks(launcher):
    """The models example runs on the fixture model; the loss fragment compiles."""
    fixtures = launcher.build_fixtures()
    paths = {
        old: str(fixtures / new if new != "export" else launcher.tmp / "export")
        for old, new in PYTHON_PATHS.items()
    }
    for block in _blocks("python"):
        kind = PYTHON_BLOCKS[block.splitlines()[0]]
        if kind == "compile":
            compile(block, "docs/api.md", "exec")
            continue
        for old, new in paths.items():
            block = block.replace(old, new)
        namespace: dict = {}
        exec(compile(block, "docs/api.md", "exec"), namespace)
        assert namespace["logits"].shape[:2] == namespace["tokens"].shape
        assert (launcher.tmp / "export" / "config.json").is_file()
