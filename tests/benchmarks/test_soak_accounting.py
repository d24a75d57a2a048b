"""The soak benchmark's accounting on synthetic logs (``benchmarks.soak_accounting.account``): lost,
duplicated, budget and device time. The soak itself (a Ray cluster under faults) is not run here."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.soak_accounting import FIELDS, account, tune_reported_ids
from infrarsi.result import TrialExtra, TrialResult


def _row(
    tid: str,
    status: str = "ok",
    *,
    tune: str | None = None,
    interrupted: bool = False,
    device: float = 10.0,
    stage: str = "run",
) -> TrialResult:
    extra = TrialExtra(tune_trial_id=tune)
    if interrupted:
        extra.interrupted = extra.device_seconds_lower_bound = True
    return TrialResult(
        trial_id=tid,
        stage=stage,
        config={},
        status="failed" if interrupted else status,
        device_seconds=device,
        extra=extra,
    )


def test_a_clean_log_has_nothing_lost_or_duplicated_and_meets_its_budget() -> None:
    rows = [
        _row("doctor-0000", stage="doctor"),
        _row("run-0000", tune="a_00000"),
        _row("run-0001", "oom", tune="a_00001", device=4.0),
        _row("run-0002", interrupted=True, device=1.5),
        _row("run-0003", tune="b_00000"),
    ]
    acc = account(
        rows,
        requested=3,
        markers_seen=["run-0001", "run-0002"],
        tune_reported=["a_00000", "a_00001", "b_00000"],
    )
    assert acc["trials_lost"] == 0 and acc["trials_duplicated"] == 0, acc
    assert acc["trials_started"] == 4 and acc["trials_counted"] == 3 and acc["budget_met"]
    assert acc["trials_interrupted"] == 1
    assert acc["statuses"] == {"interrupted": 1, "ok": 2, "oom": 1}
    assert acc["device_seconds"] == {"interrupted": 1.5, "ok": 20.0, "oom": 4.0}
    assert acc["device_seconds_total"] == 25.5  # doctor rows are not the run's


def test_a_gap_in_the_ids_a_marker_seen_or_left_and_a_reported_tune_trial_without_a_row_are_lost() -> (
    None
):
    rows = [_row("run-0000", tune="a_00000"), _row("run-0002", tune="a_00002")]
    acc = account(
        rows,
        requested=2,
        markers_seen=["run-0005"],
        leftover_markers=["run-0004"],
        tune_reported=["a_00000", "a_00002", "a_00003"],
    )
    # run-0001 (a gap), run-0003 (below a seen id), run-0004 (left over: also counted as a
    # marker), run-0005 (seen in flight), and Tune trial a_00003 (reported, no row)
    assert acc["lost_ids"] == [
        "run-0001",
        "run-0003",
        "run-0004",
        "run-0005",
        "tune:a_00003",
        "marker:run-0004",
    ]
    assert acc["trials_lost"] == 6 and acc["trials_started"] == 6


def test_an_id_logged_twice_or_a_tune_trial_run_twice_is_duplicated_but_an_interrupted_copy_is_not() -> (
    None
):
    rows = [
        _row("run-0000", tune="a_00000"),
        _row("run-0000", tune="a_00000"),
        _row("run-0001", tune="a_00001"),
        _row("run-0002", tune="a_00001"),
        _row("run-0003", tune="a_00002", interrupted=True),
        _row("run-0004", tune="a_00002"),
    ]
    acc = account(rows, requested=5)
    assert acc["duplicated_ids"] == ["run-0000", "tune:a_00000", "tune:a_00001"]
    assert acc["trials_duplicated"] == 3
    assert acc["trials_counted"] == 5 and acc["budget_met"]


def test_budget_short_or_over_is_not_met() -> None:
    assert not account([_row("run-0000")], requested=2)["budget_met"]
    assert not account([_row("run-0000"), _row("run-0001")], requested=1)["budget_met"]


def test_dict_rows_are_read_like_trial_results() -> None:
    rows = [_row("run-0000", tune="a_00000").to_dict(), _row("run-0001", tune="a_00001").to_dict()]
    assert account(rows, requested=2)["trials_lost"] == 0


def test_tune_reported_ids_read_result_files(tmp_path: Path) -> None:
    a = tmp_path / "tune" / "run-1" / "infrarsi_trial_3f2a9c1e_1_x=1_2026-12-04_15-00-00"
    b = tmp_path / "tune" / "run-1" / "infrarsi_trial_0b2e4d6f_2_x=2_2026-12-04_15-00-01"
    c = tmp_path / "tune" / "run-1" / "infrarsi_trial_9a8b7c6d_3_x=3_2026-12-04_15-00-02"
    for d in (a, b, c):
        d.mkdir(parents=True)
    (a / "result.json").write_text(json.dumps({"step_time_s": 1.0}) + "\n")
    (b / "result.json").write_text("")  # never reported
    (c / "result.json").write_text(json.dumps({"trial_id": "9a8b7c6d", "step_time_s": 2.0}) + "\n")
    assert tune_reported_ids(tmp_path) == ["3f2a9c1e", "9a8b7c6d"]


def test_every_accounting_field_is_defined() -> None:
    acc = account([_row("run-0000")], requested=1)
    assert set(acc) <= set(FIELDS), set(acc) - set(FIELDS)
