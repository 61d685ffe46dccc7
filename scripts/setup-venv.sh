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
  # torch first, pinned: the CPU build (the agent needs no more); a bare `torch`
  # requirement would pull a multi-GB CUDA build on some machines.
  python -c "import torch" 2>/dev/null || python -m pip install -q "torch==2.13.0"
  python -m pip install -q -e "$root[$extra]"
  touch "$stamp"
fi
