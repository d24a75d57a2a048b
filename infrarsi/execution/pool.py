"""Warm worker pool: one trial group kept alive across the trials of a study.

Imports (torch, DeepSpeed), process start and the rendezvous are paid once; each trial rebuilds
its engine inside the same processes (measured here: the first DeepSpeed engine in a process cost
3.7 s, later ones 0.35-1.5 s). A group is *recycled* (killed, and a fresh one started for the
next trial) when:

- its last trial ended in ``oom``, ``failed``, ``nan`` or ``timeout`` (the process may hold
  leaked memory, a poisoned allocator, a broken communicator or a hung collective);
- the next trial needs another environment (env-var knobs are read at process start);
- its last trial left more than ``LEFTOVER_RECYCLE_BYTES`` allocated on a rank's GPU after its
  cleanup: the next trial would start with that memory taken, so its peak (and an ``oom``) would be
  wrong (DeepSpeed ZeRO-3 engines leave their model states behind after ``destroy()``).

A trial in another code directory (a patched worktree) reuses the group: the rank loop imports
the ``workloads`` package afresh from the trial's ``code_dir`` on every trial, so interleaved
baseline/patched verify trials do not pay a cold start each.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from infrarsi.execution.group import GroupSpec, TrialGroup
from infrarsi.structlog_config import get_logger

log = get_logger(__name__)

RECYCLE_STATUSES = frozenset({"oom", "failed", "nan", "timeout", "invariant_violation"})
"""Trial statuses after which the group's processes are not reused."""

LEFTOVER_RECYCLE_BYTES = 256 * 2**20
"""A group whose last trial left more device memory than this allocated on a rank (after its
cleanup) is recycled: 256 MiB, far below a model's states, far above PyTorch's own small caches."""


@dataclass
class PoolStats:
    """Counters of a pool's life, for benchmarks and tests."""

    groups_started: int = 0
    """Trial groups started (cold starts)."""
    warm_acquires: int = 0
    """Trials that reused a live group."""
    recycles: int = 0
    """Groups killed because of a trial status or a changed environment."""
    start_times_s: list[float] = field(default_factory=list)
    """Seconds each group start took."""


class WorkerPool:
    """Hands out a started ``TrialGroup`` for each trial, reusing the last one when it is healthy."""

    def __init__(
        self,
        base: GroupSpec,
        *,
        start_timeout_s: float = 180.0,
        warm: bool = True,
        placement_group: Any = None,
    ) -> None:
        self.base = base
        """Shape of the groups (workers, bundles, device); env/threads come per acquire."""
        self.placement_group = placement_group
        """Where the groups run: a placement group reserved for this pool (a Ray Tune trial's),
        or None for a group that reserves its own."""
        self.start_timeout_s = start_timeout_s
        """Passed to ``TrialGroup``."""
        self.warm = warm
        """False: every trial gets a fresh group (the cold baseline of the overhead benchmark)."""
        self.stats = PoolStats()
        """What the pool did so far."""
        self._group: TrialGroup | None = None
        self._key: tuple[Any, ...] | None = None

    @property
    def group(self) -> TrialGroup | None:
        """The live group, if any."""
        return self._group if self._group is not None and self._group.alive else None

    def acquire(
        self, env: dict[str, str] | None = None, code_dir: str | None = None, threads: int = 1
    ) -> tuple[TrialGroup, bool]:
        """A started group for the next trial, and whether it was warm (reused).

        ``code_dir`` is accepted for the record; it does not force a new group (see module doc).
        """
        env = {k: str(v) for k, v in (env or {}).items()}
        key = (tuple(sorted(env.items())), int(threads))
        if self.group is not None and self._key == key:
            self.stats.warm_acquires += 1
            return self._group, True  # type: ignore[return-value]
        if self.group is not None:
            log.info("recycling worker group: the environment changed")
            self.stats.recycles += 1
            self._retire()
        spec = GroupSpec(**{**self.base.__dict__, "env": env, "threads": int(threads)})
        group = TrialGroup(
            spec, start_timeout_s=self.start_timeout_s, placement_group=self.placement_group
        ).start()
        self.stats.groups_started += 1
        self.stats.start_times_s.append(group.start_time_s or 0.0)
        self._group, self._key = group, key
        return group, False

    def release(self, group: TrialGroup, status: str, *, leftover_bytes: int | None = None) -> None:
        """Return a group after a trial; recycles it after a bad status, when the trial left more
        than ``LEFTOVER_RECYCLE_BYTES`` of device memory allocated (``leftover_bytes``, the max over
        ranks), or always when not warm."""
        if group is not self._group:
            group.kill()
            return
        leaked = leftover_bytes is not None and leftover_bytes > LEFTOVER_RECYCLE_BYTES
        if status in RECYCLE_STATUSES or leaked or not group.alive:
            if group.alive and leaked and status not in RECYCLE_STATUSES:
                log.info(
                    "recycling worker group: the trial left device memory allocated",
                    leftover_bytes=leftover_bytes,
                )
            elif group.alive:
                log.info("recycling worker group after trial status", status=status)
            self.stats.recycles += 1
            group.kill()
            self._group, self._key = None, None
        elif not self.warm:
            self._retire()

    def _retire(self) -> None:
        if self._group is not None:
            t0 = time.perf_counter()
            self._group.shutdown()
            log.debug("group retired", seconds=round(time.perf_counter() - t0, 2))
        self._group, self._key = None, None

    def close(self) -> None:
        """Release every actor and placement group of the pool (idempotent)."""
        self._retire()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
