#!/usr/bin/env bash
# Idempotent: creates and reuses .venv, installs torch first (CPU 2.13.0 unless torch already
# imports or INFRARSI_TORCH names another spec), then the project with the extras the test suite
# and the demo need: dev (pytest, hypothesis, ruff, mypy, psutil), hf (transformers, for
# examples/hf_job.py and its tests) and agents (mcp, for `infrarsi mcp`). INFRARSI_EXTRAS names
# others, e.g. INFRARSI_EXTRAS=dev,hf,agents,bench for the Ax and Optuna peers of the search
# benchmarks. It reinstalls when pyproject.toml or the extras change, or an import fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
EXTRAS="${INFRARSI_EXTRAS:-dev,hf,agents}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
stamp=.venv/.infrarsi-installed
want="$( (cat pyproject.toml; echo "extras=$EXTRAS") | sha1sum | cut -d' ' -f1)"
imports="infrarsi, torch, deepspeed, ray, botorch, scipy"
case ",$EXTRAS," in *,dev,*) imports="$imports, pytest, hypothesis, psutil" ;; esac
case ",$EXTRAS," in *,hf,*) imports="$imports, transformers" ;; esac
case ",$EXTRAS," in *,agents,*) imports="$imports, mcp" ;; esac
case ",$EXTRAS," in *,bench,*) imports="$imports, ax, optuna" ;; esac
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VPY" -c "import $imports" 2>/dev/null; then
  exit 0
fi
"$VPY" -m pip install -q --upgrade pip >/dev/null
if [ -n "${INFRARSI_TORCH:-}" ]; then
  "$VPY" -m pip install -q "${INFRARSI_TORCH}"
elif ! "$VPY" -c "import torch" 2>/dev/null; then
  "$VPY" -m pip install -q "torch==2.13.0"
fi
"$VPY" -m pip install -q -e ".[$EXTRAS]"
echo "$want" > "$stamp"
