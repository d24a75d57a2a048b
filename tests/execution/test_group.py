"""Trial group: rank-result aggregation (unit) and real 2-rank Ray groups with stand-in entries."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from infrarsi.execution.aggregate import aggregate, classify

STANDINS = str(Path(__file__).resolve().parent)


def _rank(rank: int, status: str = "ok", times=(1.0, 0.5, 0.6, 0.7), peak=100, **kw):
    r = {
        "rank": rank,
        "status": status,
        "error": "" if status == "ok" else f"{status} on {rank}",
        "step_times_s": list(times),
        "warmup_steps": 1,
        "loss": [3.0, 2.5, 2.0, 1.5],
        "tokens_seen": [2048] * 4,
        "optimizer_steps": 4,
        "peak_memory_bytes": peak,
        "memory_censored": status == "oom",
        "flops_per_token": 100.0,
    }
    r.update(kw)
    return r


def _agg(ranks, timed_out=False, **kw):
    args = dict(
        timed_out=timed_out,
        trial_id="t",
        stage="trial",
        config={"a": 1},
        world_size=2,
        nodes=1,
        devices=2,
        started_at=10.0,
        ended_at=15.0,
        peak_flops_per_s=1e6,
    )
    args.update(kw)
    return aggregate(ranks, **args)


def test_the_ranks_device_memory_and_name_enter_the_hardware_record():
    """The doctor's default capacity comes from the trials' own devices (any cluster)."""
    gib = 2**30
    res = _agg(
        [
            _rank(
                0,
                device_name="NVIDIA H200",
                device_memory_bytes=141 * gib,
                cuda_version="13.0",
                driver_version="580.159.04",
            ),
            _rank(
                1,
                device_name="NVIDIA H200",
                device_memory_bytes=140 * gib,
                cuda_version="13.0",
                driver_version="580.95.05",
            ),
        ]
    )
    assert res.hardware["memory_per_device_bytes"] == 140 * gib
    assert res.hardware["device_name"] == "NVIDIA H200" and res.hardware["cuda"] == "13.0"
    assert res.hardware["driver"] == "580.159.04, 580.95.05"  # a mixed cluster says so
    from infrarsi.stages.doctor_analysis import device_memory_capacity_bytes

    assert device_memory_capacity_bytes(res.hardware) == 140 * gib
    assert (
        "memory_per_device_bytes" not in _agg([_rank(0), _rank(1)]).hardware
    )  # CPU ranks report none


def test_step_time_is_median_of_max_over_ranks():
    res = _agg(
        [_rank(0, times=(9.0, 0.5, 0.9, 0.7)), _rank(1, times=(1.0, 0.8, 0.6, 0.75), peak=300)]
    )
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
    while time.monotonic() < end and any(
        psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids
    ):
        time.sleep(0.5)
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def _alive_actor_ids(actor_ids, timeout_s=60.0):
    """Actors among ``actor_ids`` not yet DEAD in the GCS (the state API needs the dashboard)."""
    import ray._private.state as ray_state

    end = time.monotonic() + timeout_s
    while True:
        alive = [
            a["ActorID"]
            for a in ray_state.actors().values()
            if a["ActorID"] in actor_ids and a["State"] != "DEAD"
        ]
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.5)


@pytest.mark.integration
@pytest.mark.parametrize("entry", ["standins:hang", "standins:skip_collective"])
def test_hanging_rank_times_out_and_leaves_nothing(ray_local, repo_root, entry):
    """A collective that never completes (rank 1 sleeps, or skips the all-reduce and returns
    ok, while rank 0 waits in it): status timeout at the deadline, the devices counted for it,
    group killed, no actors, no PG, no process."""
    from ray.util.placement_group import placement_group_table

    from infrarsi.execution.runner import TrialRunner
    from infrarsi.workload import Workload

    wl = Workload.from_yaml(repo_root / "workloads" / "dense_debug.yaml")
    runner = TrialRunner(
        wl, code_dir=STANDINS, entry=entry, peak_flops_per_s=1.0, check_knobs=False
    )
    try:
        res = runner.run({}, trial_id="hang-1", timeout_s=4)
        group_info = res.extra
        assert res.status == "timeout", res.error
        assert "did not finish" in res.error
        assert res.step_time_s is None
        assert res.device_seconds >= 2 * 4
        assert res.device_seconds == pytest.approx(2 * (res.ended_at - res.started_at))
        assert runner.pool.group is None  # the pool holds nothing after a timeout
        assert runner.pool.stats.recycles == 1
    finally:
        runner.close()
    assert _alive_actor_ids(set(group_info.actor_ids or [])) == []
    assert _wait_gone(group_info.pids or []) == []
    assert placement_group_table()[group_info.placement_group_id]["state"] == "REMOVED"


@pytest.mark.integration
def test_exception_in_a_rank_is_failed_with_its_text(ray_local):
    from infrarsi.execution.group import GroupSpec
    from infrarsi.execution.pool import WorkerPool

    with WorkerPool(GroupSpec(workers=2)) as pool:
        group, warm = pool.acquire(code_dir=STANDINS)
        assert not warm
        # each rank holds its cores alone and is pinned to them, or runs unpinned and says why
        # (other Ray clusters on this machine may hold the cores: never a wait)
        pinned = [i for i in group.infos if i["cpu_pinned"]]
        for i in pinned:
            assert (
                psutil.Process(i["pid"]).cpu_affinity() == i["cpu_cores"]
                and len(i["cpu_cores"]) == 1
            )
        assert len({c for i in pinned for c in i["cpu_cores"]}) == len(pinned)  # no core shared
        assert group.cpu_pinned == (len(pinned) == 2)
        assert all(
            f"rank {i['rank']}: " in group.cpu_pin_note and i["cpu_pin_note"]
            for i in group.infos
            if not i["cpu_pinned"]
        )
        spec = {"trial_id": "boom", "code_dir": STANDINS, "workload": {}, "config": {}}
        run = group.run(spec, timeout_s=60, entry="standins:boom")
        status, error = classify(run.rank_results, run.timed_out)
        assert status == "failed"
        assert "stand-in exploded" in error and "RuntimeError" in error
        pids = group.pids
        pool.release(group, status)
        assert pool.group is None
    assert _wait_gone(pids) == []


_TWO_RAYLETS = """
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
"""


@pytest.mark.integration
def test_group_spreads_over_two_raylets_and_rendezvouses(repo_root):
    """Two raylets of 1 CPU each (a 2-node cluster on one machine): ranks land on both, gloo works."""
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _TWO_RAYLETS, str(repo_root), STANDINS],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert json.loads(lines[0][len("RESULT ") :]) == {"nodes": 2, "status": "ok"}


def _dense(repo_root, warmup: int, measured: int):
    import yaml

    from infrarsi.workload import Workload

    path = repo_root / "workloads" / "dense_debug.yaml"
    data = yaml.safe_load(path.read_text())
    data["steps"] = {"warmup": warmup, "measured": measured}
    return Workload.from_dict(data, source=str(path))


def _when_in_flight(runner, timeout_s=300.0):
    """The runner's group once it has been handed a trial (its ranks are running it)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        groups = runner.live_groups
        if groups and groups[0].trials_run >= 1:
            return groups[0]
        time.sleep(0.1)
    raise AssertionError("the trial never reached its ranks")


