"""Pure rules of the long check (no Ray), kept apart from the stage that runs trials.

They decide the horizon the budget buys, the horizon's tolerance, the loss-curve comparison and
the checkpoint round trip's verdict."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from infrarsi.stages.doctor_analysis import HONEST_CHANGE_FACTOR, LOSS_TOLERANCE_FACTOR
from infrarsi.study.long_check_report import CheckpointVerdict, Verdict

DEFAULT_HORIZON_FACTOR = 10.0
"""The horizon asked for, in a trial's optimizer steps (the issue's "about 10x"); the contract's
budget caps it (``plan_horizon``)."""

MIN_CALIBRATED_FACTOR = 2.0
"""The calibration run is dropped when, with it, the budget buys less than this many trials'
steps (``choose_plan``)."""

CHECKPOINT_ATOL: dict[str, float] = {"fp32": 1e-5, "bf16": 5e-3, "fp16": 5e-3}
"""Per-step tolerance of |continued - uninterrupted| loss after the checkpoint round trip, by the
config's ``dtype``. The restored run is the same run (same weights, optimizer moments, step
count and batches): on CPU in fp32 the continued losses were bitwise equal under ZeRO 0, 2 and 3
(measured here, ``tests/execution/test_long_trial.py``); 16-bit GPU kernels may reorder
reductions, so they get the run-to-run size of bf16 noise (2e-3 over 4 steps at 1.5B on an H200,
``doctor_analysis``) with room."""


@dataclass(frozen=True)
class HorizonPlan:
    """The horizon the long check runs and what it was estimated to cost."""

    trial_steps: int
    """Optimizer steps of an ordinary trial (warm-up included)."""
    horizon_steps: int
    """Optimizer steps of each long run (warm-up included); <= ``trial_steps`` means no step past
    the trial's horizon fits the budget."""
    checkpoint_step: int
    """Where the round trip saves (mid-horizon: ``horizon_steps // 2``)."""
    estimated_cost_s: float
    """Estimated seconds of the whole check at this horizon."""
    capped_by_budget: bool
    """True when the budget, not the factor, set ``horizon_steps``."""
    per_step_s: float
    """Estimated seconds one horizon step adds over all the runs (baseline, calibration,
    candidate, and half a step of the continued run)."""
    fixed_s: float
    """Estimated seconds independent of the horizon (each run's set-up and end checks, the restart)."""


