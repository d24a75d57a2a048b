"""A trial group: N ``TrainWorker`` actors in one placement group, rendezvoused into one process group.

``TrialGroup`` rendezvouses its actors into a ``torch.distributed`` process group and runs
trials on them with a deadline.

- On one node: one bundle per rank, ``{"CPU": cpus_per_worker}`` plus ``{"GPU":
  devices_per_worker}`` on cuda, ``STRICT_PACK``. Across ``nodes``: one bundle per node holding its
  ranks' share, ``STRICT_SPREAD``, so the group spans exactly ``nodes`` nodes.
- The placement group is the group's own, or one reserved for it by Ray Tune (a trial's
  ``PlacementGroupFactory``: ``placement_group=``), which the group uses and never removes.
- Rendezvous at rank 0's node IP on a port rank 0 found free.
- ``run`` waits with ``ray.wait`` until every rank answered or the deadline passed. Once one rank
  reported a failure, the others get a short grace period (they should exit cleanly on their own;
  one left behind would hang in a collective), then the group is killed.
- ``kill`` always releases the actors and the placement group; ``shutdown`` first destroys the
  process groups. Both are idempotent.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from infrarsi.errors import TrialError
from infrarsi.execution.worker import DEFAULT_ENTRY, TrainWorker, failed_rank_result
from infrarsi.structlog_config import get_logger
from infrarsi.workload import ResourcesSpec

log = get_logger(__name__)

PROCESS_GROUP_TIMEOUT_S = 1800.0
"""torch.distributed timeout (rendezvous and collectives); the trial deadline kills sooner."""
FAILURE_GRACE_S = 20.0
"""After one rank failed, how long the others may take to return before the group is killed."""


@dataclass
class GroupSpec:
    """Shape of a trial group: what the placement group reserves and how workers start."""

    workers: int
    """Number of ranks (one actor each)."""
    nodes: int = 1
    """Nodes requested: 1 packs the bundles, more spreads them."""
    cpus_per_worker: float = 1.0
    """CPU cores reserved per bundle."""
    devices_per_worker: int = 1
    """GPUs per bundle on cuda (ignored on cpu)."""
    device: str = "cpu"
    """``cpu`` (gloo) or ``cuda`` (nccl)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables set in each worker before torch is imported."""
    threads: int = 1
    """``torch.set_num_threads`` in each worker at start (the ``threads_per_worker`` knob; a pinned
    rank's threads share the cores it holds)."""
    pin_cores: bool = True
    """Each rank leases ``ceil(cpus_per_worker)`` cores of its node alone and pins itself to them
    (``core_lease``; unpinned, with the reason in ``TrialGroup.infos``, when they are not free)."""

    @classmethod
    def from_resources(
        cls, res: ResourcesSpec, env: dict[str, str] | None = None, threads: int = 1
    ) -> GroupSpec:
        return cls(
            workers=res.workers,
            nodes=res.nodes,
            cpus_per_worker=float(res.cpus_per_worker),
            devices_per_worker=res.devices_per_worker,
            device=res.device,
            env=dict(env or {}),
            threads=threads,
        )

    @property
    def world_size(self) -> int:
        return self.workers

    @property
    def devices(self) -> int:
        """Devices the group holds (for ``device_seconds``)."""
        return self.workers * (self.devices_per_worker if self.device == "cuda" else 1)

    @property
    def workers_per_node(self) -> int:
        """Ranks on each node (``workers`` splits evenly over ``nodes``)."""
        return max(1, self.workers // max(1, self.nodes))

    def rank_resources(self) -> dict[str, float]:
        """What one rank reserves: its CPU cores, and its GPUs on cuda."""
        res: dict[str, float] = {"CPU": float(self.cpus_per_worker)}
        if self.device == "cuda":
            res["GPU"] = float(self.devices_per_worker)
        return res

    def bundles(self) -> list[dict[str, float]]:
        """The placement group's bundles: one per rank on one node; one per node (its ranks'
        resources together) when the group spans nodes."""
        per_rank = self.rank_resources()
        if self.nodes <= 1:
            return [dict(per_rank) for _ in range(self.workers)]
        return [
            {k: v * self.workers_per_node for k, v in per_rank.items()} for _ in range(self.nodes)
        ]

    @property
    def strategy(self) -> str:
        """``STRICT_PACK`` (every rank on one node) or ``STRICT_SPREAD`` (each node bundle on its
        own node): the workload's ``nodes`` is what the group gets, never fewer or more."""
        return "STRICT_PACK" if self.nodes <= 1 else "STRICT_SPREAD"

    def bundle_of(self, rank: int) -> int:
        """The bundle index rank ``rank`` is scheduled in."""
        return rank if self.nodes <= 1 else rank // self.workers_per_node


@dataclass
class GroupRun:
    """What the ranks of one trial returned."""

    rank_results: list[dict[str, Any] | None]
    """One RankResult dict per rank; None for a rank that never answered."""
    timed_out: bool
    """True when the deadline passed with ranks still running (the group was killed)."""
    wall_s: float
    """Seconds from submitting the trial to the last answer (or the kill)."""


class TrialGroup:
    """A started set of rank actors; create with ``TrialGroup(spec).start()``."""

    def __init__(
        self, spec: GroupSpec, *, start_timeout_s: float = 180.0, placement_group: Any = None
    ) -> None:
        self.spec = spec
        """The group's shape."""
        self.external_pg = placement_group
        """A placement group reserved by someone else (a Ray Tune trial's, with ``spec.bundles()``
        as its bundles); the group schedules its ranks there and never removes it. None: the
        group reserves its own and removes it on ``kill``."""
        self.start_timeout_s = start_timeout_s
        """How long the placement group, the actors and the rendezvous may take."""
        self.actors: list[Any] = []
        """Actor handles, index = rank."""
        self.infos: list[dict[str, Any]] = []
        """``TrainWorker.info()`` per rank (node id, ip, pid, actor id)."""
        self.start_time_s: float | None = None
        """Seconds ``start`` took (placement group + actors + process group)."""
        self.trials_run = 0
        """Trials this group has run (more than one when the pool keeps it warm)."""
        self._pg: Any = None
        self._pg_id: str | None = None
        self.alive = False
        """True between a successful ``start`` and ``kill``/``shutdown``."""

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> TrialGroup:
        """Reserve the bundles, start the actors, and rendezvous. Cleans up and raises on failure."""
        t0 = time.perf_counter()
        try:
            self._start()
        except BaseException:
            self.kill()
            raise
        self.start_time_s = time.perf_counter() - t0
        self.alive = True
        log.debug(
            "group started",
            workers=self.spec.workers,
            start_time_s=round(self.start_time_s, 2),
            pids=self.pids,
        )
        return self

    def _start(self) -> None:
        spec = self.spec
        strategy = spec.strategy
        if self.external_pg is not None:
            pg = self.external_pg
        else:
            pg = self._pg = placement_group(spec.bundles(), strategy=strategy)
        self._pg_id = pg.id.hex()
        try:
            ray.get(pg.ready(), timeout=self.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise TrialError(
                f"the placement group of {len(spec.bundles())} bundles {spec.bundles()[0]} ({strategy}) "
                f"was not scheduled within {self.start_timeout_s:.0f}s; cluster resources available: "
                f"{ray.available_resources()}. Free resources or lower resources.workers/nodes/cpus_per_worker."
            ) from None
        cls = ray.remote(TrainWorker)
        for rank in range(spec.workers):
            self.actors.append(
                cls.options(
                    num_cpus=spec.cpus_per_worker,
                    num_gpus=spec.devices_per_worker if spec.device == "cuda" else 0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=pg, placement_group_bundle_index=spec.bundle_of(rank)
                    ),
                    max_restarts=0,
                ).remote(
                    rank,
                    spec.workers,
                    spec.device,
                    spec.env,
                    spec.threads,
                    math.ceil(spec.cpus_per_worker) if spec.pin_cores else 0,
                )
            )
        self.infos = self._get([a.info.remote() for a in self.actors], "start the worker actors")
        port = self._get([self.actors[0].free_port.remote()], "find a free port on rank 0")[0]
        addr = self.infos[0]["ip"]
        by_node: dict[str, list[int]] = {}
        for info in self.infos:
            by_node.setdefault(info["node_id"], []).append(info["rank"])
        refs = []
        for rank, actor in enumerate(self.actors):
            peers = by_node[self.infos[rank]["node_id"]]
            refs.append(
                actor.init_process_group.remote(
                    addr, port, peers.index(rank), len(peers), PROCESS_GROUP_TIMEOUT_S
                )
            )
        self._get(refs, f"rendezvous at {addr}:{port}")

    def _get(self, refs: list[Any], what: str) -> list[Any]:
        try:
            return list(ray.get(refs, timeout=self.start_timeout_s))
        except ray.exceptions.GetTimeoutError:
            raise TrialError(
                f"trial group: could not {what} within {self.start_timeout_s:.0f}s."
            ) from None
        except ray.exceptions.RayError as e:
            raise TrialError(f"trial group: could not {what}: {e}") from e

    def kill(self) -> None:
        """Kill every actor and remove the placement group (idempotent, never raises)."""
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as e:  # already dead
                log.debug("kill actor failed", error=str(e))
        self.actors = []
        if self._pg is not None:
            try:
                remove_placement_group(self._pg)
            except Exception as e:
                log.debug("remove placement group failed", error=str(e))
            self._pg = None
        self.alive = False

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Destroy the process groups, then kill (used when a healthy group is retired)."""
        if self.actors and self.alive:
            try:
                ray.get([a.shutdown.remote() for a in self.actors], timeout=timeout_s)
            except Exception as e:
                log.debug("graceful shutdown failed", error=str(e))
        self.kill()

    # ----------------------------------------------------------------- trials
    @property
    def pids(self) -> list[int]:
        return [int(i["pid"]) for i in self.infos]

    @property
    def actor_ids(self) -> list[str]:
        return [str(i["actor_id"]) for i in self.infos]

    @property
    def node_ids(self) -> list[str]:
        return [str(i["node_id"]) for i in self.infos]

    @property
    def cpu_pinned(self) -> bool:
        """Whether every rank holds its CPU cores alone and is pinned to them (``core_lease``)."""
        return bool(self.infos) and all(bool(i.get("cpu_pinned")) for i in self.infos)

    @property
    def cpu_pin_note(self) -> str:
        """Why ranks run unpinned (``rank N: reason``, one per unpinned rank; empty when all are pinned)."""
        return "; ".join(
            f"rank {i['rank']}: {i.get('cpu_pin_note') or 'unpinned'}"
            for i in self.infos
            if not i.get("cpu_pinned")
        )

    @property
    def placement_group_id(self) -> str | None:
        """Hex id of the group's placement group (kept after it was removed)."""
        return self._pg_id

    def probe_peak_flops(self, timeout_s: float = 120.0) -> float | None:
        """Peak FLOP/s of one device, measured on rank 0 (None if no probe is available)."""
        if not self.alive:
            raise TrialError("trial group: probe_peak_flops on a group that is not started.")
        value = ray.get(self.actors[0].probe_peak_flops.remote(), timeout=timeout_s)
        return float(value) if value else None

    def run(
        self, spec: dict[str, Any], *, timeout_s: float, entry: str = DEFAULT_ENTRY
    ) -> GroupRun:
        """Run one trial on every rank. Kills the group if the deadline passes."""
        if not self.alive:
            raise TrialError("trial group: run on a group that is not started (or was killed).")
        self.trials_run += 1
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        refs = {a.run.remote(spec, entry): rank for rank, a in enumerate(self.actors)}
        results: list[dict[str, Any] | None] = [None] * len(self.actors)
        pending = list(refs)
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready, pending = ray.wait(pending, num_returns=1, timeout=remaining)
            for ref in ready:
                rank = refs[ref]
                try:
                    results[rank] = dict(ray.get(ref))
                except ray.exceptions.RayError as e:  # the actor died (e.g. killed by the kernel)
                    results[rank] = failed_rank_result(rank, "failed", f"rank {rank} died: {e}")
                if results[rank].get("status", "failed") != "ok":  # type: ignore[union-attr]
                    deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
        timed_out = bool(pending)
        if timed_out:
            log.warning(
                "trial deadline passed; killing the group",
                pending_ranks=sorted(refs[r] for r in pending),
                timeout_s=timeout_s,
            )
            self.kill()
        return GroupRun(rank_results=results, timed_out=timed_out, wall_s=time.monotonic() - t0)
