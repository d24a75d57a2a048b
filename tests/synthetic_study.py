"""A synthetic study directory for report/apply/bank tests: a real contract, a doctor.json, a
trial log written with pyarrow directly (the DESIGN.md columns), and a verify.json.

This is a fake only of the trial engine's *output*; the code under test reads it as it would
read a real study.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from infrarsi.result import TrialExtra, TrialResult
from infrarsi.study.candidate import PatchRef, file_sha256
from infrarsi.study.contract import Contract
from infrarsi.study.switches import StudySwitches

ROOT = Path(__file__).resolve().parents[1]
BASE = {
    "zero_stage": 3,
    "micro_batch_size": 1,
    "activation_checkpointing": "full",
    "dtype": "fp32",
    "offload_optimizer": False,
    "offload_param": False,
    "overlap_comm": False,
    "reduce_bucket_size": "auto",
    "optimizer_impl": "adamw",
    "threads_per_worker": 1,
}
BEST = {**BASE, "zero_stage": 0, "micro_batch_size": 8, "activation_checkpointing": "none"}
LOSS = [8.3 - 0.05 * i for i in range(10)]
GIB = 1 << 30


def write_rows(study_dir: Path, rows: list[TrialResult], name: str = "seg0") -> Path:
    """A tiny local trial-log writer: one Arrow IPC stream, one batch per row."""
    folder = study_dir / "trials"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.arrows"
    dicts = []
    for r in rows:
        d = r.to_dict()
        for k in ("config", "hardware", "telemetry", "extra", "phase_times_s"):
            d[k] = json.dumps(d[k], sort_keys=True)
        for k in ("started_at", "ended_at"):
            d[k] = dt.datetime.fromtimestamp(d[k], tz=dt.timezone.utc)
        dicts.append(d)
    table = pa.Table.from_pylist(dicts)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        for batch in table.to_batches(max_chunksize=1):
            w.write_batch(batch)
    return path


def row(
    tid: str,
    stage: str,
    cfg: dict[str, Any],
    t0: float,
    *,
    status: str = "ok",
    step: float | None = None,
    mem: float = 0.5,
    hw: str = "cpu-2core",
    **kw: Any,
) -> TrialResult:
    ok = status == "ok"
    r = TrialResult(
        trial_id=tid,
        stage=stage,
        config=dict(cfg),
        status=status,
        error="" if ok else kw.pop("error", f"{status} in trial"),
        step_time_s=step if ok else None,
        step_time_samples_s=[step * f for f in (0.98, 1.0, 1.02)] if ok and step else [],
        peak_memory_bytes=int(mem * GIB),
        memory_censored=status == "oom",
        memory_measure="mallinfo2",
        loss=list(LOSS) if ok else [],
        eval_loss=7.9 if ok else None,
        tokens_per_step=2048,
        optimizer_steps=10 if ok else None,
        tokens_per_s=2048 / step if ok and step else None,
        mfu=0.01 / step if ok and step else None,
        phase_times_s=(
            {"forward": step * 0.3, "backward": step * 0.5, "optimizer": step * 0.2}
            if ok and step
            else {}
        ),
        world_size=2,
        nodes=1,
        device_seconds=2 * 20.0,
        started_at=t0,
        ended_at=t0 + 20,
        hardware={"device": "cpu", "device_kind": hw, "host": "h1"},
        extra=TrialExtra(num_params=5_300_000),
    )
    r.extra.update(kw.pop("extra", TrialExtra()))
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def write_long_check(study_dir: Path, best: dict[str, Any], *, status: str = "passed") -> None:
    """A ``long_check.json`` of verify's best (as the long check writes it), ``status`` as given."""
    from infrarsi.study.candidate import Candidate
    from infrarsi.study.long_check_report import CheckpointVerdict, LongCheckResult

    ok = status == "passed"
    LongCheckResult(
        status=status,
        reason="" if ok else "step 14: |loss diff| 0.3 > 1e-4, past the trial's 10 steps",  # type: ignore[arg-type]
        config=dict(best["config"]),
        patches=[p["path"] for p in best.get("patches") or []],
        trial_steps=10,
        horizon_steps=24,
        horizon_factor=10.0,
        budget_s=90.0,
        estimated_cost_s=88.0,
        capped_by_budget=True,
        wall_s=91.0,
        loss_atol=1e-4,
        loss_rtol=0.0,
        contract_loss_atol=1e-4,
        eval_atol=1e-4,
        calibration=None,
        first_step_out=None if ok else 14,
        max_abs_diff=1e-6 if ok else 0.3,
        max_abs_diff_step=3 if ok else 14,
        invariant_reasons=[],
        checkpoint=CheckpointVerdict(
            status="passed",
            reason="",
            step=12,
            atol=1e-5,
            max_abs_diff=0.0,
            continued_steps=12,
            save_s=0.1,
            restart_s=0.2,
            checkpoint_bytes=1 << 20,
        ),
        baseline_loss=[8.3 - 0.05 * i for i in range(24)],
        candidate_loss=[8.3 - 0.05 * i + (0.0 if ok or i < 14 else 0.3) for i in range(24)],
        candidate_key=Candidate.from_dict(best).key,
    ).save(study_dir)


