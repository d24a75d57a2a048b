#!/usr/bin/env bash
# One prepared GPU check of infrarsi on the dense_1gpu workload (dense 1b, one GPU), for a single
# call on a lent H100/H200 (fits BUDGET_S, default 480 s). Steps: plain-PyTorch reference; trial of
# the baseline; trial of a fast config; one OOM trial that must land censored under 40GiB; a short
# tune (doctor x2 + honest change, 8 run trials, verify 2 pairs: a look, too few to accept; the
# device's own memory as the capacity); a summary (baseline/best/reference MFU,
# per-trial setup_time_s and end_checks_time_s, loss spread vs the baseline).
# S0 checks that the search space's code patches apply (no GPU needed, always run).
# Every step has its own timeout and is skipped when too little budget is left. Without CUDA
# (or with GPU_CHECK_CUDA=0) every CUDA step says it is skipped and the script exits 0.
# GPU_CHECK_TRIALS sets S5's run-trial budget (default 8); GPU_CHECK_VERIFY=0 skips S5's verify
# stage and gives its time to the run stage.
# S6 (only when named in GPU_CHECK_STEPS) runs the S3 config with each new patch (compile_block,
# loss_chunk_tokens=1024, fused_loss_tokens=2048: the GPU spaces' values; the fused loss at
# micro-batch 16; attention_backend=cudnn) to see whether it pays on the GPU.
# S7 (only when named) is issue 27's study: workloads/dense_1gpu_fast.yaml, whose baseline is the
# plain loop's own config, short doctor, GPU_CHECK_TRIALS_FAST (12) run trials over knobs and
# patches, verify with 6 pairs, report; the verified winner against S1's plain loop.
# S8 (only when named) runs the Hugging Face Llama of Llama-3.2-1B's shape (a user's own model,
# workloads/hf_llama_1b_gpu.yaml) at the plain loop's config, with the fused loss, with it at
# micro-batch 16, and with cuDNN's SDPA kernel: four trials.
# GPU_CHECK_ALLOW=float8_linear lets S7 search float8 matmuls too (another arithmetic: the
# doctor then calibrates the tolerances with it; needs torchao from .gpu/extra312.tar.xz).
# GPU_CHECK_STEPS picks the steps (default "S1 S2 S3 S4 S5"; e.g. "S1 S3 S5" when the baseline
# and OOM trials were confirmed before and the budget is short). Next device window:
# GPU_CHECK_STEPS="S1 S7" BUDGET_S=580, then "S3 S6" if time is left.
# Lent machine: mkdir -p /tmp/site && tar -xJf .gpu/site312.tar.xz -C /tmp/site &&
#   tar -xJf .gpu/extra312.tar.xz -C /tmp/site &&
#   export PYTHONPATH=/tmp/site:$PWD RAY_AUTH_MODE=disabled && bash scripts/gpu_check.sh
set -u
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled} INFRARSI_BANK=${INFRARSI_BANK:-off}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
export PYTHONPATH=${PYTHONPATH:-$ROOT}
case ":$PYTHONPATH:" in *":$ROOT:"*) ;; *) export PYTHONPATH="$PYTHONPATH:$ROOT" ;; esac
if [ -x "$ROOT/.venv/bin/python" ]; then PY=${PY:-$ROOT/.venv/bin/python}; else PY=${PY:-python3}; fi
BUDGET_S=${BUDGET_S:-480}
export GPU_CHECK_TRIALS=${GPU_CHECK_TRIALS:-8}
T0=$SECONDS
DEAD=$((T0 + BUDGET_S))
RUN=${RUN_DIR:-$ROOT/benchmarks/results/gpu/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$RUN"
exec > >(tee -a "$RUN/gpu_check.log") 2>&1
say() { echo "[$((SECONDS - T0))s] $*" >&2; }  # stderr: steps redirect stdout to their JSON
left() { echo $((DEAD - SECONDS)); }
WL=workloads/dense_1gpu.yaml
say "gpu_check: run directory $RUN (budget ${BUDGET_S}s, python $PY)"

# step NAME MAX_S MIN_S CMD...: run CMD under timeout min(MAX_S, left - 20); skip if under MIN_S.
# Sets STEP_S to the seconds it took (0 when skipped).
STEP_S=0
step() {
  STEP_S=0
  local name=$1 max=$2 min=$3; shift 3
  local t; t=$(( $(left) - 20 )); [ "$t" -gt "$max" ] && t=$max
  if [ "$t" -lt "$min" ]; then say "$name: SKIPPED (only ${t}s of the budget usable, needs ${min}s)"; return 0; fi
  say "$name: start (timeout ${t}s)"
  local t1=$SECONDS
  timeout --kill-after=10 "$t" "$@"; local rc=$?
  STEP_S=$((SECONDS - t1))
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && say "$name: TIMED OUT after ${t}s" || say "$name: rc=$rc"
  # GPU memory still held after the step (a leftover Ray worker would show here)
  command -v nvidia-smi >/dev/null && say "  GPU memory used after: $(timeout 10 nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
  return 0
}

command -v nvidia-smi >/dev/null && timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
CUDA=$(timeout 60 "$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
CUDA=${GPU_CHECK_CUDA:-$CUDA}  # 0 or 1 overrides the detection (tests)
timeout 60 "$PY" -c "import importlib, torch
vs = {m: getattr(importlib.import_module(m), '__version__', '?') if importlib.util.find_spec(m) else 'MISSING' for m in ('ray', 'deepspeed', 'pydantic', 'infrarsi')}
print('torch', torch.__version__, vs)"
say "CUDA available: $CUDA"

skip() { say "$1: SKIPPED (no CUDA)"; }
# S0 (no GPU needed, runs with GPU_CHECK_CUDA=0 too): the code patches of the workload's search
# space apply to this checkout's HEAD, alone and in their sets (init's own check), so a patch that
# no longer applies shows here in seconds instead of as a refused S5.
step "S0 code patches of $WL's search space apply" 60 10 "$PY" - "$WL" <<'PY'
import sys
from infrarsi.patches import check_space_patches, patch_names
from infrarsi.workload import Workload
wl = Workload.from_yaml(sys.argv[1])
space = wl.search_space_path()
files = check_space_patches(space, ".", ["workloads/**"])
print(f"S0: {space}: {len(patch_names(space))} code_patch values, {len(files)} patch files apply:", *files, sep="\n  ")
PY
STEPS=" ${GPU_CHECK_STEPS-S1 S2 S3 S4 S5} "
want() { case "$STEPS" in *" $1 "*) return 0 ;; *) say "$1: SKIPPED (not in GPU_CHECK_STEPS)"; return 1 ;; esac; }
trial() {  # trial NAME JSON-FILE MAX_S ARGS...: infrarsi trial of $TRIAL_WL (default dense_1gpu), its row logged to $RUN/trials/
  local name=$1 out=$2 max=$3; shift 3
  local t; t=$(( $(left) - 20 )); [ "$t" -gt "$max" ] && t=$max
  # the trial's own deadline comes 15 s before the step's timeout, so a stall still logs a row
  step "$name" "$max" 60 "$PY" -m infrarsi trial "${TRIAL_WL:-$WL}" "$@" --timeout "$((t - 15))s" --log "${TRIAL_LOG:-$RUN}" --json > "$RUN/$out"
}

