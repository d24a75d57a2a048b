"""The run stage under faults: the harness SIGKILLed mid-study on the real debug workload (then
``run --resume``), and a study directory that cannot be written.

Stage flows on the simulated backend (every stage end to end, resume on the surrogate) are in
``tests/stages/test_tune.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from benchmarks.machine import wait_gone
from infrarsi.study.trial_log import read_trials, rows

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DENSE = ROOT / "workloads" / "dense_debug.yaml"
SURROGATE = ROOT / "tests" / "fixtures" / "stages" / "surrogate_small.yaml"


def _short_workload(tmp_path: Path, warmup: int = 1, measured: int = 2) -> str:
    data = yaml.safe_load(DENSE.read_text())
    data["steps"] = {"warmup": warmup, "measured": measured}
    data["search_space"] = str(ROOT / "search_spaces" / "deepspeed_dense.yaml")
    path = tmp_path / "dense_short.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "PYTHONUNBUFFERED": "1",
        "INFRARSI_BANK": "off",
    }


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infrarsi", *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def slow_study_template(tmp_path_factory: pytest.TempPathFactory, ray_local: str) -> Path:
    """A surrogate study whose trials are held ~4 s each (``surrogate.wall_clock_scale``),
    initialised and doctored (2 repeats) once for this module; each test that runs it works on
    its own copy (``_copy_study``), so none sees another's rows."""
    folder = tmp_path_factory.mktemp("slow_study")
    data = yaml.safe_load(SURROGATE.read_text())
    data["surrogate"]["wall_clock_scale"] = 0.02
    data["search_space"] = str(ROOT / "search_spaces" / "surrogate_gpu.yaml")
    workload = folder / "slow.yaml"
    workload.write_text(yaml.safe_dump(data))
    study = folder / "study"
    r = _cli("init", str(workload), "--study", str(study))
    assert r.returncode == 0, r.stdout + r.stderr
    r = _cli("doctor", str(study), "--repeats", "2", "--no-honest-change", "--address", ray_local)
    assert r.returncode == 0, r.stdout + r.stderr
    return study


def _copy_study(template: Path, tmp_path: Path) -> Path:
    """A copy of a doctored study (its contract, baseline rows and calibration) under ``tmp_path``."""
    study = tmp_path / "study"
    shutil.copytree(template, study)
    return study


def _other_jobs_actors() -> dict[str, int]:
    """Actor id -> pid of every live actor that another driver (the CLI under test) owns."""
    import ray
    import ray._private.state as ray_state

    mine = ray.get_runtime_context().get_job_id()
    return {
        a["ActorID"]: int(a["Pid"])
        for a in ray_state.actors().values()
        if a["State"] == "ALIVE" and a["JobID"] != mine and a["Pid"]
    }


def _in_flight_after_a_heartbeat(study: Path) -> list[dict]:
    """Run-stage markers whose trial has been alive for at least one heartbeat."""
    out = []
    for p in (study / "inflight").glob("run-*.json"):
        try:
            mtime = p.stat().st_mtime
            marker = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # being written or removed right now
        if mtime > float(marker["started_at"]):
            out.append(marker)
    return out


