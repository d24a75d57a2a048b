"""The long check's pure rules: the horizon the budget buys, the horizon's tolerance, the first
step out, the checkpoint verdict, and the record's JSON."""

from __future__ import annotations

import pytest

from infrarsi.errors import StudyError
from infrarsi.stages.long_check_analysis import (
    checkpoint_tolerance,
    checkpoint_verdict,
    choose_plan,
    first_step_out,
    horizon_tolerance,
    max_abs_diff,
    plan_horizon,
)


def test_the_factor_sets_the_horizon_when_the_budget_allows_and_the_budget_caps_it_otherwise() -> (
    None
):
    kw = dict(
        trial_steps=11,
        baseline_step_s=2.0,
        candidate_step_s=0.5,
        calibration_step_s=1.0,
        overhead_s=5.0,
    )
    free = plan_horizon(factor=10, budget_s=1e6, **kw)
    assert free.horizon_steps == 110 and not free.capped_by_budget and free.checkpoint_step == 55
    assert free.per_step_s == pytest.approx(
        2.0 + 1.0 + 0.5 * 1.5
    ) and free.fixed_s == pytest.approx(20.0)
    assert free.estimated_cost_s == pytest.approx(20.0 + 110 * 3.75)
    capped = plan_horizon(factor=10, budget_s=170.0, **kw)
    assert capped.capped_by_budget and capped.horizon_steps == 40  # (170 - 20) / 3.75
    assert capped.estimated_cost_s <= 170.0
    no_cal = plan_horizon(
        factor=10, budget_s=170.0, checkpoint=False, **{**kw, "calibration_step_s": None}
    )
    assert no_cal.fixed_s == pytest.approx(10.0) and no_cal.horizon_steps == 64  # (170 - 10) / 2.5
    broke = plan_horizon(factor=10, budget_s=10.0, **kw)
    assert broke.horizon_steps == 0 and broke.capped_by_budget


def test_the_calibration_run_is_dropped_only_when_it_would_leave_less_than_twice_the_trial() -> (
    None
):
    kw = dict(
        trial_steps=11,
        factor=10,
        baseline_step_s=2.0,
        candidate_step_s=0.6,
        calibration_step_s=1.2,
        overhead_s=4.0,
    )
    plan, calibrated = choose_plan(budget_s=400.0, **kw)
    assert calibrated and plan.horizon_steps >= 22
    plan, calibrated = choose_plan(
        budget_s=100.0, **kw
    )  # with it: (100 - 16) / 4.1 = 20 < 22 steps
    assert not calibrated and plan.horizon_steps == 30  # (100 - 12) / 2.9
    plan, calibrated = choose_plan(budget_s=100.0, **{**kw, "calibration_step_s": None})
    assert not calibrated and plan.horizon_steps == 30


def test_the_horizon_tolerance_is_the_doctors_rule_and_never_narrower_than_the_contract() -> None:
    assert horizon_tolerance(1e-4, None) == 1e-4
    assert horizon_tolerance(1e-4, 1e-6) == 1e-4
    assert horizon_tolerance(1e-4, 1e-3) == pytest.approx(3e-3)


def test_the_first_step_out_and_the_largest_difference() -> None:
    base = [5.0, 4.0, 3.0, 2.0]
    assert first_step_out([5.0, 4.0, 3.0, 2.0], base, 1e-4, 0.0) is None
    assert first_step_out([5.0, 4.00005, 3.01, 2.5], base, 1e-4, 0.0) == 2
    assert first_step_out([5.0, float("nan"), 3.0, 2.0], base, 1e-4, 0.0) == 1
    assert first_step_out([5.0, 4.0, 3.2, 2.0], base, 1e-4, 0.1) is None  # within rtol x |baseline|
    assert max_abs_diff([5.0, 4.1, 3.0], base) == (pytest.approx(0.1), 1)
    assert max_abs_diff([], base) == (None, None)


def test_the_checkpoint_verdict() -> None:
    unint = [5.0, 4.0, 3.0, 2.0]
    trip = {
        "step": 2,
        "loss": [3.0, 2.0],
        "error": "",
        "skipped": "",
        "save_s": 0.1,
        "restart_s": 0.2,
        "checkpoint_bytes": 10,
    }
    ok = checkpoint_verdict(trip, unint, 1e-5)
    assert (
        ok.status == "passed"
        and ok.max_abs_diff == 0.0
        and ok.continued_steps == 2
        and ok.step == 2
    )
    off = checkpoint_verdict({**trip, "loss": [3.0, 2.1]}, unint, 1e-5)
    assert off.status == "failed" and "step 3 loss 2.1" in off.reason
    short = checkpoint_verdict({**trip, "loss": [3.0]}, unint, 1e-5)
    assert short.status == "failed" and "1 of the 2 steps" in short.reason
    err = checkpoint_verdict(
        {**trip, "loss": [], "error": "checkpoint load failed: missing x"}, unint, 1e-5
    )
    assert err.status == "failed" and err.reason == "checkpoint load failed: missing x"
    assert (
        checkpoint_verdict({**trip, "skipped": "expert parallelism"}, unint, 1e-5).status
        == "skipped"
    )
    assert checkpoint_verdict(None, unint, 1e-5).status == "skipped"
    assert checkpoint_tolerance("fp32", None) == 1e-5
    assert checkpoint_tolerance("bf16", 1e-3) == pytest.approx(1e-2)  # 10 x the run-to-run spread


def test_a_malformed_record_names_the_field() -> None:
    from infrarsi.study.long_check_report import LongCheckResult

    with pytest.raises(StudyError, match=r"field 'status'.*'maybe'"):
        LongCheckResult.from_json({"status": "maybe"}, source="x.json")
    with pytest.raises(StudyError, match=r"checkpoint\.status"):
        LongCheckResult.from_json({"status": "passed", "checkpoint": {}}, source="x.json")