if [ "$CUDA" = 1 ]; then
  want S1 && step "S1 plain-PyTorch reference (mbs 8)" 60 30 "$PY" benchmarks/gpu_reference.py --mbs 8 > "$RUN/ref.json"
  cat "$RUN/ref.json" 2>/dev/null
else
  "$PY" benchmarks/gpu_reference.py --mbs 8 > "$RUN/ref.json" 2>/dev/null; skip "S1 plain-PyTorch reference"
fi
if [ "$CUDA" = 1 ]; then
  BASE_S=0
  want S2 && trial "S2 baseline trial (ZeRO-3, mbs 1, full checkpointing)" baseline.json 120 && BASE_S=$STEP_S
  [ "$BASE_S" -lt 30 ] && BASE_S=60
  want S3 && trial "S3 fast trial (ZeRO-0, mbs 8, no checkpointing, fused AdamW: the reference's config)" fast.json 100 \
    --set zero_stage=0 --set micro_batch_size=8 --set activation_checkpointing=none --set optimizer_impl=adamw_fused
  # S6: the patch library at the reference's config, each against S3 (same config, no patch): does
  # it pay on this GPU? compile_block's first steps include torch.compile's compile time (the
  # warmup steps absorb it; setup_time_s does not).
  FAST=(--set zero_stage=0 --set micro_batch_size=8 --set activation_checkpointing=none --set optimizer_impl=adamw_fused)
  want S6 && trial "S6a compile_block at the S3 config" patch_compile.json 150 "${FAST[@]}" --set code_patch=compile_block
  want S6 && trial "S6b loss_chunk_tokens=1024 at the S3 config" patch_loss_chunk.json 90 "${FAST[@]}" --set loss_chunk_tokens=1024
  want S6 && trial "S6c fused_loss_tokens=2048 at the S3 config" patch_fused_loss.json 90 "${FAST[@]}" --set fused_loss_tokens=2048
  want S6 && trial "S6d fused_loss_tokens=2048 at micro-batch 16 (the memory it frees, spent)" patch_fused_mbs16.json 100 \
    --set zero_stage=0 --set micro_batch_size=16 --set activation_checkpointing=none --set optimizer_impl=adamw_fused --set fused_loss_tokens=2048
  want S6 && trial "S6e attention_backend=cudnn at the S3 config (cuDNN's SDPA kernel, not PyTorch's pick)" patch_attn_cudnn.json 90 \
    "${FAST[@]}" --set attention_backend=cudnn
  want S4 && trial "S4 OOM trial (mbs 16, no checkpointing, --memory-capacity 40GiB; expect oom, censored)" oom.json 75 \
    --set zero_stage=0 --set micro_batch_size=16 --set activation_checkpointing=none --memory-capacity 40GiB
  # S5 runs the stages one by one: the run stage gets what is left after the doctor, minus what
  # verify will need (2 pairs: about 4 baseline trials, from the doctor's own baseline wall time).
  want S5 && step "S5 tune (doctor x2 + honest change, up to $GPU_CHECK_TRIALS run trials, verify 1 round)" $(( $(left) - 30 )) 150 \
    "$PY" -m benchmarks.gpu_study "$WL" "$RUN/study" --deadline-s $(( $(left) - 50 )) --trials "$GPU_CHECK_TRIALS" \
    --pairs 2 $([ "${GPU_CHECK_VERIFY:-1}" = 0 ] && echo --no-verify) --ref "$RUN/ref.json"
  # S7: the study issue 27 asks for: the baseline is the plain loop's own config (ZeRO-1,
  # micro-batch 8, no checkpointing, fused AdamW), 12 run trials over knobs and the patch library,
  # verify of the top candidate with 6 pairs (the fewest whose interval can accept), the report;
  # the verified winner against the plain loop S1 measured in this call (benchmarks/gpu_study.py
  # writes study_fast/gpu_study.json).
  want S7 && step "S7 study from the plain loop's config (short doctor, ${GPU_CHECK_TRIALS_FAST:-12} run trials, verify 6 pairs)" \
    $(( $(left) - 25 )) 240 \
    "$PY" -m benchmarks.gpu_study workloads/dense_1gpu_fast.yaml "$RUN/study_fast" --deadline-s $(( $(left) - 45 )) \
    --trials "${GPU_CHECK_TRIALS_FAST:-12}" --doctor-repeats 2 --top-k 1 --pairs 6 --ref "$RUN/ref.json" \
    ${GPU_CHECK_ALLOW:+--allow "$GPU_CHECK_ALLOW"}
  # S8: a user's own model (issue 27, item 5): the Hugging Face Llama of Llama-3.2-1B's shape
  # (workloads/hf_llama_1b_gpu.yaml, examples/hf_job.py) at the plain loop's config, then with
  # the levers that reach a transformers model without a code patch: the fused projection + loss
  # (hf_job's fuse_loss), the micro-batch the memory it frees buys, cuDNN's SDPA kernel.
  HF=(--set zero_stage=1 --set activation_checkpointing=none --set optimizer_impl=adamw_fused)
  HFWL=workloads/hf_llama_1b_gpu.yaml
  want S8 && TRIAL_WL=$HFWL TRIAL_LOG=$RUN/hf trial "S8a HF Llama 1B at the plain loop's config (ZeRO-1, mbs 8)" hf_fast.json 150 \
    "${HF[@]}" --set micro_batch_size=8
  want S8 && TRIAL_WL=$HFWL TRIAL_LOG=$RUN/hf trial "S8b HF Llama 1B, fused_loss_tokens=2048" hf_fused.json 150 \
    "${HF[@]}" --set micro_batch_size=8 --set fused_loss_tokens=2048
  want S8 && TRIAL_WL=$HFWL TRIAL_LOG=$RUN/hf trial "S8c HF Llama 1B, fused_loss_tokens=2048 at micro-batch 16" hf_fused_mbs16.json 150 \
    "${HF[@]}" --set micro_batch_size=16 --set fused_loss_tokens=2048
  want S8 && TRIAL_WL=$HFWL TRIAL_LOG=$RUN/hf trial "S8d HF Llama 1B, attention_backend=cudnn" hf_cudnn.json 150 \
    "${HF[@]}" --set micro_batch_size=8 --set attention_backend=cudnn
