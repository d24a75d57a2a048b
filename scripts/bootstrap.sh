#!/usr/bin/env bash
# Idempotent: creates and reuses .venv, installs torch first (CPU 2.13.0 unless torch already
# imports or INFRARSI_TORCH names another spec), then the project with its dev, hf and agents
# extras (hf: transformers, for examples/hf_job.py and its tests; agents: mcp, for `infrarsi mcp`).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
stamp=.venv/.infrarsi-installed
want="$(sha1sum pyproject.toml | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VPY" -c "import infrarsi, torch, deepspeed, ray, botorch, transformers, mcp" 2>/dev/null; then
  exit 0
fi
"$VPY" -m pip install -q --upgrade pip >/dev/null
if [ -n "${INFRARSI_TORCH:-}" ]; then
  "$VPY" -m pip install -q "${INFRARSI_TORCH}"
elif ! "$VPY" -c "import torch" 2>/dev/null; then
  "$VPY" -m pip install -q "torch==2.13.0"
fi
"$VPY" -m pip install -q -e ".[dev,hf,agents]"
echo "$want" > "$stamp"
