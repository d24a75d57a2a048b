"""The study lock with real processes: a second writer refused with the holder named, a waiter
queued behind it, a SIGKILLed holder and a stale heartbeat from another host taken over (logged),
re-entrant within a process but not across a fork, and the shared-filesystem check."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from infrarsi.errors import StudyLockedError, UserInputError
from infrarsi.study.lock import (
    StudyLock,
    filesystem_caveat,
    hold_study,
    read_holder,
    stale_reason,
)

ROOT = Path(__file__).resolve().parents[2]
HOLD = """
import sys, time
from infrarsi.study.lock import hold_study
with hold_study(sys.argv[1], sys.argv[2]):
    print("held", flush=True)
    sys.stdin.readline()  # released when the parent writes a line (or closes stdin)
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding ``tmp_path``'s study lock as ``run`` until its stdin gets a line."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path), "run"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def test_a_second_writer_is_refused_with_the_holder_and_the_fix(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    with pytest.raises(StudyLockedError) as info, hold_study(tmp_path, "verify"):
        pass
    msg = str(info.value)
    assert isinstance(info.value, UserInputError)  # the CLI exits 2
    assert str(tmp_path / "study.lock") in msg and "`run`" in msg
    assert f"host {socket.gethostname()}" in msg and f"pid {holder.pid}" in msg
    assert "since 20" in msg and "UTC" in msg and "--wait" in msg and f"kill {holder.pid}" in msg
    held = read_holder(tmp_path / "study.lock")
    assert held is not None and held.pid == holder.pid and held.stage == "run"


def test_a_waiter_queues_behind_the_holder_and_a_timeout_gives_up(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    with pytest.raises(StudyLockedError) as info:
        StudyLock(tmp_path / "study.lock", "verify").acquire(wait_s=0.3)
    assert "waited" in str(info.value)
    assert holder.stdin is not None
    holder.stdin.write("release\n")
    holder.stdin.flush()  # the holder releases while this one waits
    lock = StudyLock(tmp_path / "study.lock", "verify")
    lock.acquire(wait_s=math.inf)
    try:
        assert holder.wait(timeout=30) == 0  # it released: the waiter got it after, not beside it
        assert lock.took_over is None
        held = read_holder(tmp_path / "study.lock")
        assert held is not None and held.pid == os.getpid() and held.stage == "verify"
    finally:
        lock.release()
    assert not (tmp_path / "study.lock").exists()


def test_a_sigkilled_holder_is_taken_over_and_the_takeover_is_logged(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    with capture_logs() as logs, hold_study(tmp_path, "run") as lock:
        assert lock is not None and lock.took_over is not None
        assert lock.took_over.pid == holder.pid and lock.took_over.stage == "run"
    (event,) = [e for e in logs if e["event"] == "study_lock.taken_over"]
    assert event["old_pid"] == holder.pid and event["old_host"] == socket.gethostname()
    assert "gone on this host" in event["reason"]


def _foreign(path: Path, heartbeat_age_s: float) -> None:
    now = time.time()
    path.write_text(
        json.dumps(
            {
                "host": "another-host.example",
                "pid": 4242,
                "stage": "verify",
                "started_at": now - 7200,
                "heartbeat_at": now - heartbeat_age_s,
                "token": "f" * 32,
            }
        )
    )


def test_a_stale_heartbeat_from_another_host_is_taken_over_a_fresh_one_is_not(
    tmp_path: Path,
) -> None:
    lock_file = tmp_path / "study.lock"
    _foreign(lock_file, heartbeat_age_s=5.0)  # alive: its pid cannot be checked from here
    with pytest.raises(StudyLockedError) as info, hold_study(tmp_path, "run"):
        pass
    assert "another-host.example" in str(info.value) and "pid 4242" in str(info.value)
    _foreign(lock_file, heartbeat_age_s=3600.0)
    with capture_logs() as logs, hold_study(tmp_path, "run") as lock:
        assert lock is not None and lock.took_over is not None
        assert lock.took_over.host == "another-host.example"
    (event,) = [e for e in logs if e["event"] == "study_lock.taken_over"]
    assert event["old_host"] == "another-host.example" and event["old_stage"] == "verify"
    assert "heartbeat" in event["reason"]


def test_reentrant_within_a_process_but_not_in_a_forked_child(tmp_path: Path) -> None:
    with hold_study(tmp_path, "tune") as outer:
        with hold_study(tmp_path, "run") as inner:
            assert inner is outer  # tune's stages re-enter its holding
        held = read_holder(tmp_path / "study.lock")
        assert held is not None and held.stage == "tune"  # the inner exit released nothing
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child's outcome is its exit code
            try:
                with hold_study(tmp_path, "run"):
                    os._exit(0)
            except StudyLockedError:
                os._exit(3)
            os._exit(1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 3
    assert not (tmp_path / "study.lock").exists()


def test_the_heartbeat_refreshes_and_a_lock_taken_from_under_it_is_lost(tmp_path: Path) -> None:
    path = tmp_path / "study.lock"
    fast = StudyLock(path, "run", heartbeat_s=0.05)
    mine = fast.acquire()
    try:
        for _ in range(400):
            now = read_holder(path)
            if now is not None and now.heartbeat_at > mine.started_at:
                break
            time.sleep(0.05)
        assert now is not None and now.heartbeat_at > mine.started_at and now.token == mine.token
    finally:
        fast.release()
    assert not path.exists()
    slow = StudyLock(path, "run", heartbeat_s=3600.0)  # no beat of its own while this checks
    slow.acquire()
    try:
        _foreign(path, heartbeat_age_s=0.0)  # another process took it over
        assert slow.beat() is False and slow.lost
    finally:
        slow.release()
    held = read_holder(path)
    assert held is not None and held.host == "another-host.example"  # not removed by the loser


def test_stale_reason_rules(tmp_path: Path) -> None:
    lock = StudyLock(tmp_path / "study.lock", "run")
    me = lock.acquire()
    try:
        assert stale_reason(me) is None
        assert "heartbeat" in (stale_reason(me, now=me.heartbeat_at + 61.0) or "")
    finally:
        lock.release()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    gone = type(me)(**{**me.to_dict(), "pid": int(dead.stdout)})
    assert "gone" in (stale_reason(gone) or "")


MOUNTS = """\
/dev/sda1 / ext4 rw,relatime 0 0
srv:/export /shared nfs4 rw,vers=4.2,local_lock=none 0 0
srv:/old /old nfs rw,vers=3,nolock 0 0
"""


@pytest.mark.parametrize(
    ("path", "needle"),
    [
        ("/home/u/study", None),
        ("/shared/study", "shared or network"),
        ("/old/study", "flock is local to each machine"),
    ],
)
def test_filesystem_caveat_reads_the_mount(path: str, needle: str | None) -> None:
    caveat = filesystem_caveat(Path(path), mounts=MOUNTS)
    assert (caveat is None) if needle is None else (needle in (caveat or ""))


def test_an_unwritable_study_directory_says_so_instead_of_a_traceback(
    tmp_path: Path, make_unwritable
) -> None:
    from infrarsi.errors import LogError

    study = tmp_path / "s"
    study.mkdir()
    make_unwritable(study)
    with pytest.raises(LogError) as info, hold_study(study, "run"):
        pass
    msg = str(info.value)
    assert str(study / "study.lock") in msg and "not writable" in msg and "chmod -R u+w" in msg