else
  for s in "S2 baseline trial" "S3 fast trial" "S6 patch trials" "S4 OOM trial" "S5 tune" "S7 study from the plain loop's config" "S8 HF Llama 1B trials"; do skip "$s"; done
fi

say "summary"
timeout 60 "$PY" - "$RUN" <<'PY'
import json, os, sys
run = sys.argv[1]
rows = []
try:
    from infrarsi.study.trial_log import read_trials
    for d in (run, run + "/study", run + "/study_fast"):
        if os.path.isdir(d + "/trials"):
            try:  # a run directory or a study directory: rows under DIR/trials/
                rows += read_trials(d).to_pylist()
            except Exception as e:  # noqa: BLE001
                print("could not read", d, e)
except Exception as e:  # noqa: BLE001
    print("infrarsi not importable:", e)
ref = {}
try:
    ref = json.load(open(run + "/ref.json"))
except Exception:  # noqa: BLE001
    pass
BASE = {"zero_stage": 3, "micro_batch_size": 1, "activation_checkpointing": "full"}
def is_base(r):
    c = r.get("config") or {}
    if isinstance(c, str):
        c = json.loads(c)
    return all(c.get(k) == v for k, v in BASE.items())
ok = [r for r in rows if r.get("status") == "ok" and r.get("mfu") is not None]
base = next((r for r in ok if is_base(r)), None)
best = max(ok, key=lambda r: r["mfu"], default=None)
fmt = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"
print("SUMMARY")
print("  reference MFU:", "skipped (" + ref["skipped"] + ")" if "skipped" in ref else fmt(ref.get("mfu")))
print("  baseline MFU: ", fmt(base and base["mfu"]))
print("  best MFU:     ", fmt(best and best["mfu"]), (best or {}).get("config", ""))
if not rows:
    print("  no trials ran")
