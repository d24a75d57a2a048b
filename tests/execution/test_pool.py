"""Warm worker pool: actors reused across trials, recycled after a bad status or a new env."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infrarsi.execution.runner import TrialRunner
from infrarsi.workload import Workload

STANDINS = str(Path(__file__).resolve().parent)
ROOT = Path(__file__).resolve().parents[2]


def _workload(warmup: int = 1, measured: int = 2) -> Workload:
    path = ROOT / "workloads" / "dense_debug.yaml"
    data = yaml.safe_load(path.read_text())
    data["steps"] = {"warmup": warmup, "measured": measured}
    return Workload.from_dict(data, source=str(path))


@pytest.mark.integration
def test_pool_reuses_actors_and_recycles_after_oom_standin(ray_local):
    """Group logic with a stand-in entry: same actors while healthy, fresh ones after an oom."""
    with TrialRunner(
        _workload(), code_dir=STANDINS, entry="standins:allreduce", peak_flops_per_s=1e9
    ) as runner:
        a = runner.run({}, trial_id="a")
        b = runner.run({}, trial_id="b")
        assert a.status == b.status == "ok"
        assert a.extra.warm is False and b.extra.warm is True
        assert a.extra.actor_ids == b.extra.actor_ids and a.extra.pids == b.extra.pids
        assert b.extra.group_trials_run == 2
        c = runner.run({}, trial_id="c-oom")
        assert c.status == "oom" and c.memory_censored
        assert c.extra.pids == b.extra.pids  # the oom ran on the warm group ...
        d = runner.run({}, trial_id="d")
        assert d.status == "ok" and d.extra.warm is False  # ... which was then recycled
        assert set(d.extra.pids).isdisjoint(c.extra.pids)
        e = runner.run(
            {"threads_per_worker": 2}, trial_id="e"
        )  # OMP_NUM_THREADS needs a new process
        assert e.status == "ok" and e.extra.warm is False
        assert runner.pool.stats.groups_started == 3
        assert runner.pool.stats.warm_acquires == 2


@pytest.mark.integration
def test_pool_with_real_training_reuses_then_recycles_after_oom(ray_local):
    """Real DeepSpeed ranks: two trials on the same processes, then an oom recycles them."""
    wl = _workload(warmup=1, measured=2)
    cfg = {"zero_stage": 0, "micro_batch_size": 8, "activation_checkpointing": "none"}
    with TrialRunner(wl) as runner:
        first = runner.run(cfg, trial_id="real-a")
        second = runner.run({**cfg, "zero_stage": 2}, trial_id="real-b")
        assert first.status == "ok", first.error
        assert second.status == "ok", second.error
        assert second.extra.warm is True
        assert first.extra.pids == second.extra.pids
        assert first.extra.actor_ids == second.extra.actor_ids
        assert runner.peak_flops_per_s is not None and runner.peak_flops_per_s > 0
        assert first.mfu is not None and first.mfu > 0
    with TrialRunner(wl, memory_capacity_bytes=2**20) as small:
        oom = small.run(cfg, trial_id="real-oom")
        assert oom.status == "oom" and oom.memory_censored, oom.error
        assert small.pool.group is None and small.pool.stats.recycles == 1


class _StandInGroup:
    """Only what ``WorkerPool`` asks of a ``TrialGroup`` (the pool's logic is under test, not Ray)."""

    def __init__(self, spec, **_: object) -> None:
        self.spec, self.alive, self.start_time_s = spec, True, 0.1

    def start(self) -> _StandInGroup:
        return self

    def kill(self) -> None:
        self.alive = False

    def shutdown(self) -> None:
        self.alive = False


@pytest.mark.parametrize(
    ("leftover", "recycled"), [(None, False), (0, False), (2**20, False), (22 * 2**30, True)]
)
def test_a_group_whose_trial_left_device_memory_allocated_is_recycled(
    monkeypatch, leftover, recycled
) -> None:
    """A DeepSpeed ZeRO-3 engine leaves its model states allocated after ``destroy()`` (+22 GiB per
    trial of a 1.5e9-parameter model on an H200): the next trial would start with them taken."""
    import infrarsi.execution.pool as pool_mod
    from infrarsi.execution.group import GroupSpec

    monkeypatch.setattr(pool_mod, "TrialGroup", _StandInGroup)
    pool = pool_mod.WorkerPool(GroupSpec(workers=1))
    first, warm = pool.acquire()
    assert warm is False
    pool.release(first, "ok", leftover_bytes=leftover)
    second, warm = pool.acquire()
    assert warm is (not recycled) and (second is first) is (not recycled)
    assert first.alive is (not recycled) and pool.stats.recycles == int(recycled)
