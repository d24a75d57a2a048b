"""Core leases: real flocks in a temp directory, real processes holding and dying with them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from infrarsi.execution import core_lease
from infrarsi.execution.core_lease import acquire, lease_dir

ALLOWED = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
needs_affinity = pytest.mark.skipif(not ALLOWED, reason="os.sched_getaffinity is Linux-only")


@pytest.fixture(autouse=True)
def _keep_affinity():
    """Tests pin this process: give it its cores back afterwards."""
    yield
    if ALLOWED:
        core_lease.pin_process(tuple(ALLOWED))


def _holder(directory: Path, n: int) -> subprocess.Popen[str]:
    """A process that takes ``n`` cores, prints them and waits for a line on stdin."""
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from infrarsi.execution.core_lease import acquire
        lease = acquire({n}, directory=Path({str(directory)!r}), pin=False)
        print(",".join(map(str, lease.cores)) or "none:" + lease.note, flush=True)
        sys.stdin.readline()
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


@needs_affinity
def test_a_lease_pins_the_process_to_the_cores_it_holds_and_release_frees_them(tmp_path):
    lease = acquire(1, directory=tmp_path)
    assert lease.pinned and len(lease.cores) == 1 and lease.note == ""
    assert os.sched_getaffinity(0) == set(lease.cores)
    assert lease.record() == {
        "cpu_pinned": True,
        "cpu_cores": list(lease.cores),
        "cpu_pin_note": "",
    }
    held = lease.cores
    lease.release()
    assert lease.cores == () and not lease.pinned
    again = acquire(1, directory=tmp_path, pin=False)
    assert again.cores == held  # the same core is free again
    again.release()


@needs_affinity
def test_two_leases_never_share_a_core_and_a_busy_node_runs_unpinned_without_waiting(tmp_path):
    first = acquire(len(ALLOWED), directory=tmp_path, pin=False)  # every core this process may use
    assert sorted(first.cores) == ALLOWED
    second = acquire(
        1, directory=tmp_path, pin=False
    )  # flocks are per open file: this one conflicts too
    assert not second.pinned and "0 of the 1 cores wanted are free" in second.note
    assert second.record()["cpu_pinned"] is False
    first.release()
    third = acquire(1, directory=tmp_path, pin=False)
    assert third.cores == (ALLOWED[0],)
    third.release()


@needs_affinity
def test_more_cores_than_the_process_may_use_run_unpinned_and_say_so(tmp_path):
    lease = acquire(len(ALLOWED) + 1, directory=tmp_path)
    assert not lease.pinned and lease.cores == ()
    assert f"needs {len(ALLOWED) + 1} cores, the process may use {len(ALLOWED)}" in lease.note
    assert os.sched_getaffinity(0) == set(ALLOWED)  # not pinned
    assert list(tmp_path.iterdir()) == []  # nothing was locked


@needs_affinity
def test_a_process_holds_its_cores_until_it_dies_and_its_death_frees_them(tmp_path):
    p = _holder(tmp_path, 1)
    try:
        held = p.stdout.readline().strip()  # type: ignore[union-attr]
        assert held == str(ALLOWED[0])
        other = acquire(len(ALLOWED), directory=tmp_path, pin=False)
        assert not other.pinned  # one core is the other process's
        mine = acquire(1, directory=tmp_path, pin=False)
        assert mine.cores != (ALLOWED[0],) and (mine.pinned or len(ALLOWED) == 1)
        mine.release()
    finally:
        p.kill()  # no release: the kernel drops the flock with the process
        p.wait()
    after = acquire(len(ALLOWED), directory=tmp_path, pin=False)
    assert sorted(after.cores) == ALLOWED
    after.release()


def test_the_lock_directory_is_per_user_unless_overridden(monkeypatch, tmp_path):
    monkeypatch.delenv(core_lease.LEASE_DIR_ENV, raising=False)
    assert lease_dir().name == f"infrarsi-cores-{os.getuid()}"
    monkeypatch.setenv(core_lease.LEASE_DIR_ENV, str(tmp_path))
    assert lease_dir() == tmp_path


def test_without_sched_setaffinity_the_rank_runs_unpinned_and_says_why(monkeypatch, tmp_path):
    monkeypatch.delattr(os, "sched_setaffinity", raising=False)
    lease = acquire(1, directory=tmp_path)
    assert not lease.pinned and "sched_setaffinity is not available" in lease.note


def test_core_ranges_are_written_compactly():
    assert core_lease._ranges([0, 1, 2, 3, 6, 8, 9]) == "0-3,6,8-9"
