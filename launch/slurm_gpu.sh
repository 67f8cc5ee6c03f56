#!/usr/bin/env bash
# Multi-node GPU training under SLURM: one task per node, each running
#   python -m da3po_jax.main --coordinator_address=HOST0:PORT --num_processes=N \
#     --process_id=$SLURM_PROCID MAIN_ARGS...
# and writing its log to LOGDIR/node-$SLURM_PROCID.log. Submit from the repository root
# with the project's environment active (sbatch passes the environment on):
#   sbatch launch/slurm_gpu.sh --config=configs/qwen_math.py
#   sbatch --nodes=4 --gpus-per-node=4 launch/slurm_gpu.sh --config=configs/qwen_math.py
#SBATCH --job-name=da3po
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: sbatch [SBATCH_OPTIONS] launch/slurm_gpu.sh [OPTIONS] [--] MAIN_ARGS...
       launch/slurm_gpu.sh --dry-run [--hosts h1,h2 | --nodes N] [OPTIONS] [--] MAIN_ARGS...

Options (they come before MAIN_ARGS; the first other argument, or --, starts MAIN_ARGS):
  --hosts H1,H2,...  hosts instead of `scontrol show hostnames "$SLURM_JOB_NODELIST"`
  --nodes N          number of processes (default $SLURM_NNODES, else the number of hosts)
  --port PORT        coordinator port [COORDINATOR_PORT]
                     (default 10000 + SLURM_JOB_ID % 20000, or 12345 outside a job)
  --logdir DIR       per-node logs [DA3PO_LOGDIR] (default logs/slurm-$SLURM_JOB_ID)
  --dry-run          print the commands instead of running them (works outside SLURM
                     given --hosts or SLURM_JOB_NODELIST)
  -h, --help         this text
Environment: DA3PO_PYTHON (default python) is the interpreter every task runs.

The coordinator is the first host of the allocation; process i runs on the i-th node.
EOF
}

PROG="launch/slurm_gpu.sh"

die_usage() {
  echo "$PROG: error: $*" >&2
  echo "Usage: sbatch launch/slurm_gpu.sh [OPTIONS] [--] MAIN_ARGS...; '$PROG --help' for details." >&2
  exit 2
}

run() {  # run a command, or print it shell-quoted with --dry-run
  if [[ "$DRY_RUN" == 1 ]]; then printf '%q ' "$@"; echo; else "$@"; fi
}

DRY_RUN=0
HOSTS=""
NODES=""
PORT="${COORDINATOR_PORT:-}"
LOGDIR="${DA3PO_LOGDIR:-}"
PYTHON="${DA3PO_PYTHON:-python}"
HOST_LIST=()
MAIN_ARGS=()

parse_args() {
  while (($#)); do
    case "$1" in
      --) shift; break ;;
      -h|--help) usage; exit 0 ;;
      --dry-run) DRY_RUN=1 ;;
      --hosts|--nodes|--port|--logdir)
        (($# >= 2)) || die_usage "$1 needs a value"
        set_opt "$1" "$2"; shift ;;
      --hosts=*|--nodes=*|--port=*|--logdir=*) set_opt "${1%%=*}" "${1#*=}" ;;
      *) break ;;
    esac
    shift
  done
  MAIN_ARGS=("$@")
}

set_opt() {
  case "$1" in
    --hosts) HOSTS="$2" ;;
    --nodes) NODES="$2" ;;
    --port) PORT="$2" ;;
    --logdir) LOGDIR="$2" ;;
  esac
}

resolve_hosts() {  # fills HOST_LIST
  local nodelist="${SLURM_JOB_NODELIST:-}"
  if [[ -n "$HOSTS" ]]; then
    IFS=, read -r -a HOST_LIST <<<"$HOSTS"
  elif [[ -z "$nodelist" ]]; then
    die_usage "not inside a SLURM job (SLURM_JOB_NODELIST is unset): submit with sbatch, or pass --hosts h1,h2 with --dry-run"
  elif command -v scontrol >/dev/null 2>&1; then
    read -r -a HOST_LIST <<<"$(scontrol show hostnames "$nodelist" | tr '\n' ' ')"
  elif [[ "$nodelist" != *"["* ]]; then
    IFS=, read -r -a HOST_LIST <<<"$nodelist"
  else
    die_usage "scontrol is needed to expand SLURM_JOB_NODELIST=$nodelist; pass --hosts h1,h2"
  fi
  ((${#HOST_LIST[@]})) || die_usage "no hosts found"
}

main() {
  parse_args "$@"
  ((${#MAIN_ARGS[@]})) || die_usage "no arguments for da3po_jax.main, e.g. --config=configs/qwen_math.py"
  resolve_hosts
  NODES="${NODES:-${SLURM_NNODES:-${#HOST_LIST[@]}}}"
  [[ "$NODES" =~ ^[1-9][0-9]*$ ]] || die_usage "--nodes must be a positive integer, got: $NODES"
  if [[ -z "$PORT" ]]; then
    # Derived from the job id so that two jobs sharing a first node do not collide.
    if [[ -n "${SLURM_JOB_ID:-}" ]]; then PORT=$((10000 + SLURM_JOB_ID % 20000)); else PORT=12345; fi
  fi
  [[ "$PORT" =~ ^[0-9]+$ ]] || die_usage "--port must be a number, got: $PORT"
  LOGDIR="${LOGDIR:-logs/slurm-${SLURM_JOB_ID:-local}}"

  export COORDINATOR_ADDRESS="${HOST_LIST[0]}:$PORT"
  export NUM_PROCESSES="$NODES"
  echo "$PROG: $NUM_PROCESSES processes, coordinator $COORDINATOR_ADDRESS, logs $LOGDIR/node-*.log" >&2

  # Each srun task runs this with its own $SLURM_PROCID; it is single-quoted here so that
  # it is expanded by the task, not by this script. Positional parameters carry the
  # resolved values and the main arguments through unchanged:
  #   $1 python, $2 coordinator address, $3 number of processes, $4 log dir, $5... args.
  # shellcheck disable=SC2016
  local task='exec "$1" -m da3po_jax.main --coordinator_address="$2" --num_processes="$3" --process_id="$SLURM_PROCID" "${@:5}" > "$4/node-$SLURM_PROCID.log" 2>&1'

  run mkdir -p "$LOGDIR"
  run srun --nodes="$NUM_PROCESSES" --ntasks="$NUM_PROCESSES" --ntasks-per-node=1 \
    --kill-on-bad-exit=1 \
    bash -c "$task" da3po-task "$PYTHON" "$COORDINATOR_ADDRESS" "$NUM_PROCESSES" "$LOGDIR" \
    "${MAIN_ARGS[@]}"
}

main "$@"
