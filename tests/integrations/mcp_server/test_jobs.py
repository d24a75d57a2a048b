"""Background runs for MCP clients: bounded by the budget, one at a time, never over another
writer; a failed step is reported with the end of its log; trials in flight come from their
heartbeat markers."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from infrarsi.errors import StudyLockedError, UserInputError
from infrarsi.integrations.mcp_server.jobs import RunJob, RunJobs, in_flight


def test_a_run_outside_the_budget_is_refused_with_the_count_to_ask(tmp_path: Path) -> None:
    jobs = RunJobs(tmp_path)
    with pytest.raises(UserInputError, match=r"1 to 2 .* got 5\. Fix: \"trials\": 2"):
        jobs.start(5, used=2, budget=4)
    with pytest.raises(UserInputError, match="all 4 are spent"):
        jobs.start(1, used=4, budget=4)
    assert jobs.jobs == []


def test_no_run_starts_while_another_writer_holds_the_study(study: Path) -> None:
    from infrarsi.study.lock import hold_study

    with hold_study(study, "verify"), pytest.raises(StudyLockedError, match="held by `verify`"):
        RunJobs(study).start(1, used=0, budget=4)


def test_no_second_run_starts_while_the_first_runs(tmp_path: Path) -> None:
    jobs = RunJobs(tmp_path)
    jobs.jobs.append(
        RunJob(job_id="run-1", trials=1, steps=["run"], log="mcp/run-1.log", step="run")
    )
    with pytest.raises(StudyLockedError, match="run-1 \\(run\\) still runs"):
        jobs.start(1, used=0, budget=4)


def test_a_failed_step_ends_the_job_with_its_log(tmp_path: Path) -> None:
    jobs = RunJobs(tmp_path)
    job = RunJob(job_id="run-1", trials=1, steps=["doctor", "run"], log="mcp/run-1.log")
    fail = [sys.executable, "-c", "import sys; print('error: run doctor first'); sys.exit(2)"]
    jobs._work(job, [fail, [sys.executable, "-c", "print('never')"]])
    assert (job.state, job.step, job.exit_code) == ("failed", "doctor", 2)
    assert (
        "error: run doctor first" in job.error and "never" not in (tmp_path / job.log).read_text()
    )
    assert job.to_dict()["elapsed_s"] >= 0


def test_trials_in_flight_are_read_from_their_heartbeat_markers(tmp_path: Path) -> None:
    from infrarsi.study.paths import InflightMarkers, StudyPaths

    markers = InflightMarkers(StudyPaths(tmp_path))
    markers.start("run-0003", "run", {"micro_batch_size": 2}, 8)
    try:
        (m,) = in_flight(tmp_path)
        assert m["trial_id"] == "run-0003" and m["config"] == {"micro_batch_size": 2} and m["alive"]
    finally:
        markers.done("run-0003")
    assert in_flight(tmp_path) == []
    stale = tmp_path / "inflight" / "run-0004.json"
    stale.write_text('{"trial_id": "run-0004", "stage": "run", "started_at": 0}')
    old = time.time() - 600
    os.utime(stale, (old, old))
    (m,) = in_flight(tmp_path)
    assert m["trial_id"] == "run-0004" and not m["alive"] and m["last_heartbeat_s_ago"] >= 600
