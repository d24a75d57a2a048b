"""Study directory bookkeeping: trial ids never reused, in-flight markers, folders made 0700."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from infrarsi.study.paths import (
    STUDY_DIR_MODE,
    InflightMarkers,
    StudyPaths,
    TrialIds,
    make_private_dir,
)


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


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_a_study_directory_is_created_0700_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        d = make_private_dir(tmp_path / "parent" / "study")
        InflightMarkers(StudyPaths(d)).start("run-0000", "run", {}, 1)
    finally:
        os.umask(old)
    assert stat.S_IMODE(d.stat().st_mode) == STUDY_DIR_MODE == 0o700
    assert stat.S_IMODE((d / "inflight").stat().st_mode) == 0o700
    assert (tmp_path / "parent").is_dir()  # a parent made on the way keeps the umask's mode


def test_an_existing_directory_is_left_as_it_is(tmp_path: Path) -> None:
    d = tmp_path / "mine"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    assert make_private_dir(d) == d
    assert stat.S_IMODE(d.stat().st_mode) == 0o755

