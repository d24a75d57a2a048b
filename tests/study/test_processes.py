"""Liveness of a recorded pid, with real processes: alive, reaped, a zombie, and when it started."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from infrarsi.study.processes import pid_alive, process_started_at


def test_a_live_a_reaped_and_a_zombie_process() -> None:
    assert pid_alive(os.getpid())
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    assert not pid_alive(int(done.stdout))  # exited and reaped
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    for _ in range(200):  # until it has exited but is not reaped yet: a zombie
        if Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z":
            break
        time.sleep(0.05)
    assert not pid_alive(child.pid)
    child.wait()


def test_a_process_start_time_is_before_now_and_after_its_parent() -> None:
    mine = process_started_at(os.getpid())
    assert mine is not None and mine <= time.time()
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        theirs = process_started_at(child.pid)
        assert theirs is not None and theirs >= mine
    finally:
        child.communicate()