@pytest.mark.integration
def test_a_rank_killed_mid_trial_fails_the_trial_and_counts_its_device_time(ray_local, repo_root):
    """Real DeepSpeed training on 2 gloo ranks; rank 1's process is SIGKILLed (what the kernel's
    OOM killer does) while the trial runs: the row is ``failed`` naming the dead rank, its
    device_seconds cover the devices for the trial's whole wall time, the surviving rank does
    not hang (the group is killed), and the next trial runs on a fresh group."""
    import os
    import signal
    import threading

    from infrarsi.execution.runner import TrialRunner

    wl = _dense(repo_root, warmup=1, measured=200)  # long enough to be killed mid-way
    cfg = {"zero_stage": 0, "micro_batch_size": 8, "activation_checkpointing": "none"}
    with TrialRunner(wl, peak_flops_per_s=1e9) as runner:
        out: dict = {}
        t = threading.Thread(
            target=lambda: out.update(res=runner.run(cfg, trial_id="killed", timeout_s=600))
        )
        t.start()
        group = _when_in_flight(runner)
        pids, actor_ids = list(group.pids), set(group.actor_ids)
        os.kill(pids[1], signal.SIGKILL)
        t.join(timeout=300)
        assert not t.is_alive()
        res = out["res"]
        assert res.status == "failed", res.error
        assert "rank 1 died" in res.error
        assert res.step_time_s is None
        assert res.device_seconds == pytest.approx(2 * (res.ended_at - res.started_at))
        assert res.device_seconds > 0
        assert runner.pool.group is None and runner.pool.stats.recycles == 1
        assert _alive_actor_ids(actor_ids) == []
        assert _wait_gone(pids) == []