def test_sigkill_mid_study_on_the_debug_workload_then_resume_loses_and_duplicates_nothing(
    ray_local: str, tmp_path: Path
) -> None:
    """init + doctor on the dense debug workload (2 CPU ranks, DeepSpeed over gloo, 3 steps a
    trial); ``infrarsi run --trials 2`` is SIGKILLed (its whole process group) once a run row is
    logged and the next trial is in flight; every process the killed harness had in Ray (the
    executor actor, the rank actors) goes away; ``run --resume`` then logs the in-flight trial as
    interrupted, with its device time up to its last heartbeat, and completes the budget: every
    trial id once, the rows logged before the kill unchanged, no trial run twice."""
    workload = _short_workload(tmp_path)
    study = tmp_path / "study"
    r = _cli(
        "init",
        workload,
        "--study",
        str(study),
        "--knob",
        "zero_stage",
        "--knob",
        "micro_batch_size",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    r = _cli("doctor", str(study), "--repeats", "2", "--no-honest-change", "--address", ray_local)
    assert r.returncode == 0, r.stdout + r.stderr

    out = (tmp_path / "run.out").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "infrarsi",
            "run",
            str(study),
            "--trials",
            "2",
            "--address",
            ray_local,
        ],
        env=_env(),
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        end = time.monotonic() + 480
        in_flight: list[dict] = []
        while proc.poll() is None and time.monotonic() < end:
            logged = [x for x in rows(read_trials(study)) if x.stage == "run"]
            in_flight = _in_flight_after_a_heartbeat(study) if logged else []
            if in_flight:
                break
            time.sleep(0.5)
        assert proc.poll() is None and in_flight, (
            "no run trial was in flight after a logged one: "
            + (tmp_path / "run.out").read_text()[-3000:]
        )
        held = _other_jobs_actors()  # the killed harness's executor and rank actors
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        out.close()
    assert held, "the running harness held no Ray actors (the executor and the ranks)"
    assert wait_gone(list(held.values())) == [], "processes of the killed harness outlived it"

    before = rows(read_trials(study))
    killed = {m["trial_id"] for m in _in_flight_after_a_heartbeat(study)}
    assert killed and not killed & {x.trial_id for x in before}

    r = _cli("run", str(study), "--trials", "2", "--resume", "--address", ray_local)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    after = rows(read_trials(study))
    ids = [x.trial_id for x in after]
    assert len(ids) == len(set(ids)), f"a trial id was logged twice: {ids}"
    by_id = {x.trial_id: x for x in after}
    for x in before:  # every row logged before the kill is still there, unchanged
        assert by_id[x.trial_id].to_dict() == x.to_dict()
    for tid in killed:  # the trial in flight at the kill: interrupted, and its device time counted
        row = by_id[tid]
        assert row.extra.interrupted is True and row.status == "failed", row
        assert row.device_seconds > 0 and row.ended_at > row.started_at
    run_rows = [x for x in after if x.stage == "run"]
    counted = [x for x in run_rows if not x.extra.interrupted]
    assert len(counted) == 2, [(x.trial_id, x.status, x.error[:200]) for x in run_rows]
    assert all(x.device_seconds > 0 for x in counted)
    assert not list((study / "inflight").glob("*.json"))
    assert wait_gone(list(_other_jobs_actors().values())) == []  # resume released its actors too


def test_an_unwritable_study_directory_stops_run_with_a_clear_error(
    ray_local: str, tmp_path: Path, make_unwritable
) -> None:
    """The study's trials/ and inflight/ folders cannot be written (chmod 0500, or chattr +i as
    root): run stops with the ``LogError`` naming the folder and the fix instead of reporting
    success with no trials, and the doctor's rows are intact."""
    from infrarsi.errors import LogError
    from infrarsi.stages.doctor import doctor_stage
    from infrarsi.stages.init import init_stage
    from infrarsi.stages.run import run_stage

    study = tmp_path / "study"
    init_stage(SURROGATE, study)
    doctor_stage(study, repeats=2)
    before = [x.to_dict() for x in rows(read_trials(study))]
    assert before
    make_unwritable(study / "trials")
    make_unwritable(study / "inflight")
    with pytest.raises(LogError) as info:
        run_stage(study, trials=2, progress=False)
    msg = str(info.value)
    assert str(study / "inflight") in msg and "not writable" in msg and "chmod -R u+w" in msg
    assert [x.to_dict() for x in rows(read_trials(study))] == before


