"""Trial group: rank-result aggregation (unit) and real 2-rank Ray groups with stand-in entries."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from infrarsi.execution.aggregate import aggregate, classify

STANDINS = str(Path(__file__).resolve().parent)


def _rank(rank: int, status: str = "ok", times=(1.0, 0.5, 0.6, 0.7), peak=100, **kw):
    r = {"rank": rank, "status": status, "error": "" if status == "ok" else f"{status} on {rank}",
         "step_times_s": list(times), "warmup_steps": 1, "loss": [3.0, 2.5, 2.0, 1.5],
         "tokens_seen": [2048] * 4, "optimizer_steps": 4, "peak_memory_bytes": peak,
         "memory_censored": status == "oom", "flops_per_token": 100.0}
    r.update(kw)
    return r


def _agg(ranks, timed_out=False, **kw):
    args = dict(timed_out=timed_out, trial_id="t", stage="trial", config={"a": 1}, world_size=2,
                nodes=1, devices=2, started_at=10.0, ended_at=15.0, peak_flops_per_s=1e6)
    args.update(kw)
    return aggregate(ranks, **args)


def test_the_ranks_device_memory_and_name_enter_the_hardware_record():
    """The doctor's default capacity comes from the trials' own devices (any cluster)."""
    gib = 2**30
    res = _agg([_rank(0, device_name="NVIDIA H200", device_memory_bytes=141 * gib),
                _rank(1, device_name="NVIDIA H200", device_memory_bytes=140 * gib)])
    assert res.hardware["memory_per_device_bytes"] == 140 * gib
    assert res.hardware["device_name"] == "NVIDIA H200"
    from infrarsi.stages.doctor_analysis import device_memory_capacity_bytes

    assert device_memory_capacity_bytes(res.hardware) == 140 * gib
    assert "memory_per_device_bytes" not in _agg([_rank(0), _rank(1)]).hardware  # CPU ranks report none


def test_step_time_is_median_of_max_over_ranks():
    res = _agg([_rank(0, times=(9.0, 0.5, 0.9, 0.7)), _rank(1, times=(1.0, 0.8, 0.6, 0.75), peak=300)])
    assert res.status == "ok"
    assert res.step_time_samples_s == [0.8, 0.9, 0.75]
    assert res.step_time_s == pytest.approx(0.8)
    assert res.warmup_time_s == pytest.approx(9.0)
    assert res.rank_step_time_s == [pytest.approx(0.7), pytest.approx(0.75)]
    assert res.peak_memory_bytes == 300
    assert res.tokens_per_step == 2048 and res.optimizer_steps == 4
    assert res.tokens_per_s == pytest.approx(2048 / 0.8)
    assert res.mfu == pytest.approx(100.0 * 2048 / 0.8 / (2 * 1e6))
    assert res.device_seconds == pytest.approx(10.0)
    assert res.loss == [3.0, 2.5, 2.0, 1.5]


@pytest.mark.parametrize(
    ("statuses", "timed_out", "expected"),
    [
        (["ok", "oom"], False, "oom"),
        (["nan", "oom"], False, "oom"),
        (["nan", "ok"], False, "nan"),
        (["failed", "nan"], False, "nan"),
        (["failed", "ok"], False, "failed"),
        (["ok", None], True, "timeout"),
        (["failed", None], True, "failed"),
        (["ok", "ok"], False, "ok"),
    ],
)
def test_status_classification(statuses, timed_out, expected):
    ranks = [None if s is None else _rank(i, s) for i, s in enumerate(statuses)]
    status, error = classify(ranks, timed_out)
    assert status == expected
    assert (error == "") == (expected == "ok")


def test_oom_is_censored_at_the_known_lower_bound():
    res = _agg([_rank(0, peak=500), _rank(1, "oom", peak=900)])
    assert res.status == "oom" and res.memory_censored
    assert res.peak_memory_bytes == 900
    assert res.step_time_s is None and res.step_time_samples_s == []
    assert "oom on 1" in res.error


def test_failed_keeps_the_exception_text_and_costs_device_time():
    res = _agg([_rank(0, "failed", error="RuntimeError: boom"), _rank(1)], ended_at=13.0)
    assert res.status == "failed" and "RuntimeError: boom" in res.error
    assert res.device_seconds == pytest.approx(6.0)


# ----------------------------------------------------------------------------- integration
def _wait_gone(pids, timeout_s=60.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids):
        time.sleep(0.5)
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def _alive_actor_ids(actor_ids, timeout_s=60.0):
    """Actors among ``actor_ids`` not yet DEAD in the GCS (the state API needs the dashboard)."""
    import ray._private.state as ray_state

    end = time.monotonic() + timeout_s
    while True:
        alive = [a["ActorID"] for a in ray_state.actors().values()
                 if a["ActorID"] in actor_ids and a["State"] != "DEAD"]
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.5)


@pytest.mark.integration
def test_hanging_rank_times_out_and_leaves_nothing(ray_local, repo_root):
    """A rank that never returns: status timeout, group killed, no actors, no PG, no process."""
    from ray.util.placement_group import placement_group_table

    from infrarsi.execution.runner import TrialRunner
    from infrarsi.workload import Workload

    wl = Workload.from_yaml(repo_root / "workloads" / "dense_debug.yaml")
    runner = TrialRunner(wl, code_dir=STANDINS, entry="standins:hang", peak_flops_per_s=1.0, check_knobs=False)
    try:
        res = runner.run({}, trial_id="hang-1", timeout_s=4)
        group_info = res.extra
        assert res.status == "timeout", res.error
        assert "did not finish" in res.error
        assert res.step_time_s is None
        assert res.device_seconds >= 2 * 4
        assert runner.pool.group is None  # the pool holds nothing after a timeout
        assert runner.pool.stats.recycles == 1
    finally:
        runner.close()
    assert _alive_actor_ids(set(group_info["actor_ids"])) == []
    assert _wait_gone(group_info["pids"]) == []
    assert placement_group_table()[group_info["placement_group_id"]]["state"] == "REMOVED"


@pytest.mark.integration
def test_exception_in_a_rank_is_failed_with_its_text(ray_local):
    from infrarsi.execution.group import GroupSpec
    from infrarsi.execution.pool import WorkerPool

    with WorkerPool(GroupSpec(workers=2)) as pool:
        group, warm = pool.acquire(code_dir=STANDINS)
        assert not warm
        spec = {"trial_id": "boom", "code_dir": STANDINS, "workload": {}, "config": {}}
        run = group.run(spec, timeout_s=60, entry="standins:boom")
        status, error = classify(run.rank_results, run.timed_out)
        assert status == "failed"
        assert "stand-in exploded" in error and "RuntimeError" in error
        pids = group.pids
        pool.release(group, status)
        assert pool.group is None
    assert _wait_gone(pids) == []


_TWO_RAYLETS = '''
import json, os, sys
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
sys.path.insert(0, sys.argv[1])
import ray
from ray.cluster_utils import Cluster
from infrarsi.execution.aggregate import classify
from infrarsi.execution.group import GroupSpec
from infrarsi.execution.pool import WorkerPool
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
cluster.add_node(num_cpus=1)
ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
cluster.wait_for_nodes()
try:
    with WorkerPool(GroupSpec(workers=2, nodes=2)) as pool:
        group, _ = pool.acquire(code_dir=sys.argv[2])
        spec = {"trial_id": "mn", "code_dir": sys.argv[2], "config": {},
                "workload": {"steps": {"warmup": 1, "measured": 2}, "tokens_per_step": 2048}}
        run = group.run(spec, timeout_s=120, entry="standins:allreduce")
        print("RESULT", json.dumps({"nodes": len(set(group.node_ids)),
                                    "status": classify(run.rank_results, run.timed_out)[0]}))
finally:
    ray.shutdown()
    cluster.shutdown()
'''


@pytest.mark.integration
def test_group_spreads_over_two_raylets_and_rendezvouses(repo_root):
    """Two raylets of 1 CPU each (a 2-node cluster on one machine): ranks land on both, gloo works."""
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _TWO_RAYLETS, str(repo_root), STANDINS],
                          capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert json.loads(lines[0][len("RESULT "):]) == {"nodes": 2, "status": "ok"}
