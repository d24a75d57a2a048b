"""Stage 2, ``doctor``: run the untouched baseline several times and calibrate the study.

It records the step-time noise (run-to-run and within-trial CV) and the noise margin verify must
clear, stragglers, the phase breakdown, the measured peak FLOP/s and the baseline MFU, and the loss
tolerance (from run-to-run loss differences, with a floor). Rows go to the log with
``stage=doctor``; the summary goes to ``doctor.json``; the calibrated tolerances are recorded in
the contract as an amendment (the only change a frozen contract allows). The loss tolerance
also weighs honest changes (the baseline with another micro-batch split, with another ZeRO
stage), since identical runs can agree bitwise where honest candidates do not.
"""

from __future__ import annotations

from pathlib import Path

import structlog

from infrarsi.errors import StudyError, WorkloadError
from infrarsi.result import TrialExtra, TrialResult
from infrarsi.stages.doctor_analysis import (
    HONEST_CHANGE_FACTOR,
    LOSS_TOLERANCE_FACTOR,
    LOSS_TOLERANCE_FLOOR,
    analyse_baseline,
    honest_change_configs,
)
from infrarsi.study.doctor_report import DataOrder, DoctorReport, ToleranceInForce
from infrarsi.study.paths import StudyPaths
from infrarsi.workload import Workload

log = structlog.get_logger(__name__)

HOW_MEASURED = (
    "step_time_s: per trial, the median over measured steps of the max-over-ranks time of one "
    "optimizer step (synchronised, communication included); noise: CV of those medians across "
    "the repeated baseline trials (run_to_run_cv) and the median within-trial CV of step samples."
)


def doctor_stage(
    study_dir: str | Path,
    *,
    repeats: int = 3,
    address: str | None = None,
    tolerance_floor: float = LOSS_TOLERANCE_FLOOR,
    honest_change: bool = True,
    wait_s: float | None = None,
) -> DoctorReport:
    """``_doctor_stage`` holding the study lock (``infrarsi.study.lock``; ``wait_s``: how long to
    wait for another writer, None refuses at once with ``StudyLockedError``)."""
    from infrarsi.study.lock import hold_study

    with hold_study(study_dir, "doctor", wait_s=wait_s):
        return _doctor_stage(
            study_dir,
            repeats=repeats,
            address=address,
            tolerance_floor=tolerance_floor,
            honest_change=honest_change,
        )


