"""``Outcome`` and ``Outcome.from_row``: the one rule that turns a log row or a Tune result into an outcome."""

from __future__ import annotations

import math

import pytest

from infrarsi.errors import UserInputError
from infrarsi.result import TrialResult
from infrarsi.search import Outcome


def test_an_explicit_status_wins() -> None:
    ok = Outcome.from_row({"status": "ok", "step_time_s": 2.0, "peak_memory_bytes": 5.0})
    assert ok == Outcome(
        status="ok", step_time=2.0, peak_memory=5.0, extra={"memory_censored": False}
    )
    assert Outcome.from_row({"status": "timeout", "step_time_s": 2.0}).status == "timeout"
    assert Outcome.from_row({"status": "failed", "step_time_s": 2.0}).step_time is None


def test_a_missing_status_is_ok_only_with_a_valid_step_time() -> None:
    assert Outcome.from_row({"step_time_s": 1.5}) == Outcome(
        status="ok", step_time=1.5, extra={"memory_censored": False}
    )
    assert Outcome.from_row({"step_time": 1.5}).step_time == 1.5  # Tune's other metric name
    for row in (
        {},
        {"status": None},
        {"status": ""},
        {"step_time_s": math.nan},
        {"step_time_s": 0.0},
        {"step_time_s": "fast"},
    ):
        assert Outcome.from_row(row).status == "failed", row


def test_ok_without_a_valid_step_time_is_failed_and_an_unknown_status_too() -> None:
    for step in (None, math.nan, math.inf, -1.0, 0.0):
        assert Outcome.from_row({"status": "ok", "step_time_s": step}).status == "failed"
    assert Outcome.from_row({"status": "bogus", "step_time_s": 1.0}).status == "failed"


def test_peak_memory_is_kept_for_ok_and_oom_and_memory_censored_is_kept() -> None:
    oom = Outcome.from_row({"status": "oom", "step_time_s": math.nan, "peak_memory_bytes": 80e9})
    assert oom.status == "oom" and oom.peak_memory == 80e9 and oom.step_time is None
    assert oom.extra["memory_censored"] is True  # no memory_censored field: an oom is censored
    assert (
        Outcome.from_row({"status": "oom", "memory_censored": False}).extra["memory_censored"]
        is False
    )
    assert Outcome.from_row({"status": "oom", "peak_memory_bytes": math.nan}).peak_memory is None
    assert Outcome.from_row({"status": "failed", "peak_memory_bytes": 1e9}).peak_memory is None


def test_a_trial_result_reads_like_its_row() -> None:
    r = TrialResult(
        trial_id="t",
        stage="run",
        config={},
        status="oom",
        peak_memory_bytes=10**9,
        memory_censored=True,
    )
    assert Outcome.from_row(r) == Outcome.from_row(r.to_dict())
    assert Outcome.from_row(r) == Outcome(
        status="oom", peak_memory=1e9, extra={"memory_censored": True}
    )
    ok = TrialResult(trial_id="u", stage="run", config={}, status="ok", step_time_s=None)
    assert Outcome.from_row(ok).status == "failed"


def test_outcome_rules_are_user_input_errors() -> None:
    with pytest.raises(UserInputError, match="step_time"):
        Outcome(status="ok")
    with pytest.raises(UserInputError, match="status"):
        Outcome(status="bogus")
    assert Outcome.from_dict(Outcome(status="ok", step_time=1.0).to_dict()) == Outcome(
        status="ok", step_time=1.0
    )
