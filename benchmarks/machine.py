"""Facts about the machine a benchmark ran on, written into its results."""

from __future__ import annotations

import platform
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def git_state() -> tuple[str, bool]:
    """(short HEAD sha, dirty tracked files) of this repository; ("unknown", False) outside git."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False
    return sha, dirty


def alive_pids(pids: list[int]) -> list[int]:
    """The processes of ``pids`` still running (zombies count as gone)."""
    import psutil

    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(pids: list[int], timeout_s: float = 120.0) -> list[int]:
    """Wait up to ``timeout_s`` for ``pids`` to exit; the ones still running."""
    end = time.monotonic() + timeout_s
    while alive_pids(pids) and time.monotonic() < end:
        time.sleep(0.5)
    return alive_pids(pids)
