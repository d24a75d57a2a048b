"""Processes on this host, as the study's liveness checks see them (``/proc`` where there is one).

The study lock (``infrarsi.study.lock``) and the in-flight markers (``infrarsi.study.paths``)
judge a recorded pid dead when it no longer exists, is a zombie, or now names a younger process.
"""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"  # a zombie holds nothing


def process_started_at(pid: int) -> float | None:
    """When process ``pid`` started (Unix seconds, from /proc), or None where /proc cannot say."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
        ticks = int(fields[19])  # field 22 of stat: start time in clock ticks after boot
        btime = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


__all__ = ["pid_alive", "process_started_at"]