def test_trials_run_at_once_each_in_its_own_reservation_on_a_two_node_cluster(
    tmp_path: Path, two_node_cluster: str
) -> None:
    """Two raylets of 2 CPUs each hold two dense_debug trials (2 ranks x 1 CPU, STRICT_PACK):
    with no --concurrency the run stage runs two at once, each in its own placement group (so
    on its own node), asks each with the other pending, and logs every trial once."""
    study = tmp_path / "study"
    r = _cli("init", _short_workload(tmp_path), "--study", str(study), "--trials", "4")
    assert r.returncode == 0, r.stderr[-2000:]
    r = _cli(
        "doctor", str(study), "--repeats", "2", "--no-honest-change", "--address", two_node_cluster
    )
    assert r.returncode == 0, r.stderr[-2000:]
    _wait_until_free(
        two_node_cluster, cpus=4
    )  # the doctor's reservation is released asynchronously
    r = _cli("run", str(study), "--address", two_node_cluster, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (
        json.loads(r.stdout)["concurrency"] == 2
    )  # stdout holds the one JSON object (the bar: stderr)
    run = [x for x in rows(read_trials(study)) if x.stage == "run"]
    assert len(run) == 4 and len({x.trial_id for x in run}) == 4
    assert all(x.extra.concurrency == 2 for x in run)
    overlapping = [
        (a, b)
        for i, a in enumerate(run)
        for b in run[i + 1 :]
        if a.started_at < b.ended_at and b.started_at < a.ended_at
    ]
    assert overlapping, [(x.trial_id, x.started_at, x.ended_at) for x in run]
    for a, b in overlapping:  # trials at once never share a reservation, or a rank process
        assert a.extra.placement_group_id != b.extra.placement_group_id
        assert not set(a.extra.pids) & set(b.extra.pids)
    asked = [x.config for x in run]
    assert (
        len({json.dumps(c, sort_keys=True) for c in asked}) == 4
    )  # pending configs are never asked again


def _wait_until_free(address: str, cpus: float, timeout_s: float = 120.0) -> None:
    """Block until the cluster at ``address`` has ``cpus`` CPUs free (a separate driver)."""
    code = (
        "import sys, time, ray; ray.init(address=sys.argv[1], log_to_driver=False); end = time.time() + "
        f"{timeout_s}\nwhile ray.available_resources().get('CPU', 0) < {cpus} and time.time() < end: time.sleep(0.5)"
    )
    subprocess.run(
        [sys.executable, "-c", code, address],
        env=_env(),
        timeout=timeout_s + 60,
        check=True,
        capture_output=True,
    )


def test_run_refuses_a_concurrency_below_one(tmp_path: Path) -> None:
    r = _cli("run", str(tmp_path / "no_study"), "--concurrency", "0")
    assert r.returncode == 2 and "--concurrency" in r.stderr + r.stdout


def test_a_capacity_above_the_devices_memory_is_refused_before_any_trial(tmp_path: Path) -> None:
    """A contract capacity larger than the device (measured by the doctor) would record every real
    OOM as "peak >= capacity": run refuses it with exit 2, before Ray starts."""
    from synthetic_study import make_study

    study = make_study(tmp_path)  # a 1 GiB contract capacity
    doctor = json.loads((study / "doctor.json").read_text())
    doctor["device_memory_capacity_bytes"] = 512 * 2**20
    (study / "doctor.json").write_text(json.dumps(doctor))
    r = _cli("run", str(study), "--trials", "1")
    assert r.returncode == 2, r.stderr[-2000:]
    err = r.stderr.replace("\n", "")
    assert "memory_capacity" in err and "0.50GiB" in err.replace(" ", "")


def test_a_tune_trial_actor_killed_mid_trial_is_retried_without_running_twice(
    ray_local: str, slow_study_template: Path, tmp_path: Path
) -> None:
    """Surrogate trials held ~4 s each (``surrogate.wall_clock_scale``), two at once: a Ray Tune
    trial actor SIGKILLed while its trial runs in the executor. The run goes on (it used to stop
    with exit 1, a 'harness error'); Tune retries that trial, whose retry gets the first
    attempt's row; the budget is met with every trial id and every Tune trial logged once."""
    study = _copy_study(slow_study_template, tmp_path)

    out = (tmp_path / "run.out").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "infrarsi",
            "run",
            str(study),
            "--trials",
            "4",
            "--concurrency",
            "2",
            "--address",
            ray_local,
        ],
        env=_env(),
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    killed: list[int] = []
    try:
        end = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < end and not killed:
            if _in_flight_after_a_heartbeat(study):
                import ray
                import ray._private.state as ray_state

                mine = ray.get_runtime_context().get_job_id()
                trainables = [
                    int(a["Pid"])
                    for a in ray_state.actors().values()
                    if a["State"] == "ALIVE"
                    and a["JobID"] != mine
                    and a["Pid"]
                    and a["ActorClassName"] == "ImplicitFunc"
                ]
                if trainables:
                    os.kill(trainables[0], signal.SIGKILL)
                    killed.append(trainables[0])
            time.sleep(0.2)
        assert killed, "no Tune trial actor was alive while a trial was in flight"
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        out.close()
    text = (tmp_path / "run.out").read_text()
    assert rc == 0, text[-3000:]
    run = [x for x in rows(read_trials(study)) if x.stage == "run"]
    ids = [x.trial_id for x in run]
    tune_ids = [x.extra.tune_trial_id for x in run]
    assert len(run) == 4 and len(set(ids)) == 4 and len(set(tune_ids)) == 4, [
        (x.trial_id, x.extra) for x in run
    ]
    assert not list((study / "inflight").glob("*.json"))


