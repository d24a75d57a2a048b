"""TrialRunner: checks that need no Ray (validation, knob environment, code directory), and the
must-show training invariants run for real through it.

Must-show training invariants, run for real through the Ray trial runner (2 gloo ranks,
DeepSpeed, warm worker pool): fp32 loss agreement across ZeRO stages, micro-batch splits and
checkpointing; MoE expert-parallel vs data-parallel; the CPU peak measure's response to
micro-batch and checkpointing; a capacity below the need gives oom, above it ok; honest
harness counters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infrarsi.errors import ClusterError, KnobError, SearchSpaceError
from infrarsi.execution.rank_spec import LossGuard
from infrarsi.execution.runner import TrialRunner, default_code_dir, default_timeout_s, knob_env
from infrarsi.result import TrialResult
from infrarsi.workload import Workload

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dense() -> Workload:
    return Workload.from_yaml(ROOT / "workloads" / "dense_debug.yaml")


def test_validate_fills_every_knob_and_rejects_bad_input_before_ray(dense):
    runner = TrialRunner(dense)
    full = runner.validate({"zero_stage": 2, "micro_batch_size": 4})
    assert set(full) == set(runner.space.names)
    assert full["zero_stage"] == 2 and full["micro_batch_size"] == 4
    with pytest.raises(SearchSpaceError, match="no_such_knob"):
        runner.run({"no_such_knob": 1}, trial_id="x")
    with pytest.raises(SearchSpaceError, match="zero_stage"):
        runner.run({"zero_stage": 9}, trial_id="x")
    assert runner.live_groups == []  # nothing was started
    runner.close()


def test_a_knob_without_handler_fails_before_any_trial(dense, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(
        "name: s\nobjective: step_time\nknobs:\n  - name: warp_drive\n    type: bool\n"
    )
    wl = Workload.from_dict(
        {**dense.to_yaml_dict(), "search_space": str(space)}, source=str(tmp_path / "wl.yaml")
    )
    with pytest.raises(KnobError, match="warp_drive"):
        TrialRunner(wl)


def test_knob_env_and_defaults(dense):
    assert knob_env({"threads_per_worker": 2, "zero_stage": 1}, dense) == {"OMP_NUM_THREADS": "2"}
    assert (Path(default_code_dir(dense)) / "workloads" / "__init__.py").exists()
    assert default_timeout_s(dense) > 0


pytestmark = pytest.mark.integration

WARMUP, MEASURED = 1, 3

DENSE_CONFIGS: dict[str, dict[str, Any]] = {
    "z0_m1": {"zero_stage": 0, "micro_batch_size": 1},
    "z0_m4": {"zero_stage": 0, "micro_batch_size": 4},
    "z0_m8": {"zero_stage": 0, "micro_batch_size": 8},
    "z0_m8_full": {"zero_stage": 0, "micro_batch_size": 8, "activation_checkpointing": "full"},
    "z1_m4": {"zero_stage": 1, "micro_batch_size": 4},
    "z2_m2_sel": {"zero_stage": 2, "micro_batch_size": 2, "activation_checkpointing": "selective"},
    "z3_m2_full": {"zero_stage": 3, "micro_batch_size": 2, "activation_checkpointing": "full"},
}


def _workload(name: str) -> Workload:
    path = ROOT / "workloads" / name
    d = Workload.from_yaml(path).to_yaml_dict()
    d["steps"] = {"warmup": WARMUP, "measured": MEASURED}
    return Workload.from_dict(d, source=str(path))


@pytest.fixture(scope="module")
def dense_runner(ray_local) -> Iterator[TrialRunner]:
    runner = TrialRunner(_workload("dense_debug.yaml"), address=ray_local)
    yield runner
    runner.close()


@pytest.fixture(scope="module")
def dense_results(dense_runner) -> dict[str, TrialResult]:
    out = {}
    for name, cfg in DENSE_CONFIGS.items():
        out[name] = dense_runner.run(cfg, trial_id=f"inv-{name}")
        assert out[name].status == "ok", (name, out[name].error[-2000:])
    return out


def _max_gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) == WARMUP + MEASURED
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_fp32_losses_agree_across_zero_splits_and_checkpointing(dense_results):
    ref = dense_results["z0_m8"]
    for name, r in dense_results.items():
        assert _max_gap(r.loss, ref.loss) < 1e-5, (name, r.loss, ref.loss)
        assert r.eval_loss is not None and abs(r.eval_loss - ref.eval_loss) < 1e-5, name
    assert ref.loss[-1] < ref.loss[0]  # it learns


def test_harness_counters_are_honest(dense_results):
    for name, r in dense_results.items():
        assert r.tokens_per_step == 2048, name
        assert r.optimizer_steps == WARMUP + MEASURED, name
        assert r.extra.param_checksums_agree is True, name
        assert r.world_size == 2 and r.step_time_s and r.step_time_s > 0


def test_cpu_peak_grows_with_micro_batch_and_checkpointing_lowers_it(dense_results):
    p = {k: v.peak_memory_bytes for k, v in dense_results.items()}
    assert all(v and v > 0 for v in p.values()), p
    assert p["z0_m1"] < p["z0_m4"] < p["z0_m8"], p
    assert p["z0_m8_full"] < p["z0_m8"], p


def test_capacity_below_need_is_oom_and_above_is_ok(dense_runner, dense_results):
    need = dense_results["z0_m8"].peak_memory_bytes
    assert need
    cfg = DENSE_CONFIGS["z0_m8"]
    try:
        dense_runner.memory_capacity_bytes = int(need * 1.5)
        above = dense_runner.run(cfg, trial_id="inv-cap-above")
        dense_runner.memory_capacity_bytes = int(need * 0.6)
        below = dense_runner.run(cfg, trial_id="inv-cap-below")
    finally:
        dense_runner.memory_capacity_bytes = None
    assert above.status == "ok", above.error[-2000:]
    assert below.status == "oom", (below.status, below.error[-2000:])
    assert below.memory_censored is True
    assert below.peak_memory_bytes and below.peak_memory_bytes > int(need * 0.6)


def test_moe_expert_parallel_agrees_with_data_parallel(ray_local):
    runner = TrialRunner(_workload("moe_debug.yaml"), address=ray_local)
    try:
        dp = runner.run({"zero_stage": 0, "micro_batch_size": 8}, trial_id="moe-dp")
        ep = runner.run(
            {"zero_stage": 0, "micro_batch_size": 8, "expert_parallel": True}, trial_id="moe-ep"
        )
        ep2 = runner.run(
            {"zero_stage": 2, "micro_batch_size": 4, "expert_parallel": True}, trial_id="moe-ep-z2"
        )
    finally:
        runner.close()
    for r in (dp, ep, ep2):
        assert r.status == "ok", r.error[-2000:]
        assert r.extra.param_checksums_agree is True
    assert _max_gap(ep.loss, dp.loss) < 1e-3, (ep.loss, dp.loss)
    assert _max_gap(ep2.loss, dp.loss) < 1e-3, (ep2.loss, dp.loss)
    assert abs(ep.eval_loss - dp.eval_loss) < 1e-3


def test_loss_guard_stops_every_rank_at_the_first_step_off_tolerance(dense_runner, dense_results):
    ref = dense_results["z0_m4"].loss
    guard = LossGuard(reference=[ref[0], ref[1] + 1.0, *ref[2:]], atol=1e-4, rtol=0.0)
    r = dense_runner.run(DENSE_CONFIGS["z0_m4"], trial_id="inv-guard", loss_guard=guard)
    assert r.status == "ok", r.error[-2000:]  # the executor turns it into invariant_violation
    assert r.extra.stopped_early.startswith("loss guard: step 1 ")
    assert len(r.loss) == 2 and r.optimizer_steps == 2 and r.eval_loss is None
    # the ranks stayed usable: the next trial on the same warm group runs every step
    again = dense_runner.run(DENSE_CONFIGS["z0_m4"], trial_id="inv-guard-after")
    assert (
        again.status == "ok"
        and len(again.loss) == WARMUP + MEASURED
        and again.extra.stopped_early is None
    )


@pytest.mark.integration
def test_a_workload_the_cluster_cannot_hold_is_refused_before_any_trial(ray_local):
    d = _workload("dense_debug.yaml").to_yaml_dict()
    d["resources"] = {**d["resources"], "cpus_per_worker": 8}  # the test Ray has 2 CPUs
    d["search_space"] = str(ROOT / "search_spaces" / "deepspeed_dense.yaml")
    wl = Workload.from_dict(d, source="too_big.yaml")
    with TrialRunner(wl, address=ray_local) as runner, pytest.raises(ClusterError) as e:
        runner.run({}, trial_id="never")
    assert "too_big.yaml" in str(e.value) and "'CPU': 8.0" in str(e.value)


@pytest.mark.integration
def test_a_two_node_deepspeed_trial_puts_its_ranks_on_two_raylets(two_node_cluster):
    """dense_multinode_debug (2 ranks, nodes: 2) on 2 raylets: STRICT_SPREAD puts one rank on
    each, and the trial trains through DeepSpeed across them (gloo between raylets)."""
    cmd = [
        sys.executable,
        "-m",
        "infrarsi",
        "trial",
        str(ROOT / "workloads" / "dense_multinode_debug.yaml"),
        "--address",
        two_node_cluster,
        "--json",
    ]
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    row = TrialResult.from_dict(json.loads(out.stdout.strip().splitlines()[-1]))
    assert row.status == "ok", row.error
    assert row.nodes == 2 and row.world_size == 2
    assert row.loss and row.step_time_s
    # the ranks run on other nodes than the driver: the workloads package travelled to them
    assert row.extra.code_shipped is True and len(row.extra.code_digest) == 64


@pytest.mark.integration
def test_a_pinned_runner_keeps_fresh_groups_in_one_reservation(ray_local, dense_runner):
    """doctor and verify pin their runner: even a group started afresh (here every trial's:
    warm=False) runs in the same placement group, so on the same node as the one before."""
    dense_runner.close()  # the module's warm runner holds the test Ray's 2 CPUs; its next use restarts it
    d = _workload("dense_debug.yaml").to_yaml_dict()
    d["steps"] = {"warmup": 1, "measured": 1}
    wl = Workload.from_dict(d, source=str(ROOT / "workloads" / "dense_debug.yaml"))
    with TrialRunner(wl, address=ray_local, pin=True, warm=False) as runner:
        rows = [runner.run({}, trial_id=f"pinned-{i}") for i in range(2)]
        assert runner.pool.stats.groups_started == 2
    assert all(r.status == "ok" for r in rows), [r.error for r in rows]
    assert rows[0].extra.placement_group_id == rows[1].extra.placement_group_id
    for row in rows:  # the row says whether its ranks ran on cores of their own, and if not, why
        assert (row.extra.cpu_pinned is True and row.extra.cpu_pin_note == "") or (
            row.extra.cpu_pinned is False and "rank " in row.extra.cpu_pin_note
        )
    assert rows[0].extra.pids != rows[1].extra.pids
    assert (
        len(set(rows[0].extra.node_ids)) == 1 and rows[0].extra.node_ids == rows[1].extra.node_ids
    )


@pytest.mark.integration
def test_without_an_address_a_new_local_ray_starts_beside_a_running_one(ray_local):
    """``init_ray()`` with no address (and no RAY_ADDRESS) starts its own Ray even where Ray's
    temp folder names a running one (here the tests' own, as ``ray start`` records it):
    ``ray.init()``'s default would join that one, a leftover cluster's or another user's."""
    import os
    import shutil
    import subprocess
    import sys
    import tempfile

    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths live in it
    try:
        (Path(tmp) / "ray").mkdir()
        (Path(tmp) / "ray" / "ray_current_cluster").write_text(ray_local)
        code = (
            "from infrarsi.execution.runner import init_ray\n"
            "import ray\n"
            "init_ray()\n"
            "print('GCS', ray.get_runtime_context().gcs_address)\n"
            "ray.shutdown()\n"
        )
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=180,
            env={**env, "RAY_TMPDIR": tmp},
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-2000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("GCS ")]
    assert line.split()[1] != ray_local