spread = None
for r in rows:
    extra = r.get("extra") or {}
    if isinstance(extra, str):
        extra = json.loads(extra)
    d = None
    if base and r.get("loss") and base.get("loss") and r is not base:
        n = min(len(r["loss"]), len(base["loss"]))
        d = max(abs(a - b) for a, b in zip(r["loss"][:n], base["loss"][:n])) if n else None
        if d is not None and r.get("status") == "ok":
            spread = d if spread is None else max(spread, d)
    g = lambda x: "n/a" if x is None else f"{x:.3g}"
    tele = r.get("telemetry") or {}
    if isinstance(tele, str):
        tele = json.loads(tele)
    gib = lambda x: "n/a" if x is None else f"{x / 2**30:.1f}GiB"
    nvml = (tele.get("memory_used_bytes") or {}).get("max")
    # issue 27 item 4: the ZeRO-3 leftover recycle (leftover after the trial), NVML reading the
    # rank's own GPU (its memory used beside torch's device-used peak), the polling's cost (S3 vs S1)
    print(f"  {r.get('stage')} {r.get('status')} step_time_s={g(r.get('step_time_s'))} mfu={fmt(r.get('mfu'))} "
          f"setup_time_s={g(r.get('setup_time_s'))} end_checks_time_s={g(extra.get('end_checks_time_s'))} "
          f"peak={gib(r.get('peak_memory_bytes'))} device_used_peak={gib(extra.get('device_used_peak_bytes'))} "
          f"nvml_used_max={gib(nvml)} leftover={gib(extra.get('leftover_device_bytes'))} "
          f"censored={r.get('memory_censored')} loss_diff_vs_base={g(d)} config={r.get('config')}")
