#!/usr/bin/env bash
# Create a Cloud TPU VM slice, copy this repository to every worker, install it, and run
# `python -m da3po_jax.main ...` on all workers at once. Every command goes through
# `gcloud compute tpus ...`; with --dry-run the commands are printed (one per line,
# shell-quoted) instead of run.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch/tpu_vm.sh COMMAND [OPTIONS] [-- MAIN_ARGS...]

Commands:
  create   create the TPU VM (or, with --queued, a queued resource whose node is NAME)
  status   describe the TPU VM (or the queued resource with --queued)
  copy     copy the repository to every worker: a `git archive` tarball of --ref
           (default HEAD: committed files only), or with --git-url a `git clone` on
           every worker followed by a checkout of --git-ref (default: remote HEAD)
  setup    run tpu_scripts/setup.sh on every worker (venv at $DA3PO_VENV, default
           ~/da3po-venv, or --venv)
  run      start `python -m da3po_jax.main MAIN_ARGS...` on every worker in the
           background (nohup); worker W logs to DIR/LOGDIR/worker-$(hostname).log
  logs     tail the worker logs (--lines N, --follow, --worker W)
  stop     kill the da3po_jax.main processes on every worker
  delete   delete the TPU VM (or the queued resource and its node with --queued)

Options (environment defaults in brackets):
  --name NAME        TPU VM name [TPU_NAME] (required)
  --zone ZONE        zone, e.g. us-east5-a [TPU_ZONE] (required)
  --project PROJECT  GCP project [TPU_PROJECT] (default: gcloud's configured project)
  --type TYPE        accelerator type, e.g. v5p-8, v5litepod-16, v6e-8 [TPU_TYPE]
                     (required by create); v5e-N, the planner's name, is gcloud's
                     v5litepod-N
  --version VERSION  TPU runtime [TPU_VERSION]; default by --type: v5p-* v2-alpha-tpuv5,
                     v5litepod-*/v5e-* v2-alpha-tpuv5-lite, v6e-* v2-alpha-tpuv6e,
                     anything else tpu-ubuntu2204-base
  --queued           use a queued resource (create/status/delete)
  --spot             spot capacity (create)
  --dir DIR          repository directory on the workers [DA3PO_REMOTE_DIR]
                     (default ~/da3po_jax)
  --venv PATH        venv on the workers (setup/run; default the remote $DA3PO_VENV,
                     else ~/da3po-venv)
  --logdir DIR       log directory, relative to --dir (default logs)
  --env KEY=VALUE    environment variable for `run` (repeatable)
  --ref REF          git revision archived by `copy` (default HEAD)
  --git-url URL      `copy` clones URL on every worker instead of uploading a tarball
  --git-ref REF      revision checked out after the clone (default: the remote's HEAD)
  --worker W         worker(s) for `logs` (default all)
  --lines N          lines shown by `logs` (default 50)
  --follow, -f       `logs` keeps following (tail -F)
  --yes, -y          `delete` without gcloud's confirmation prompt
  --dry-run          print the commands instead of running them
  -h, --help         this text

Every worker runs the same command; JAX detects the TPU slice's hosts by itself, so
no coordinator flags are needed. Example:
  launch/tpu_vm.sh create --name my-tpu --zone us-east5-a --type v5p-8
  launch/tpu_vm.sh copy   --name my-tpu --zone us-east5-a
  launch/tpu_vm.sh setup  --name my-tpu --zone us-east5-a
  launch/tpu_vm.sh run    --name my-tpu --zone us-east5-a -- --config=configs/qwen_math.py
EOF
}

PROG="launch/tpu_vm.sh"
COMMANDS=" create status copy setup run logs stop delete "

die_usage() {  # exit code 2: a usage error
  echo "$PROG: error: $*" >&2
  echo "Usage: $PROG COMMAND [OPTIONS] [-- MAIN_ARGS...]; '$PROG --help' for details." >&2
  exit 2
}

run() {  # run a command, or print it shell-quoted with --dry-run
  if [[ "$DRY_RUN" == 1 ]]; then printf '%q ' "$@"; echo; else "$@"; fi
}

# --- quoting for the remote shell (the --command string gcloud hands to ssh) ----------

q() {  # POSIX single-quoting; plain words stay as they are
  if [[ "$1" =~ ^[A-Za-z0-9_./=:,+@%-]+$ ]]; then
    printf '%s' "$1"
  else
    local r="'\\''"
    printf "'%s'" "${1//\'/$r}"
  fi
}

# shellcheck disable=SC2088  # the ~ is meant literally: the remote shell expands it
qpath() {  # like q, but a leading ~ or ~/ still expands to the remote $HOME
  case "$1" in
    "~") printf '~' ;;
    "~/"*) printf '~/%s' "$(q "${1#"~/"}")" ;;
    *) q "$1" ;;
  esac
}

