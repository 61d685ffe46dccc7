#!/usr/bin/env bash
# Sourced by demo.sh and test.sh: make .venv (once) and install the project with an extra.
# Usage: source scripts/setup-venv.sh demo|test
set -euo pipefail
extra="${1:-demo}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${EDGEFL_VENV:-$root/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
# shellcheck disable=SC1091
source "$venv/bin/activate"
stamp="$venv/.installed-$extra-$(sha1sum "$root/pyproject.toml" | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  python -m pip install -q --upgrade pip
  # torch first, pinned, from the default index (PyPI, or whatever pip is configured with).
  # On Linux PyPI's torch wheel is the multi-GB CUDA build (x86_64; aarch64 too from 2.11 on); the agent needs only the
  # CPU one. Set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu to install that build
  # instead (it is not the default: CI and some machines reach only PyPI).
  if ! python -c "import torch" 2>/dev/null; then
    if [ -n "${TORCH_INDEX_URL:-}" ]; then
      python -m pip install -q "torch==2.13.0" --index-url "$TORCH_INDEX_URL"
    else
      python -m pip install -q "torch==2.13.0"
    fi
  fi
  python -m pip install -q -e "$root[$extra]"
  touch "$stamp"
fi
