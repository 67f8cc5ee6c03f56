#!/usr/bin/env bash
# Installs da3po_jax with TPU support on one TPU VM worker. Run from the repository root
# on every worker (`launch/tpu_vm.sh setup` does, through gcloud ssh --worker=all):
#   tpu_scripts/setup.sh [--dry-run]
# TPU VM images ship their own Python (3.10 on the Ubuntu 22.04 runtimes) while the package
# needs >= 3.11, so the venv's Python is a standalone CPython that uv downloads, whatever
# the image has; the versions are CI's known-good set (.ci/constraints.txt: jax, jaxlib,
# libtpu, flax, ...).
#   DA3PO_VENV    the venv (default ~/da3po-venv)
#   DA3PO_PYTHON  its Python version (default 3.11)
set -euo pipefail
cd "$(dirname "$0")/.."

run() {
  if [[ "${DRY_RUN:-0}" == 1 ]]; then printf '%q ' "$@"; echo; else "$@"; fi
}
[[ "${1:-}" == "--dry-run" ]] && DRY_RUN=1

VENV="${DA3PO_VENV:-$HOME/da3po-venv}"
PYTHON_VERSION="${DA3PO_PYTHON:-3.11}"
UV="$(command -v uv || true)"
if [[ -z "$UV" ]]; then
  UV="$HOME/.local/bin/uv"
  if [[ ! -x "$UV" ]]; then  # uv's standalone installer, into ~/.local/bin, rc files untouched
    run sh -c "curl -LsSf https://astral.sh/uv/install.sh | env UV_INSTALL_DIR=$HOME/.local/bin UV_NO_MODIFY_PATH=1 sh"
  fi
fi
run "$UV" venv --seed --python "$PYTHON_VERSION" "$VENV"
run "$UV" pip install --python "$VENV/bin/python" -c .ci/constraints.txt -e ".[tpu]"
run "$VENV/bin/python" -c "import jax; print(jax.device_count(), jax.devices()[0].device_kind)"