def _doctor_stage(
    study_dir: str | Path,
    *,
    repeats: int,
    address: str | None,
    tolerance_floor: float,
    honest_change: bool,
) -> DoctorReport:
    """Run ``repeats`` baseline trials (separate trials, one after another), then, when
    ``honest_change``, the honest-change trials (``honest_change_configs``: the baseline with
    another micro-batch split and with another ZeRO stage, what honest candidates do to the
    loss), and write doctor.json.

    Calibrates the contract: the loss tolerance (unless given at init) from the run-to-run
    spread and the honest change, the eval tolerance, and the memory capacity when init left it
    unset and the device's memory is known (``DoctorReport.device_memory_capacity_bytes``, see
    ``infrarsi.study.capacity``)."""
    from infrarsi.execution.knobs import different_arithmetic_knobs
    from infrarsi.orchestration.executor import StudyExecutor
    from infrarsi.study.contract import Contract

    if repeats < 2:
        raise StudyError(f"doctor: repeats must be >= 2 to measure noise, got {repeats}.")
    paths = StudyPaths(Path(study_dir).resolve())
    ex = StudyExecutor(paths.root, address=address, check=False)
    rows: list[TrialResult] = []
    try:
        base = ex.full_config(dict(ex.workload.baseline))
        for i in range(repeats):
            row = ex.run_trial(base, "doctor", extra=TrialExtra(role="baseline", repeat=i))
            rows.append(TrialResult.from_dict(row))
        variants: list[tuple[str, TrialResult]] = []
        wl = ex.workload
        if honest_change and sum(r.status == "ok" for r in rows) >= 2:
            for knob, cfg in honest_change_configs(
                base, ex.space, wl.global_batch_size // wl.world_size
            ):
                if ex.scope_violation(cfg) is None:
                    row = ex.run_trial(
                        ex.full_config(cfg),
                        "doctor",
                        extra=TrialExtra(role="honest_change", changed=knob),
                    )
                    variants.append((knob, TrialResult.from_dict(row)))
    finally:
        ex.close()
    report = analyse_baseline(
        rows, tolerance_floor=tolerance_floor, honest_changes=variants
    ).model_copy(update={"baseline_config": base, "trial_ids": [r.trial_id for r in rows]})
    if report.ok_trials < 2:
        bad = [f"{r.trial_id}: {r.status}: {r.error[:300]}" for r in rows if r.status != "ok"]
        report.save_failed(paths.root)
        from infrarsi.report.memory import all_oom_verdict

        verdict = all_oom_verdict(
            rows, ex.contract, ex.space, ex.contract.workload_path or "WORKLOAD"
        )
        raise StudyError(
            f"doctor: only {report.ok_trials} of {repeats} baseline trials were ok, so noise and "
            f"tolerance cannot be measured. Failures: {bad}. "
            + (
                verdict
                or "Fix the workload, or raise the memory capacity if the baseline itself "
                "runs out of memory."
            )
            + f" `infrarsi report {paths.root}` shows every trial logged."
        )
    order = report.data_order
    if order is not None and not order.repeatable:
        report.save_failed(paths.root)
        raise WorkloadError(data_order_error(paths.root, ex.contract.workload_path, order))
    if report.device_memory_capacity_bytes is None:
        report = report.model_copy(
            update={"device_memory_capacity_bytes": _device_memory_bytes(ex.workload, address)}
        )
    contract = Contract.load(paths.root)
    inv = contract.invariants
    loss_atol = None if inv.loss_calibrated else float(report.loss_tolerance or tolerance_floor)
    eval_tol = float(
        report.eval_tolerance if report.eval_tolerance is not None else tolerance_floor
    )
    eval_atol = None if inv.eval_calibrated else eval_tol
    allowed = [
        k for k in different_arithmetic_knobs(contract.editable.knobs) if k in ex.space.names
    ]
    for k in allowed:
        if k not in report.arithmetic_tolerances:
            log.warning(
                "doctor.arithmetic_uncalibrated",
                knob=k,
                why="no ok trial with it on (see doctor.json honest_changes): its candidates are "
                "judged with the study's own tolerances",
            )
    contract = contract.with_calibration(
        loss_atol=loss_atol,
        eval_atol=eval_atol,
        arithmetic_tolerances=report.arithmetic_tolerances,
        by="doctor",
        reason=(
            f"{repeats} baseline trials: max run-to-run loss difference "
            f"{float(report.loss_run_to_run_max_abs_diff or 0.0):.3g}; "
            + _honest_change_text(report)
            + f"tolerance = max(floor {tolerance_floor:g}, {LOSS_TOLERANCE_FACTOR:g} x run-to-run, "
            f"{HONEST_CHANGE_FACTOR:g} x largest honest change), for the training loss and the "
            f"eval loss alike" + _arithmetic_text(report)
        ),
    )
    if contract.memory_capacity_bytes is None and report.device_memory_capacity_bytes:
        contract = contract.with_calibration(
            memory_capacity_bytes=report.device_memory_capacity_bytes,
            by="doctor",
            reason="doctor: the device's memory (no --memory-capacity at init, none in the workload)",
        )
    contract.save(paths.root)
    atol, rtol = contract.invariants.loss_tolerance()
    by = [a.by for a in contract.amendments if "invariants.loss_atol" in a.changes]
    eval_atol_now, eval_rtol_now = contract.invariants.eval_tolerance()
    report = report.model_copy(
        update={
            "loss_tolerance_in_force": ToleranceInForce(
                atol=atol, rtol=rtol, source=by[-1] if by else "user (init)"
            ),
            "eval_tolerance_in_force": ToleranceInForce(atol=eval_atol_now, rtol=eval_rtol_now),
            "how_measured": HOW_MEASURED,
        }
    )
    report.save(paths.root)
    log.info(
        "doctor.done",
        median_step_time_s=report.baseline_step_time_s,
        cv=report.step_time_s.run_to_run_cv if report.step_time_s else None,
        loss_tolerance=atol,
        memory_capacity=contract.memory_capacity.describe(),
    )
    from infrarsi.bank.feed import add_to_bank

    add_to_bank(paths.root, stage="doctor")  # the experience bank (never fails the stage)
    return report


