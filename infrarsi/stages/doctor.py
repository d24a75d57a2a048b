"""Stage 2, ``doctor``: run the untouched baseline several times and calibrate the study.

It records the step-time noise (run-to-run and within-trial CV) and the noise margin verify must
clear, stragglers, the phase breakdown, the measured peak FLOP/s and the baseline MFU, and the loss
tolerance (from run-to-run loss differences, with a floor). Rows go to the log with
``stage=doctor``; the summary goes to ``doctor.json``; the calibrated tolerances are recorded in
the contract as an amendment (the only change a frozen contract allows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog

from infrarsi.errors import StudyError
from infrarsi.result import TrialResult
from infrarsi.stages.doctor_analysis import (
    LOSS_TOLERANCE_FACTOR,
    LOSS_TOLERANCE_FLOOR,
    analyse_baseline,
)
from infrarsi.study.paths import StudyPaths, write_json_atomic

log = structlog.get_logger(__name__)


def doctor_stage(study_dir: str | Path, *, repeats: int = 3, address: str | None = None,
                 tolerance_floor: float = LOSS_TOLERANCE_FLOOR) -> dict[str, Any]:
    """Run ``repeats`` baseline trials (separate trials, one after another) and write doctor.json."""
    from infrarsi.stages.executor import StudyExecutor
    from infrarsi.study.contract import Contract

    if repeats < 2:
        raise StudyError(f"doctor: repeats must be >= 2 to measure noise, got {repeats}.")
    paths = StudyPaths(Path(study_dir).resolve())
    ex = StudyExecutor(paths.root, address=address, check=False)
    rows: list[TrialResult] = []
    try:
        base = ex.full_config(dict(ex.workload.baseline))
        for i in range(repeats):
            row = ex.run_trial(base, "doctor", extra={"role": "baseline", "repeat": i})
            rows.append(TrialResult.from_dict(row))
    finally:
        ex.close()
    summary = analyse_baseline(rows, tolerance_floor=tolerance_floor)
    summary["baseline_config"] = base
    summary["trial_ids"] = [r.trial_id for r in rows]
    if summary["ok_trials"] < 2:
        bad = [f"{r.trial_id}: {r.status}: {r.error[:300]}" for r in rows if r.status != "ok"]
        write_json_atomic(paths.doctor.with_suffix(".failed.json"), summary)
        raise StudyError(
            f"doctor: only {summary['ok_trials']} of {repeats} baseline trials were ok, so noise and "
            f"tolerance cannot be measured. Failures: {bad}. Fix the workload, or raise the memory "
            f"capacity if the baseline itself runs out of memory."
        )
    contract = Contract.load(paths.root)
    inv = contract.invariants
    loss_atol = None if inv.loss_calibrated else float(summary["loss_tolerance"])
    eval_tol = max(tolerance_floor, LOSS_TOLERANCE_FACTOR * float(summary.get("eval_run_to_run_abs_diff") or 0.0))
    eval_atol = None if inv.eval_calibrated else eval_tol
    contract = contract.with_calibration(
        loss_atol=loss_atol, eval_atol=eval_atol, by="doctor",
        reason=(f"{repeats} baseline trials: max run-to-run loss difference "
                f"{summary['loss_run_to_run_max_abs_diff']:.3g}; tolerance = max(floor {tolerance_floor:g}, "
                f"{LOSS_TOLERANCE_FACTOR:g} x difference)"),
    )
    contract.save(paths.root)
    atol, rtol = contract.invariants.loss_tolerance()
    by = [a.by for a in contract.amendments if "invariants.loss_atol" in a.changes]
    summary["loss_tolerance_in_force"] = {"atol": atol, "rtol": rtol,
                                          "source": by[-1] if by else "user (init)"}
    summary["eval_tolerance_in_force"] = dict(zip(("atol", "rtol"), contract.invariants.eval_tolerance(), strict=True))
    summary["how_measured"] = (
        "step_time_s: per trial, the median over measured steps of the max-over-ranks time of one "
        "optimizer step (synchronised, communication included); noise: CV of those medians across "
        "the repeated baseline trials (run_to_run_cv) and the median within-trial CV of step samples."
    )
    write_json_atomic(paths.doctor, summary)
    log.info("doctor.done", median_step_time_s=summary["step_time_s"]["median"],
             cv=summary["step_time_s"]["run_to_run_cv"], loss_tolerance=atol)
    return summary