qwords() {  # q of every argument, space separated
  local out="" a
  for a in "$@"; do out+="${out:+ }$(q "$a")"; done
  printf '%s' "$out"
}

# --- options ---------------------------------------------------------------------------

DRY_RUN=0
CMD=""
NAME="${TPU_NAME:-}"
ZONE="${TPU_ZONE:-}"
PROJECT="${TPU_PROJECT:-}"
TYPE="${TPU_TYPE:-}"
VERSION="${TPU_VERSION:-}"
DIR="${DA3PO_REMOTE_DIR:-~/da3po_jax}"
VENV=""
LOGDIR="logs"
QUEUED=0
SPOT=0
REF="HEAD"
GIT_URL=""
GIT_REF="HEAD"
WORKER="all"
LINES=50
FOLLOW=0
YES=0
ENVS=()
MAIN_ARGS=()

parse_args() {
  local opt val
  while (($#)); do
    opt="$1"
    case "$opt" in
      --) shift; MAIN_ARGS=("$@"); return ;;
      -h|--help) usage; exit 0 ;;
      --dry-run) DRY_RUN=1 ;;
      --queued) QUEUED=1 ;;
      --spot) SPOT=1 ;;
      --follow|-f) FOLLOW=1 ;;
      --yes|-y) YES=1 ;;
      --name|--zone|--project|--type|--version|--dir|--venv|--logdir|--env|--ref|\
      --git-url|--git-ref|--worker|--lines)
        (($# >= 2)) || die_usage "$opt needs a value"
        set_opt "$opt" "$2"; shift ;;
      --*=*)
        val="${opt#*=}"; opt="${opt%%=*}"
        case "$opt" in
          --name|--zone|--project|--type|--version|--dir|--venv|--logdir|--env|--ref|\
          --git-url|--git-ref|--worker|--lines) set_opt "$opt" "$val" ;;
          *) die_usage "unknown option: $opt" ;;
        esac ;;
      -*) die_usage "unknown option: $opt" ;;
      *)
        [[ -z "$CMD" ]] || die_usage "unexpected argument: $opt (main's arguments go after --)"
        [[ "$COMMANDS" == *" $opt "* ]] || die_usage "unknown command: $opt"
        CMD="$opt" ;;
    esac
    shift
  done
}

set_opt() {
  case "$1" in
    --name) NAME="$2" ;;
    --zone) ZONE="$2" ;;
    --project) PROJECT="$2" ;;
    --type) TYPE="$2" ;;
    --version) VERSION="$2" ;;
    --dir) DIR="$2" ;;
    --venv) VENV="$2" ;;
    --logdir) LOGDIR="$2" ;;
    --env)
      [[ "$2" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die_usage "--env needs KEY=VALUE, got: $2"
      ENVS+=("$2") ;;
    --ref) REF="$2" ;;
    --git-url) GIT_URL="$2" ;;
    --git-ref) GIT_REF="$2" ;;
    --worker) WORKER="$2" ;;
    --lines)
      [[ "$2" =~ ^[0-9]+$ ]] || die_usage "--lines needs a number, got: $2"
      LINES="$2" ;;
  esac
}

require() {  # require OPTION VALUE ENVVAR
  [[ -n "$2" ]] || die_usage "$1 is required for '$CMD' (or set $3)"
}

default_version() {
  case "$1" in
    v5p-*) echo "v2-alpha-tpuv5" ;;
    v5litepod-*|v5e-*) echo "v2-alpha-tpuv5-lite" ;;
    v6e-*) echo "v2-alpha-tpuv6e" ;;
    *) echo "tpu-ubuntu2204-base" ;;
  esac
}

# --- gcloud helpers --------------------------------------------------------------------

LOC=()  # --zone and --project, for every gcloud call
remote() {  # remote WORKER COMMAND_STRING: run a shell command string on the workers
  run gcloud compute tpus tpu-vm ssh "$NAME" "${LOC[@]}" --worker="$1" --command="$2"
}

remote_python() {
  if [[ -n "$VENV" ]]; then
    printf '%s/bin/python' "$(qpath "$VENV")"
  else
    # shellcheck disable=SC2016  # expanded by the remote shell
    printf '%s' '"${DA3PO_VENV:-$HOME/da3po-venv}/bin/python"'
  fi
}

# --- commands --------------------------------------------------------------------------

