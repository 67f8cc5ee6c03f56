#!/usr/bin/env bash
# Installs da3po_jax with TPU support on one TPU VM worker. Run from the repository root
# on every worker, e.g. via `gcloud compute tpus tpu-vm ssh NAME --worker=all --command=...`.
#   tpu_scripts/setup.sh [--dry-run]
set -euo pipefail
cd "$(dirname "$0")/.."

run() {
  if [[ "${DRY_RUN:-0}" == 1 ]]; then printf '%q ' "$@"; echo; else "$@"; fi
}
[[ "${1:-}" == "--dry-run" ]] && DRY_RUN=1

VENV="${DA3PO_VENV:-$HOME/da3po-venv}"
run python3 -m venv "$VENV"
run "$VENV/bin/python" -m pip install --upgrade pip
run "$VENV/bin/python" -m pip install -e ".[tpu]"
run "$VENV/bin/python" -c "import jax; print(jax.device_count(), jax.devices()[0].device_kind)"