def write_verified(
    study_dir: Path, candidate_rows: list[TrialResult], *, speedup: float = 3.0
) -> dict[str, Any]:
    """Log ``candidate_rows`` as verify trials of one candidate (their config, patches and
    digests) and write a ``verify.json`` whose accepted best names them, as verify would."""
    rows = []
    for i, r in enumerate(candidate_rows):
        r.trial_id, r.stage = f"verify-c{i}", "verify"
        r.extra.update(TrialExtra(role="candidate", round=0, pair=i, candidate=0))
        rows.append(r)
    write_rows(study_dir, rows, name="verify")
    first = rows[0]
    best = {
        "config": first.config,
        "speedup": speedup,
        "ci_low": speedup * 0.9,
        "ci_high": speedup * 1.1,
        "ci_coverage": 0.969,
        "ci_method": "96.9% interval (order statistics 1 and 6 of 6 pairs)",
        "accepted": True,
        "trial_ids": [r.trial_id for r in rows],
        "patches": [
            PatchRef(p, d).to_dict() for p, d in zip(first.patches, first.patch_sha256, strict=True)
        ],
    }
    (study_dir / "verify.json").write_text(json.dumps({"best": best, "candidates": [best]}))
    write_long_check(study_dir, best)
    return best


def make_study(
    tmp: Path,
    name: str = "study",
    *,
    hw: str = "cpu-2core",
    verified: bool = True,
    patches: list[str] | None = None,
    switches: StudySwitches | None = None,
) -> Path:
    """A finished synthetic study ``tmp/name``; ``switches`` default to ``StudySwitches.resolve()``
    (the tests' environment: bank off)."""
    d = tmp / name
    Contract.create(
        ROOT / "workloads/dense_debug.yaml",
        study_dir=d,
        request="make it faster",
        memory_capacity_bytes=1 * GIB,
        trials=6,
        switches=switches,
    ).with_calibration(loss_atol=1e-4, reason="doctor: 3 baseline trials").save(d)
    t = time.time() - 3600
    digests = [file_sha256(p) for p in patches or []]
    rows = [
        row(f"doctor-{i}", "doctor", BASE, t + 20 * i, step=2.0 + 0.05 * i, mem=0.3, hw=hw)
        for i in range(3)
    ]
    run_specs = [
        ({**BASE, "zero_stage": 2}, "ok", 1.6, 0.4),
        (
            {**BASE, "micro_batch_size": 8, "activation_checkpointing": "none", "zero_stage": 1},
            "oom",
            None,
            1.1,
        ),
        (BEST, "ok", 0.66, 0.8),
        ({**BEST, "dtype": "bf16"}, "invariant_violation", None, 0.6),
        ({**BASE, "micro_batch_size": 4}, "ok", 1.1, 0.6),
        ({**BEST, "micro_batch_size": 4}, "failed", None, 0.0),
    ]
    for i, (cfg, st, step, mem) in enumerate(run_specs):
        rows.append(
            row(
                f"run-{i}",
                "run",
                cfg,
                t + 100 + 20 * i,
                status=st,
                step=step,
                mem=mem,
                hw=hw,
                patches=list(patches or []) if cfg == BEST else [],
                patch_sha256=list(digests) if cfg == BEST else [],
                extra=TrialExtra(
                    ask_info={
                        "config": cfg,
                        "phase": "bo",
                        "ask_index": i,  # AskInfo.to_dict()
                        "predicted_peak_memory_bytes": mem * 0.9 * GIB,
                    }
                ),
            )
        )
    for p in range(3):
        rows.append(
            row(
                f"verify-b{p}",
                "verify",
                BASE,
                t + 300 + 40 * p,
                step=2.0 + 0.02 * p,
                mem=0.3,
                hw=hw,
                extra=TrialExtra(role="baseline", round=0, pair=p),
            )
        )
        rows.append(
            row(
                f"verify-c{p}",
                "verify",
                BEST,
                t + 320 + 40 * p,
                step=0.66 + 0.01 * p,
                mem=0.8,
                hw=hw,
                patches=list(patches or []),
                patch_sha256=list(digests),
                extra=TrialExtra(role="candidate", round=0, pair=p, candidate=0),
            )
        )
    write_rows(d, rows)
    doctor = {
        "trials": 3,
        "ok_trials": 3,
        "statuses": {"ok": 3},
        "baseline_config": BASE,
        "step_time_s": {
            "median": 2.05,
            "per_trial": [2.0, 2.05, 2.1],
            "run_to_run_cv": 0.024,
            "within_trial_cv": 0.02,
        },
        "noise_margin": 0.05,
        "stragglers": {
            "flag": False,
            "rank": None,
            "spread": 0.01,
            "rule": "slowest in every trial",
        },
        "phase_times_s": {"forward": 0.6, "backward": 1.0, "optimizer": 0.4},
        "peak_memory_bytes": int(0.3 * GIB),
        "mfu": 0.005,
        "peak_flops_per_s": 5e10,
        "loss_tolerance": 1e-4,
        "loss_tolerance_floor": 1e-5,
        "loss_run_to_run_max_abs_diff": 1e-7,
        "how_measured": "3 separate baseline trials.",
    }
    (d / "doctor.json").write_text(json.dumps(doctor))
    best = {
        "config": BEST,
        "speedup": 3.03,
        "ci_low": 2.9,
        "ci_high": 3.1,
        "accepted": verified,
        "ci_coverage": 0.75,
        "ci_method": "75.0% interval (order statistics 1 and 3 of 3 pairs)",
        "patches": [PatchRef(p, d).to_dict() for p, d in zip(patches or [], digests, strict=True)],
        "trial_ids": [f"verify-c{p}" for p in range(3)],
    }
    (d / "verify.json").write_text(
        json.dumps(
            {"best": best, "candidates": [best], "baseline_config": BASE, "noise_margin": 0.05}
        )
    )
    if verified:
        write_long_check(d, best)
    return d