print("  loss spread (max |loss - baseline loss| per step, ok configs vs the baseline):", "n/a" if spread is None else f"{spread:.3g}")
REF_CFG = {"zero_stage": 0, "micro_batch_size": 8, "activation_checkpointing": "none", "optimizer_impl": "adamw_fused"}
same = [r for r in ok if all((json.loads(r["config"]) if isinstance(r.get("config"), str) else r.get("config") or {}).get(k) == v
                             for k, v in REF_CFG.items())]
if same and ref.get("step_time_s"):
    st = min(r["step_time_s"] for r in same)
    print(f"  harness overhead per step vs the plain-PyTorch reference at its config: {st:.4g} s vs "
          f"{ref['step_time_s']:.4g} s = {100 * (st / ref['step_time_s'] - 1):+.1f}%")
hf = []  # S8: the Hugging Face Llama's trials, logged apart (another model: not the baseline's MFU)
try:
    if os.path.isdir(run + "/hf/trials"):
        hf = read_trials(run + "/hf").to_pylist()
except Exception as e:  # noqa: BLE001
    print("could not read", run + "/hf", e)
for r in hf:
    print(f"  S8 HF Llama 1B {r.get('status')} step_time_s={r.get('step_time_s')} mfu={fmt(r.get('mfu'))} "
          f"peak={r.get('peak_memory_bytes')} setup_time_s={r.get('setup_time_s')} config={r.get('config')}")
setups = [r["setup_time_s"] for r in rows if r.get("setup_time_s") is not None]
if setups:
    print(f"  setup_time_s per trial: median {sorted(setups)[len(setups) // 2]:.3g}, max {max(setups):.3g} over {len(setups)} trials")
try:
    doc = json.load(open(run + "/study/doctor.json"))
    print("  doctor: loss tolerance", doc.get("loss_tolerance"), "| run-to-run", doc.get("loss_run_to_run_max_abs_diff"),
          "| honest changes", [(c["changed"], c["config"].get(c["changed"]), c["status"], c.get("loss_max_abs_diff"))
                               for c in doc.get("honest_changes", [])])
except Exception:  # noqa: BLE001
    pass
try:
    from infrarsi.study.contract import Contract
    cap = Contract.load(run + "/study").memory_capacity
    print("  study memory capacity:", cap.describe())
except Exception as e:  # noqa: BLE001
    print("  study memory capacity: n/a", type(e).__name__)
PY
say "summary rc=$?"
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then  # the lent machine sends back only $OUT
  timeout 60 tar -czf "$OUT/gpu_check.tgz" -C "$(dirname "$RUN")" "$(basename "$RUN")" && say "copied to $OUT/gpu_check.tgz"
  cp "$RUN/gpu_check.log" "$OUT/" 2>/dev/null
fi
say "done; results in $RUN"
exit 0
