"""Study directory bookkeeping: trial ids never reused, in-flight markers."""

from __future__ import annotations

from pathlib import Path

from infrarsi.study.paths import InflightMarkers, StudyPaths, TrialIds


def test_trial_ids_continue_after_the_largest_seen() -> None:
    ids = TrialIds(["run-0000", "run-0007", "doctor-0002", "garbage"])
    assert ids.new("run") == "run-0008"
    assert ids.new("run") == "run-0009"
    assert ids.new("doctor") == "doctor-0003"
    assert ids.new("verify") == "verify-0000"


def test_inflight_markers_round_trip(tmp_path: Path) -> None:
    m = InflightMarkers(StudyPaths(tmp_path))
    assert m.leftovers() == []
    m.start("run-0003", "run", {"zero_stage": 1}, 2)
    m.start("run-0004", "run", {"zero_stage": 2}, 2)
    m.done("run-0003")
    left = m.leftovers()
    assert [x["trial_id"] for x in left] == ["run-0004"]
    assert left[0]["config"] == {"zero_stage": 2}
