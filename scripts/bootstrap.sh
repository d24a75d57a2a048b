#!/usr/bin/env bash
# Idempotent: creates and reuses .venv, installs torch first (CPU 2.13.0 unless torch already
# imports or INFRARSI_TORCH names another spec), then the project with the extras the test suite
# and the demo need: dev (pytest, hypothesis, ruff, mypy, psutil), hf (transformers and accelerate, for
# examples/hf_job.py and its tests) and agents (mcp, for `infrarsi mcp`). INFRARSI_EXTRAS names
# others, e.g. INFRARSI_EXTRAS=dev,hf,agents,bench for the Ax and Optuna peers of the search
# benchmarks. Every install is held to constraints.txt (the versions the suite last passed with),
# so a dependency's release cannot break a fresh clone overnight; a torch other than the default
# (INFRARSI_TORCH, or one already installed) keeps its own dependencies' pins. It reinstalls when
# pyproject.toml, constraints.txt or the extras change, or an import fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
EXTRAS="${INFRARSI_EXTRAS:-dev,hf,agents}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
stamp=.venv/.infrarsi-installed
want="$( (cat pyproject.toml constraints.txt; echo "extras=$EXTRAS") | sha1sum | cut -d' ' -f1)"
imports="infrarsi, torch, deepspeed, ray, botorch, scipy"
case ",$EXTRAS," in *,dev,*) imports="$imports, pytest, hypothesis, psutil" ;; esac
case ",$EXTRAS," in *,hf,*) imports="$imports, transformers, accelerate" ;; esac
case ",$EXTRAS," in *,agents,*) imports="$imports, mcp" ;; esac
case ",$EXTRAS," in *,bench,*) imports="$imports, ax, optuna" ;; esac
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VPY" -c "import $imports" 2>/dev/null; then
  exit 0
fi
"$VPY" -m pip install -q --upgrade pip >/dev/null
TORCH_VERSION=2.13.0
if [ -n "${INFRARSI_TORCH:-}" ]; then
  "$VPY" -m pip install -q "${INFRARSI_TORCH}"
elif ! "$VPY" -c "import torch" 2>/dev/null; then
  "$VPY" -m pip install -q -c constraints.txt "torch==$TORCH_VERSION"
fi
pins=constraints.txt
if ! "$VPY" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  # Another torch pins its own dependencies (sympy, networkx, CUDA wheels...): leave those to it.
  pins=.venv/.infrarsi-constraints.txt
  "$VPY" - constraints.txt > "$pins" <<'PY'
import re
import sys
from importlib.metadata import requires

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

own = {norm(re.match(r"[A-Za-z0-9._-]+", r).group()) for r in requires("torch") or [] if "extra ==" not in r}
with open(sys.argv[1]) as f:
    sys.stdout.writelines(line for line in f if norm(line.split("==")[0].strip()) not in own)
PY
fi
"$VPY" -m pip install -q -c "$pins" -e ".[$EXTRAS]"
echo "$want" > "$stamp"
