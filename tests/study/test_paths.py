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


ALLOCATE = """
import sys
from pathlib import Path
from infrarsi.study.paths import TrialIds
ids = TrialIds([], reserve_dir=Path(sys.argv[1]))
print(" ".join(ids.new("run") for _ in range(int(sys.argv[2]))))
"""


def test_two_writers_that_both_got_in_never_share_a_trial_id(tmp_path: Path) -> None:
    """Two processes allocate run ids from the same stale view of the log (both saw run-0000, as
    two writers on a filesystem where the study lock does not hold would): the exclusive
    reservation in DIR/ids hands each id to exactly one of them."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    reserve = StudyPaths(tmp_path).trial_ids
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", ALLOCATE, str(reserve), "40"],
            stdout=subprocess.PIPE,
            text=True,
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
        for _ in range(2)
    ]
    mine = TrialIds(["run-0000"], reserve_dir=reserve)
    here = [mine.new("run") for _ in range(40)]
    theirs = [p.communicate(timeout=120)[0].split() for p in procs]
    every = here + theirs[0] + theirs[1]
    assert len(every) == 120 and len(set(every)) == 120, sorted(every)
    assert sorted(p.name for p in reserve.iterdir()) == sorted(every)


def test_a_marker_is_live_elsewhere_only_while_fresh_and_its_writer_may_be_alive(
    tmp_path: Path,
) -> None:
    import socket
    import subprocess
    import sys
    import time

    now = time.time()
    dead = int(
        subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
        ).stdout
    )
    live = InflightMarkers.live_elsewhere
    assert live({"host": "other-host", "pid": 1, "last_alive_at": now - 1}, now)
    assert not live(
        {"host": "other-host", "pid": 1, "last_alive_at": now - 60}, now
    )  # stale heartbeat
    assert not live({"pid": 1, "last_alive_at": now}, now)  # an older marker: no host, as before
    here = socket.gethostname()
    assert not live({"host": here, "pid": dead, "last_alive_at": now}, now)  # its process is gone
    assert not live(
        {"host": here, "pid": os.getpid(), "last_alive_at": now}, now
    )  # a closed executor of ours
    assert live({"host": here, "pid": os.getppid(), "last_alive_at": now}, now)


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


def test_a_marker_in_an_unwritable_study_is_a_log_error_naming_the_file(
    tmp_path: Path, make_unwritable
) -> None:
    from infrarsi.errors import LogError

    m = InflightMarkers(StudyPaths(tmp_path))
    m.start("run-0000", "run", {}, 2)
    make_unwritable(tmp_path / "inflight")
    with pytest.raises(LogError) as info:
        m.start("run-0001", "run", {}, 2)
    assert str(tmp_path / "inflight" / "run-0001.json") in str(info.value)
    assert "not writable" in str(info.value)
    assert [x["trial_id"] for x in m.leftovers()] == ["run-0000"]


def test_a_marker_is_touched_while_its_trial_runs_and_not_after(
    tmp_path: Path, monkeypatch
) -> None:
    """The heartbeat: a leftover marker's ``last_alive_at`` (its mtime) moves on while the trial
    is in flight, so an interrupted row can count the device time up to it."""
    import time

    from infrarsi.study import paths

    monkeypatch.setattr(paths, "HEARTBEAT_S", 0.05)
    m = InflightMarkers(StudyPaths(tmp_path))
    m.start("run-0000", "run", {}, 2)
    (left,) = m.leftovers()
    end = time.monotonic() + 30
    while left["last_alive_at"] <= left["started_at"] and time.monotonic() < end:
        time.sleep(0.05)
        (left,) = m.leftovers()
    assert left["last_alive_at"] > left["started_at"]
    m.ended("run-0000")  # devices released, row not logged yet: the marker stays, untouched
    (stopped,) = m.leftovers()
    time.sleep(10 * paths.HEARTBEAT_S)
    (still,) = m.leftovers()
    assert still["last_alive_at"] == stopped["last_alive_at"]
    m.done("run-0000")
    assert m.leftovers() == [] and m._beats == {}


def test_every_study_file_is_named_by_study_paths() -> None:
    """The layout the module docstring lists, named in one place (no module spells a name)."""
    p = StudyPaths(Path("/s"))
    names = {
        p.contract: "contract.yaml",
        p.frozen_contract: ".contract.frozen.json",
        p.search_space: "search_space.yaml",
        p.doctor: "doctor.json",
        p.trials: "trials",
        p.inflight: "inflight",
        p.trial_ids: "ids",
        p.lock: "study.lock",
        p.proposals: "proposals",
        p.proposals_queued: "proposals/queued",
        p.proposals_taken: "proposals/taken",
        p.proposal_patches: "proposals/patches",
        p.proposals_lock: "proposals/queue.lock",
        p.optimizer_state: "optimizer.json",
        p.bank_warm_start: "bank_warm_start.json",
        p.verify: "verify.json",
        p.long_check: "long_check.json",
        p.apply_record: "apply.json",
        p.report_md: "report.md",
        p.report_html: "report.html",
        p.report_files: "report_files",
        p.logs: "logs",
        p.study_log: "logs/infrarsi.jsonl",
    }
    for path, name in names.items():
        assert path == Path("/s") / name
