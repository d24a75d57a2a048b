"""What a cluster holds: trial slots, the pre-flight ClusterError, a Tune trial's resources."""

from __future__ import annotations

import pytest

from infrarsi.errors import ClusterError, UserInputError
from infrarsi.execution.cluster import NodeResources, require_slots, trial_resources, trial_slots
from infrarsi.execution.group import GroupSpec


def _nodes(*cpus_gpus: tuple[float, float]) -> list[NodeResources]:
    return [
        NodeResources(node_id=f"{i:02d}" * 4, resources={"CPU": c, "GPU": g, "memory": 1e9})
        for i, (c, g) in enumerate(cpus_gpus)
    ]


def test_one_node_trials_pack_each_on_a_node_that_holds_all_its_ranks() -> None:
    spec = GroupSpec(workers=2, cpus_per_worker=1)
    assert trial_slots(spec, _nodes((2, 0))) == 1
    assert (
        trial_slots(spec, _nodes((4, 0), (3, 0), (1, 0))) == 3
    )  # 2 + 1 + 0: a rank never leaves its trial's node
    gpu = GroupSpec(workers=8, cpus_per_worker=4, device="cuda")
    assert trial_slots(gpu, _nodes((64, 8), (64, 8), (64, 8), (64, 8))) == 4
    assert trial_slots(gpu, _nodes((64, 4), (64, 4))) == 0  # 8 GPUs in all, never 8 on one node


def test_multi_node_trials_need_that_many_distinct_nodes() -> None:
    spec = GroupSpec(workers=16, nodes=2, cpus_per_worker=4, device="cuda")
    assert spec.bundles() == [{"CPU": 32.0, "GPU": 8.0}] * 2 and spec.strategy == "STRICT_SPREAD"
    assert [spec.bundle_of(r) for r in (0, 7, 8, 15)] == [0, 0, 1, 1]
    assert trial_slots(spec, _nodes(*[(64, 8)] * 4)) == 2
    assert trial_slots(spec, _nodes(*[(64, 8)] * 5)) == 2
    assert trial_slots(spec, _nodes((128, 16))) == 0  # one big node never hosts both node bundles
    assert trial_slots(spec, _nodes((128, 16), (64, 8))) == 1


def test_one_node_groups_bundle_per_rank_strictly_packed() -> None:
    spec = GroupSpec(workers=2, cpus_per_worker=1.5)
    assert spec.bundles() == [{"CPU": 1.5}, {"CPU": 1.5}] and spec.strategy == "STRICT_PACK"
    assert [spec.bundle_of(r) for r in range(2)] == [0, 1]


def test_a_cluster_that_cannot_hold_one_trial_is_a_clear_exit_2_error() -> None:
    spec = GroupSpec(workers=8, cpus_per_worker=4, device="cuda")
    with pytest.raises(ClusterError) as e:
        require_slots(spec, _nodes((16, 4), (16, 0)), source="workloads/big.yaml")
    text = str(e.value)
    assert isinstance(e.value, UserInputError)
    for needle in ("workloads/big.yaml", "resources", "8 rank(s) on one node", "4 GPU", "Fix"):
        assert needle in text, (needle, text)
    assert require_slots(spec, _nodes((32, 8)), source="x") == 1


def test_a_tune_trial_reserves_an_empty_head_and_the_groups_bundles() -> None:
    spec = GroupSpec(workers=4, nodes=2, cpus_per_worker=1)
    pgf = trial_resources(spec)
    assert pgf.head_bundle_is_empty
    assert pgf.bundles == [{"CPU": 2.0}, {"CPU": 2.0}]
    assert pgf.strategy == "STRICT_SPREAD"