@pytest.mark.parametrize(
    ("lost", "remaining", "round_", "wall", "device", "expected"),
    [
        (1, 1, 0, False, False, True),  # an actor lost beyond Tune's retries left a trial missing
        (
            0,
            1,
            0,
            False,
            False,
            False,
        ),  # missing for another reason (the wall-time budget ended it)
        (1, 0, 0, False, False, False),  # the budget is met
        (1, 1, 2, False, False, False),  # no rounds left (TOPUP_ROUNDS = 2): run --resume's
        (1, 1, 0, True, False, False),  # the wall-time budget is spent
        (1, 1, 0, False, True, False),  # the device budget is spent
    ],
)
def test_run_tops_up_the_budget_lost_actors_left_only_while_budgets_last(
    lost: int, remaining: int, round_: int, wall: bool, device: bool, expected: bool
) -> None:
    from infrarsi.stages.run import TOPUP_ROUNDS, topup_needed

    assert TOPUP_ROUNDS == 2
    assert (
        topup_needed(
            lost_actors=lost,
            remaining=remaining,
            round_=round_,
            wall_spent=wall,
            device_spent=device,
        )
        is expected
    )


def test_two_runs_on_one_study_the_second_is_refused_or_queued_and_nothing_runs_twice(
    ray_local: str, slow_study_template: Path, tmp_path: Path
) -> None:
    """The issue's scenario: ``infrarsi run STUDY --trials 4`` twice on one surrogate study
    (trials held ~4 s each). While the first holds the study, a second ``run`` and a ``verify``
    exit 2 naming ``run``, its host, pid and start, and ``--wait``; a third ``run --resume --wait``
    queues behind it and then finds the budget spent. The log holds each trial id once and run
    rows within the budget."""
    import socket

    study = _copy_study(slow_study_template, tmp_path)

    run = [
        sys.executable,
        "-m",
        "infrarsi",
        "run",
        str(study),
        "--trials",
        "4",
        "--address",
        ray_local,
    ]
    first_out, third_out = (tmp_path / "first.out").open("w"), (tmp_path / "third.out").open("w")
    first = subprocess.Popen(run, env=_env(), cwd=ROOT, stdout=first_out, stderr=subprocess.STDOUT)
    third = None
    try:
        end = time.monotonic() + 120
        while (
            first.poll() is None and time.monotonic() < end and not (study / "study.lock").exists()
        ):
            time.sleep(0.1)
        held = json.loads((study / "study.lock").read_text())
        assert held["pid"] == first.pid and held["stage"] == "run"
        second = _cli(*run[3:])
        verify = _cli("verify", str(study), "--address", ray_local)
        third = subprocess.Popen(
            [*run, "--resume", "--json", "--wait"],
            env=_env(),
            cwd=ROOT,
            stdout=third_out,
            stderr=subprocess.STDOUT,
        )
        assert first.wait(timeout=480) == 0, (tmp_path / "first.out").read_text()[-3000:]
        assert third.wait(timeout=480) == 0, (tmp_path / "third.out").read_text()[-3000:]
    finally:
        for p in (first, third):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=60)
        first_out.close()
        third_out.close()
    for refused in (second, verify):
        msg = " ".join(refused.stderr.split())
        assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
        assert (
            "held by `run`" in msg
            and f"host {socket.gethostname()}" in msg
            and f"pid {first.pid}" in msg
        )
        assert "since" in msg and "--wait" in msg
    run_rows = [x for x in rows(read_trials(study)) if x.stage == "run"]
    ids = [x.trial_id for x in run_rows]
    assert len(ids) == len(set(ids)) == 4, ids  # within the budget, each id once
    assert (
        '"trials": 4' in (tmp_path / "third.out").read_text()
    )  # the queued one ran none: the budget was spent
    assert not (study / "study.lock").exists()