def plan_horizon(
    *,
    trial_steps: int,
    factor: float,
    budget_s: float,
    baseline_step_s: float,
    candidate_step_s: float,
    calibration_step_s: float | None,
    overhead_s: float,
    checkpoint: bool = True,
    start_s: float = 0.0,
) -> HorizonPlan:
    """The horizon: ``ceil(factor x trial_steps)`` optimizer steps, capped so the estimated cost
    fits ``budget_s``. Estimated cost = ``fixed_s + horizon x per_step_s`` with ``per_step_s`` =
    baseline step + calibration step (when there is one) + candidate step x (1.5 with the
    checkpoint round trip: the continued run trains the second half again) and ``fixed_s`` =
    ``overhead_s`` (one run's set-up and end checks, from the doctor's baseline trial) per run,
    the restart counting as one, plus ``start_s`` once (a fresh executor: Ray and the first worker
    group). Step times are seconds per optimizer step (the doctor's baseline median; the
    candidate's verified speed)."""
    runs = 2 + (calibration_step_s is not None) + (1 if checkpoint else 0)
    per_step = (
        baseline_step_s
        + (calibration_step_s or 0.0)
        + candidate_step_s * (1.5 if checkpoint else 1.0)
    )
    fixed = overhead_s * runs + start_s
    want = max(1, math.ceil(factor * trial_steps))
    afford = int((budget_s - fixed) // per_step) if per_step > 0 else want
    horizon = min(want, afford)
    horizon = max(horizon, 0)
    return HorizonPlan(
        trial_steps=trial_steps,
        horizon_steps=horizon,
        checkpoint_step=max(1, horizon // 2),
        estimated_cost_s=fixed + horizon * per_step,
        capped_by_budget=afford < want,
        per_step_s=per_step,
        fixed_s=fixed,
    )


def choose_plan(
    *,
    trial_steps: int,
    factor: float,
    budget_s: float,
    baseline_step_s: float,
    candidate_step_s: float,
    calibration_step_s: float | None,
    overhead_s: float,
    checkpoint: bool = True,
    start_s: float = 0.0,
) -> tuple[HorizonPlan, bool]:
    """(the plan, whether it runs the calibration). With the calibration when the budget buys at
    least ``MIN_CALIBRATED_FACTOR`` x the trial's steps with it (or buys no more without it);
    else without it: a horizon past the trial's is worth more than widening the tolerance, and
    the contract's narrower tolerance errs on the safe side (an honest candidate whose noise
    outgrew it fails, and the verdict says the tolerance was not calibrated for the horizon)."""
    kw = dict(
        trial_steps=trial_steps,
        factor=factor,
        budget_s=budget_s,
        baseline_step_s=baseline_step_s,
        candidate_step_s=candidate_step_s,
        overhead_s=overhead_s,
        checkpoint=checkpoint,
        start_s=start_s,
    )
    without = plan_horizon(calibration_step_s=None, **kw)  # type: ignore[arg-type]
    if calibration_step_s is None:
        return without, False
    with_cal = plan_horizon(calibration_step_s=calibration_step_s, **kw)  # type: ignore[arg-type]
    if (
        with_cal.horizon_steps >= MIN_CALIBRATED_FACTOR * trial_steps
        or with_cal.horizon_steps >= without.horizon_steps
    ):
        return with_cal, True
    return without, False


def max_abs_diff(a: Sequence[float], b: Sequence[float]) -> tuple[float | None, int | None]:
    """(largest |a_i - b_i| over the common finite steps, its step); (None, None) without any."""
    best: tuple[float | None, int | None] = (None, None)
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if math.isfinite(x) and math.isfinite(y) and (best[0] is None or abs(x - y) > best[0]):
            best = (abs(x - y), i)
    return best


def horizon_tolerance(contract_atol: float, calibration_diff: float | None) -> float:
    """The horizon's absolute per-step loss tolerance, the doctor's rule applied at the horizon:
    the contract's tolerance (calibrated on a trial's steps, never narrowed) widened to
    ``HONEST_CHANGE_FACTOR`` x the largest loss difference an honest change of the baseline
    (another micro-batch split or ZeRO stage) showed over the same horizon. Honest differences
    (reduction order) grow with steps; a real drift (a counter, a schedule, an instability) is
    not an honest change, and is caught when it grows past that."""
    return max(float(contract_atol), HONEST_CHANGE_FACTOR * float(calibration_diff or 0.0))


def first_step_out(
    candidate: Sequence[float], baseline: Sequence[float], atol: float, rtol: float
) -> int | None:
    """The first step whose |candidate - baseline| > atol + rtol x |baseline|, or a non-finite
    candidate loss against a finite baseline; None when every common step is within."""
    for i, (x, b) in enumerate(zip(candidate, baseline, strict=False)):
        if not math.isfinite(b):
            continue
        if not math.isfinite(x) or abs(x - b) > atol + rtol * abs(b):
            return i
    return None


def checkpoint_tolerance(dtype: str, run_to_run_spread: float | None) -> float:
    """The round trip's per-step tolerance: ``CHECKPOINT_ATOL`` of the dtype (fp32's for an
    unknown one), at least ``LOSS_TOLERANCE_FACTOR`` x the doctor's run-to-run loss spread of
    identical baseline runs (the noise of running the same thing twice on this hardware)."""
    base = CHECKPOINT_ATOL.get(str(dtype), CHECKPOINT_ATOL["fp32"])
    return max(base, LOSS_TOLERANCE_FACTOR * float(run_to_run_spread or 0.0))


def checkpoint_verdict(
    trip: dict[str, Any] | None, uninterrupted: Sequence[float], atol: float
) -> CheckpointVerdict:
    """The verdict on a row's ``extra.checkpoint_round_trip`` (``checkpoint_trip.RoundTrip``)
    against the uninterrupted losses of the same run."""
    if not trip:
        return CheckpointVerdict(
            status="skipped",
            reason="no checkpoint round trip was run",
            step=None,
            atol=atol,
            max_abs_diff=None,
            continued_steps=0,
            save_s=0.0,
            restart_s=0.0,
            checkpoint_bytes=0,
        )
    step = int(trip.get("step") or 0)
    cont = [float(x) for x in trip.get("loss") or []]

    def verdict(status: Verdict, reason: str, diff: float | None) -> CheckpointVerdict:
        return CheckpointVerdict(
            status=status,
            reason=reason,
            step=step,
            atol=atol,
            max_abs_diff=diff,
            continued_steps=len(cont),
            save_s=float(trip.get("save_s") or 0.0),
            restart_s=float(trip.get("restart_s") or 0.0),
            checkpoint_bytes=int(trip.get("checkpoint_bytes") or 0),
        )

    if trip.get("skipped"):
        return verdict("skipped", str(trip["skipped"]), None)
    if trip.get("error"):
        return verdict("failed", str(trip["error"]), None)
    ref = [float(x) for x in uninterrupted[step:]]
    diff, at = max_abs_diff(cont, ref)
    if len(cont) < len(ref) or diff is None:
        return verdict(
            "failed",
            f"the run restarted from the step-{step} checkpoint trained {len(cont)} of the "
            f"{len(ref)} steps after it (a non-finite loss stops it)",
            diff,
        )
    out = first_step_out(cont, ref, atol, 0.0)
    if out is not None:
        return verdict(
            "failed",
            (
                f"after the restart from the step-{step} checkpoint, step {step + out} loss {cont[out]:.6g} vs "
                f"{ref[out]:.6g} uninterrupted (|diff| {abs(cont[out] - ref[out]):.3g} > tolerance {atol:.3g}; "
                f"largest {diff:.3g} at step {step + int(at or 0)}): the checkpoint does not hold the whole "
                f"training state (a counter, a schedule or a buffer the model keeps outside it?)"
            ),
            diff,
        )
    return verdict("passed", "", diff)


__all__ = [
    "CHECKPOINT_ATOL",
    "DEFAULT_HORIZON_FACTOR",
    "MIN_CALIBRATED_FACTOR",
    "HorizonPlan",
    "checkpoint_tolerance",
    "checkpoint_verdict",
    "choose_plan",
    "first_step_out",
    "horizon_tolerance",
    "max_abs_diff",
    "plan_horizon",
]