cmd_create() {
  require --type "$TYPE" TPU_TYPE
  local version="${VERSION:-$(default_version "$TYPE")}" extra=()
  [[ "$TYPE" == v5e-* ]] && TYPE="v5litepod-${TYPE#v5e-}"  # gcloud's name for v5e slices
  ((SPOT)) && extra+=(--spot)
  if ((QUEUED)); then
    run gcloud compute tpus queued-resources create "$NAME" --node-id="$NAME" "${LOC[@]}" \
      --accelerator-type="$TYPE" --runtime-version="$version" ${extra[@]+"${extra[@]}"}
  else
    run gcloud compute tpus tpu-vm create "$NAME" "${LOC[@]}" \
      --accelerator-type="$TYPE" --version="$version" ${extra[@]+"${extra[@]}"}
  fi
}

cmd_status() {
  if ((QUEUED)); then
    run gcloud compute tpus queued-resources describe "$NAME" "${LOC[@]}"
  else
    run gcloud compute tpus tpu-vm describe "$NAME" "${LOC[@]}"
  fi
}

cmd_delete() {
  local extra=()
  ((YES)) && extra+=(--quiet)
  if ((QUEUED)); then
    run gcloud compute tpus queued-resources delete "$NAME" "${LOC[@]}" --force ${extra[@]+"${extra[@]}"}
  else
    run gcloud compute tpus tpu-vm delete "$NAME" "${LOC[@]}" ${extra[@]+"${extra[@]}"}
  fi
}

cmd_copy() {
  local dir
  dir="$(qpath "$DIR")"
  if [[ -n "$GIT_URL" ]]; then
    # Clone once, then fetch and check out: rerunning `copy` updates the workers.
    local ref
    ref="$(q "$GIT_REF")"
    remote all "{ test -d $dir/.git || git clone $(q "$GIT_URL") $dir; } && cd $dir && git fetch --tags --force origin && git checkout --force --detach \"\$(git rev-parse --verify -q $(q "origin/$GIT_REF^{commit}") || echo $ref)\""
    return
  fi
  local root tarball remote_tarball="da3po_jax-src.tar.gz"
  root="$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
  tarball="${TMPDIR:-/tmp}/da3po_jax-$NAME.tar.gz"
  # diff-index (plumbing) never takes the index lock, unlike `git diff`/`git status`.
  if [[ "$REF" == HEAD ]] && ! git -C "$root" diff-index --quiet HEAD -- 2>/dev/null; then
    echo "$PROG: warning: the working tree differs from HEAD; only committed files are copied" >&2
  fi
  run git -C "$root" archive --format=tar.gz --output="$tarball" "$REF"
  run gcloud compute tpus tpu-vm scp --recurse "$tarball" "$NAME:$remote_tarball" "${LOC[@]}" --worker=all
  remote all "mkdir -p $dir && tar -xzf ~/$remote_tarball -C $dir && rm -f ~/$remote_tarball"
  run rm -f "$tarball"
}

cmd_setup() {
  local env=""
  [[ -n "$VENV" ]] && env="DA3PO_VENV=$(qpath "$VENV") "
  remote all "cd $(qpath "$DIR") && ${env}bash tpu_scripts/setup.sh"
}

cmd_run() {
  ((${#MAIN_ARGS[@]})) || die_usage "run needs main's arguments after --, e.g. -- --config=configs/qwen_math.py"
  local logdir env="" kv
  logdir="$(q "$LOGDIR")"
  for kv in ${ENVS[@]+"${ENVS[@]}"}; do env+="${kv%%=*}=$(q "${kv#*=}") "; done
  # stdin/stdout/stderr all redirected, so ssh returns while the job keeps running.
  remote all "cd $(qpath "$DIR") && mkdir -p $logdir && { ${env}nohup $(remote_python) -m da3po_jax.main $(qwords "${MAIN_ARGS[@]}") > $logdir/worker-\"\$(hostname)\".log 2>&1 < /dev/null & echo \"started da3po_jax.main on \$(hostname), pid \$!\"; }"
}

cmd_logs() {
  local follow=""
  ((FOLLOW)) && follow=" -F"
  remote "$WORKER" "cd $(qpath "$DIR") && tail -n $LINES$follow $(q "$LOGDIR")/worker-*.log"
}

cmd_stop() {
  # The [d] keeps pkill from matching the remote shell whose command line holds the pattern.
  remote all "pkill -f '[d]a3po_jax[.]main' && echo \"stopped da3po_jax.main on \$(hostname)\" || echo \"no da3po_jax.main running on \$(hostname)\""
}

main() {
  parse_args "$@"
  [[ -n "$CMD" ]] || die_usage "no command given (one of:${COMMANDS% })"
  if ((${#MAIN_ARGS[@]})) && [[ "$CMD" != run ]]; then
    die_usage "arguments after -- are only for 'run'"
  fi
  require --name "$NAME" TPU_NAME
  require --zone "$ZONE" TPU_ZONE
  LOC=(--zone="$ZONE")
  [[ -n "$PROJECT" ]] && LOC+=(--project="$PROJECT")
  "cmd_$CMD"
}

main "$@"
