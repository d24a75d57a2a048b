#!/usr/bin/env bash
# Bootstrap the venv, then the main job: one real 2-rank trial of the dense debug workload
# (DeepSpeed ZeRO-2, micro-batch 4) through Ray, printed as a table and logged to a study dir.
# Extra arguments go to the command, e.g. ./scripts/demo.sh --address ray://head:10001
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
study="${INFRARSI_DEMO_STUDY:-studies/demo}"
exec .venv/bin/infrarsi trial workloads/dense_debug.yaml --set zero_stage=2 --set micro_batch_size=4 \
  --log "$study" "$@"
