"""What a Ray cluster can hold: trial slots, the pre-flight check, and a Tune trial's resources.

A trial group needs ``GroupSpec.bundles()`` placed with ``GroupSpec.strategy``: on one node, every
rank's CPUs (and GPUs) on that node; across ``nodes``, one node bundle on each of that many
distinct nodes. ``trial_slots`` counts how many such groups the cluster's nodes hold at once (the
``run`` stage's default concurrency); ``require_slots`` turns zero into a ``ClusterError``
(exit 2) that says what one trial needs and what each node has, before any trial starts.
``trial_resources`` is the ``PlacementGroupFactory`` a Ray Tune trial reserves: an empty head
bundle (the trainable takes nothing) and the group's bundles, so Tune runs as many trials at
once as the cluster holds and each trial's ranks run in its reservation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from infrarsi.errors import ClusterError
from infrarsi.execution.group import GroupSpec


@dataclass(frozen=True)
class NodeResources:
    """One alive Ray node and its total resources."""

    node_id: str
    """Ray's hex node id."""
    resources: dict[str, float] = field(default_factory=dict)
    """Total resources of the node (``CPU``, ``GPU``, custom ones), as Ray reports them."""

    def fits(self, bundle: dict[str, float]) -> int:
        """How many copies of ``bundle`` the node holds."""
        counts = [
            math.floor(self.resources.get(k, 0.0) / v + 1e-9) for k, v in bundle.items() if v > 0
        ]
        return min(counts) if counts else 0


def alive_nodes() -> list[NodeResources]:
    """The alive nodes of the connected Ray cluster."""
    import ray

    return [
        NodeResources(
            node_id=str(n["NodeID"]),
            resources={k: float(v) for k, v in n.get("Resources", {}).items()},
        )
        for n in ray.nodes()
        if n.get("Alive")
    ]


def trial_slots(spec: GroupSpec, nodes: list[NodeResources]) -> int:
    """How many trial groups of shape ``spec`` the nodes hold at once."""
    bundles = spec.bundles()
    if spec.nodes <= 1:  # STRICT_PACK: every rank's bundle on one node
        whole = {k: v * len(bundles) for k, v in bundles[0].items()}
        return sum(n.fits(whole) for n in nodes)
    per_node = [n.fits(bundles[0]) for n in nodes]  # STRICT_SPREAD: one node bundle per node
    groups = 0
    while sum(min(f, groups + 1) for f in per_node) >= (groups + 1) * spec.nodes:
        groups += 1
    return groups


def require_slots(spec: GroupSpec, nodes: list[NodeResources], *, source: str) -> int:
    """``trial_slots``, or a ``ClusterError`` naming what one trial needs when the cluster holds none."""
    slots = trial_slots(spec, nodes)
    if slots > 0:
        return slots
    need = (
        f"{spec.workers} rank(s) on one node, {spec.rank_resources()} each"
        if spec.nodes <= 1
        else f"{spec.nodes} distinct nodes with {spec.bundles()[0]} each ({spec.workers_per_node} rank(s) per node)"
    )
    have = (
        "; ".join(f"node {n.node_id[:8]}: {_brief(n.resources)}" for n in nodes) or "no alive node"
    )
    raise ClusterError(
        f"{source}: field `resources`: rule: the Ray cluster must hold one trial: {need}. The cluster "
        f"has {have}. Fix: connect to a cluster that has them (--address, or `ray start` with "
        f"--num-cpus/--num-gpus on each node), or lower resources.workers, nodes, cpus_per_worker or "
        f"devices_per_worker (a new study: the contract is frozen)."
    )


def trial_resources(spec: GroupSpec) -> Any:
    """The ``PlacementGroupFactory`` of one Ray Tune trial: an empty head bundle for the
    trainable, then the group's bundles with its strategy (``TrialGroup`` schedules rank ``r`` in
    bundle ``spec.bundle_of(r)`` of the trial's placement group)."""
    from ray.tune import PlacementGroupFactory

    return PlacementGroupFactory([{}, *spec.bundles()], strategy=spec.strategy)


def _brief(resources: dict[str, float]) -> str:
    keep = {
        k: v
        for k, v in resources.items()
        if k in ("CPU", "GPU")
        or not (
            k.startswith("node:")
            or k in ("memory", "object_store_memory")
            or k.startswith("accelerator_type")
        )
    }
    return ", ".join(f"{v:g} {k}" for k, v in sorted(keep.items())) or "nothing"
