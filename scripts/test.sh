#!/usr/bin/env bash
# Bootstrap the venv, then run the whole pytest suite, integration tests (real Ray, DeepSpeed,
# gloo, 2 ranks) included. Extra arguments go to pytest, e.g. ./scripts/test.sh -k log -x
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
exec .venv/bin/python -m pytest -q "$@"