_RAYLET_KILLED = """
import json, os, sys, threading, time
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
sys.path.insert(0, sys.argv[1])
import psutil, ray, yaml
from ray.cluster_utils import Cluster
from infrarsi.execution.runner import TrialRunner
from infrarsi.workload import Workload
fast = {"health_check_period_ms": 500, "health_check_timeout_ms": 500,
        "health_check_failure_threshold": 3, "health_check_initial_delay_ms": 0}
cluster = Cluster(initialize_head=True, head_node_args={
    "num_cpus": 0, "include_dashboard": False, "_system_config": fast})
workers = [cluster.add_node(num_cpus=2) for _ in range(2)]
ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
cluster.wait_for_nodes()
try:
    path = os.path.join(sys.argv[1], "workloads", "dense_debug.yaml")
    data = yaml.safe_load(open(path))
    data["steps"] = {"warmup": 1, "measured": 200}  # long enough to lose its node mid-way
    runner = TrialRunner(Workload.from_dict(data, source=path), peak_flops_per_s=1e9)
    out = {}
    cfg = {"zero_stage": 0, "micro_batch_size": 8, "activation_checkpointing": "none"}
    t = threading.Thread(target=lambda: out.update(res=runner.run(cfg, trial_id="raylet", timeout_s=600)))
    t.start()
    while not runner.live_groups or runner.live_groups[0].trials_run < 1:
        time.sleep(0.1)
    group = runner.live_groups[0]
    pids, on = group.pids, set(group.node_ids)
    (victim,) = [n for n in workers if n.node_id in on]  # PACK: both ranks on one node
    cluster.remove_node(victim, allow_graceful=False)   # SIGKILL its raylet and its processes
    t.join(300)
    res = out["res"]
    end = time.monotonic() + 60
    while any(psutil.pid_exists(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.5)
    end = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < end:
        time.sleep(0.5)
    print("RESULT", json.dumps({
        "status": res.status, "error": res.error[:500], "device_seconds": res.device_seconds,
        "wall_s": res.ended_at - res.started_at, "ranks_on_victim": len(on) == 1,
        "pids_left": [p for p in pids if psutil.pid_exists(p)], "pool_group": runner.pool.group is not None,
        "free_cpus": ray.available_resources().get("CPU", 0)}))
    runner.close()
finally:
    ray.shutdown()
    cluster.shutdown()
"""


@pytest.mark.integration
def test_a_raylet_killed_mid_trial_fails_the_trial_and_frees_its_devices(repo_root):
    """A cluster of two 2-CPU raylets on one machine; the trial's group (real DeepSpeed on 2
    gloo ranks) is packed on one of them, whose raylet and processes are SIGKILLed mid-trial
    (``Cluster.remove_node``): the row is ``failed`` with a dead rank, counts 2 devices for its
    wall time, the rank processes are gone and the surviving node's 2 CPUs are free again."""
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _RAYLET_KILLED, str(repo_root)],
        capture_output=True,
        text=True,
        timeout=500,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(lines[0][len("RESULT ") :])
    assert got["status"] == "failed" and "died" in got["error"], got
    assert got["ranks_on_victim"] and got["pids_left"] == [] and not got["pool_group"], got
    assert got["device_seconds"] == pytest.approx(2 * got["wall_s"]) and got["device_seconds"] > 0
    assert got["free_cpus"] == 2


def test_the_device_memory_a_trial_left_allocated_is_the_max_over_ranks():
    res = _agg([_rank(0, leftover_device_bytes=0), _rank(1, leftover_device_bytes=22 * 2**30)])
    assert res.extra.leftover_device_bytes == 22 * 2**30
    assert (
        _agg([_rank(0), _rank(1)]).extra.leftover_device_bytes is None
    )  # CPU ranks do not measure it
