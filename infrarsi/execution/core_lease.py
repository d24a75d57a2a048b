"""``CoreLease``: physical CPU cores a rank of a timed trial holds alone on its node.

Ray reserves logical CPUs for each rank (``cluster.trial_resources``), but it does not pin
processes, so two trials on one node could run on the same physical cores and slow each other's
step times. A rank therefore takes a lease on ``n`` of the cores its process may use: one lock
file per core in a node-local directory (``lease_dir``: ``/tmp/infrarsi-cores-<uid>``, or
``$INFRARSI_CORE_LEASE_DIR``), each held with a non-blocking exclusive ``fcntl.flock``. With all
``n`` held it pins every thread of the process to them (``os.sched_setaffinity``); the rank's torch
thread count stays the ``threads_per_worker`` knob's. The lock dies with its file descriptor, so a
rank that crashes or is
killed frees its cores without any cleanup; ``release`` frees them earlier.

Acquisition never blocks: when fewer than ``n`` cores are free (more Ray CPUs declared than the
node has, or other Ray clusters on the same machine), or the platform has no
``sched_setaffinity`` / ``flock``, the rank runs unpinned and the lease says why
(``CoreLease.note``); the trial row records it (``extra.cpu_pinned``, ``extra.cpu_pin_note``).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LEASE_DIR_ENV = "INFRARSI_CORE_LEASE_DIR"
"""Environment variable that overrides the lock directory (tests; a node-local scratch disk)."""


def lease_dir() -> Path:
    """The node-local directory of the per-core lock files."""
    env = os.environ.get(LEASE_DIR_ENV)
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(env) if env else Path(f"/tmp/infrarsi-cores-{uid}")


@dataclass
class CoreLease:
    """The cores one process holds (or why it holds none)."""

    wanted: int
    """Cores asked for (the rank's Ray CPUs, rounded up)."""
    cores: tuple[int, ...] = ()
    """Cores held and pinned to, ascending; empty when unpinned."""
    note: str = ""
    """Why the process runs unpinned (empty when pinned)."""
    _fds: list[int] = field(default_factory=list, repr=False)
    """Open lock files, one per held core (closing one releases its flock)."""

    @property
    def pinned(self) -> bool:
        """Whether the process is pinned to cores it holds alone."""
        return bool(self.cores)

    def release(self) -> None:
        """Free the cores (the process keeps its affinity; idempotent)."""
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        self.cores = ()

    def record(self) -> dict[str, Any]:
        """What a rank reports about its cores: ``cpu_pinned``, ``cpu_cores``, ``cpu_pin_note``."""
        return {"cpu_pinned": self.pinned, "cpu_cores": list(self.cores), "cpu_pin_note": self.note}


def acquire(n: int, *, directory: Path | None = None, pin: bool = True) -> CoreLease:
    """Take ``n`` free cores of this process's affinity set without waiting, and (``pin``) pin
    every thread of the process to them; an unpinned lease (with its ``note``) when that cannot be
    done. Never raises on a busy or unsupported node."""
    n = max(1, int(n))
    lease = CoreLease(wanted=n)
    try:
        import fcntl
    except ImportError:
        lease.note = "fcntl.flock is not available on this platform"
        return lease
    if not (hasattr(os, "sched_getaffinity") and hasattr(os, "sched_setaffinity")):
        lease.note = "os.sched_setaffinity is not available on this platform"
        return lease
    allowed = sorted(os.sched_getaffinity(0))
    if n > len(allowed):
        lease.note = f"needs {n} cores, the process may use {len(allowed)} ({_ranges(allowed)})"
        return lease
    where = directory or lease_dir()
    try:
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        lease.note = f"cannot create the lock directory {where}: {e}"
        return lease
    held: list[tuple[int, int]] = []
    for core in allowed:
        if len(held) == n:
            break
        try:
            fd = os.open(where / f"core-{core}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held by another rank (BlockingIOError) or not lockable: next core
            os.close(fd)
            continue
        held.append((core, fd))
    lease._fds = [fd for _, fd in held]
    if len(held) < n:
        lease.release()
        lease.note = (
            f"only {len(held)} of the {n} cores wanted are free of {len(allowed)} "
            f"({_ranges(allowed)}; the others are held by other ranks on this node)"
        )
        return lease
    lease.cores = tuple(core for core, _ in held)
    if pin:
        try:
            pin_process(lease.cores)
        except OSError as e:
            lease.release()
            lease.note = f"os.sched_setaffinity failed: {e}"
    return lease


def pin_process(cores: tuple[int, ...]) -> None:
    """Pin every thread of this process to ``cores`` (threads started later inherit it). The thread
    count stays the caller's: a trial's ``threads_per_worker`` is a knob (more threads than cores
    held share those cores, never another trial's)."""
    ids = [0]
    with contextlib.suppress(OSError):
        ids = [int(t) for t in os.listdir("/proc/self/task")]
    for tid in ids:
        try:
            os.sched_setaffinity(tid, cores)
        except ProcessLookupError:  # the thread ended meanwhile
            continue


def _ranges(cores: list[int]) -> str:
    """``0-3,6`` for [0, 1, 2, 3, 6]."""
    out: list[str] = []
    for c in cores:
        if out and c == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)
