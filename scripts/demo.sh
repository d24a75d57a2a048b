#!/usr/bin/env bash
# Bootstrap the venv, then the main job: `infrarsi tune` on the dense debug workload (2 CPU ranks,
# local Ray): init, doctor, run (14 trials), verify, report. The memory capacity (160 MiB per
# rank, allocator-level measure) makes the fastest naive configs (ZeRO-0, micro-batch 8, no
# checkpointing: about 197 MB) run out of memory, so the search must learn the memory cliff.
# Extra arguments go to `infrarsi tune`, e.g. ./scripts/demo.sh --address 127.0.0.1:6379; a first
# -v (--verbose) shows every log event on the terminal (the study keeps them all in
# STUDY/logs/infrarsi.jsonl either way).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh >/dev/null
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
export INFRARSI_BANK="${INFRARSI_BANK:-off}"
study="${INFRARSI_DEMO_STUDY:-studies/demo-$(date +%Y%m%d-%H%M%S)}"
verbose=()
case "${1:-}" in -v | --verbose) verbose=(--verbose); shift ;; esac
exec .venv/bin/infrarsi ${verbose[@]+"${verbose[@]}"} tune workloads/dense_debug.yaml --study "$study" --trials 14 \
  --memory-capacity 160MiB --request "make dense_debug faster without changing what it learns" "$@"