def data_order_error(study: Path, workload_path: str | None, order: DataOrder) -> str:
    """The doctor's refusal of a job whose data order changes between identical runs."""
    a, b = [*order.differing_trial_ids, "?", "?"][:2]
    return (
        f"doctor: {workload_path or 'the workload'}: rule: identical baseline runs must feed the "
        f"model the same token ids in the same optimizer steps; value: baseline trials {a} and {b} "
        f"fed different data at optimizer step {order.first_differing_step} (the harness's "
        f"per-step digests of the token ids differ). Every candidate's loss is compared with the "
        f"baseline's step by step, which needs a fixed data order. Fix: seed the job's shuffling "
        f"with a constant (DataLoader(generator=torch.Generator().manual_seed(0)), "
        f"DistributedSampler(seed=0), a fixed random/numpy seed) rather than one that changes per "
        f"run (time, pid, an unseeded RNG), or drop the shuffling; then re-run `infrarsi doctor "
        f"{study}`. The analysis is in {StudyPaths(study).doctor_failed.name}."
    )


def _arithmetic_text(report: DoctorReport) -> str:
    """The calibration reason's part on knobs of another arithmetic (empty when none)."""
    if not report.arithmetic_tolerances:
        return ""
    parts = [
        f"{k}: loss {t.loss_atol:.3g}, eval {t.eval_atol:.3g}"
        for k, t in report.arithmetic_tolerances.items()
    ]
    return (
        "; candidates with a knob of another arithmetic on get their own tolerances "
        f"(max(the above, {HONEST_CHANGE_FACTOR:g} x that knob's change), its change left out of "
        "the above): " + ", ".join(parts)
    )


def _honest_change_text(report: DoctorReport) -> str:
    if not report.honest_changes:
        return "no honest-change trial (no other micro-batch split or ZeRO stage in scope); "
    base = report.baseline_config or {}
    parts = []
    for c in report.honest_changes:
        rides = [k for k, v in c.config.items() if k != c.changed and base.get(k, v) != v]
        what = f"{c.changed} {c.config.get(c.changed)}" + (
            f" (with {', '.join(f'{k} {c.config[k]}' for k in rides)})" if rides else ""
        )
        if c.loss_max_abs_diff is None:
            parts.append(f"{what}: ended {c.status}, not used")
        else:
            ev = "" if c.eval_loss_abs_diff is None else f", eval {c.eval_loss_abs_diff:.3g}"
            parts.append(f"{what}: {c.loss_max_abs_diff:.3g}{ev}")
    return "honest changes (max loss difference, eval loss difference) " + ", ".join(parts) + "; "


def _device_memory_bytes(wl: Workload, address: str | None) -> int | None:
    """The memory of one device when the trials' hardware did not report it: the surrogate's
    modelled GPU, or (CUDA on a local Ray only, where the driver sees the trials' devices) the
    smallest visible GPU's memory from NVML (which opens no CUDA context). None otherwise."""
    import os

    if wl.backend == "surrogate":
        from infrarsi.execution.surrogate.backend import problem_for

        return int(problem_for(wl).memory_capacity_bytes) if wl.memory_capacity is None else None
    if wl.resources.device != "cuda" or address or os.environ.get("RAY_ADDRESS"):
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            n = pynvml.nvmlDeviceGetCount()
            totals = [
                int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total)
                for i in range(n)
            ]
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # no NVML, no driver: the capacity stays unknown
        log.info("doctor.device_memory_unknown", error=str(e))
        return None
    return min(totals) if totals else None
