"""Anti reward hacking, for real: five cheating variants of the dense debug workload train on
2 ranks through Ray and DeepSpeed. Each must get ``invariant_violation`` with a reason that names
the cheat, and verify must never accept one, even the cheats that really are faster.

The cheats live in the workload's own seams (``tests/cheats.py``, named by each fixture's
``variant``): the data fetch, the loss
it reports, the optimizer step and the gradient reduction. The harness counts tokens, sequences
and optimizer steps itself, recomputes the eval loss with the untouched reference code and
compares parameter checksums across replicas; it trusts nothing the workload reports.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infrarsi.workload import Workload

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cheats"
SURROGATE = Path(__file__).resolve().parents[1] / "fixtures" / "stages" / "surrogate_small.yaml"

# cheat -> words its invariant-violation reason must contain
CHEATS = {
    "skip_optimizer_steps": "optimizer_steps",
    "shrink_batch": "batch",
    "fake_loss": "loss",
    "fewer_tokens": "tokens",
    "skip_allreduce": "all-reduce",
}


@pytest.fixture(scope="module")
def study(doctored_honest_study: Path) -> Path:
    return doctored_honest_study


@pytest.fixture(scope="module")
def executor(study: Path):
    from infrarsi.orchestration.executor import StudyExecutor

    ex = StudyExecutor(study)
    yield ex
    ex.close()


def _use_variant(ex, cheat: str) -> None:
    # The contract pins the honest workload; the cheat plays a code change to the workload's
    # seams that slipped past review. The warm pool is reused: only the per-trial spec changes.
    ex.runner.workload = Workload.from_yaml(FIXTURES / f"{cheat}.yaml")


@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_each_cheat_is_an_invariant_violation_that_names_it(executor, cheat: str) -> None:
    _use_variant(executor, cheat)
    base = executor.full_config(dict(executor.workload.baseline))
    row = executor.run_trial(base, "run")
    assert row["status"] == "invariant_violation", (cheat, row["status"], row["error"])
    assert CHEATS[cheat] in row["error"].lower(), (cheat, row["error"])


def test_honest_twin_keeps_every_invariant(executor) -> None:
    executor.runner.workload = Workload.from_yaml(FIXTURES / "honest.yaml")
    base = executor.full_config(dict(executor.workload.baseline))
    row = executor.run_trial(base, "run")
    assert row["status"] == "ok", row["error"]


@pytest.mark.parametrize("cheat", ["skip_optimizer_steps", "skip_allreduce"])
def test_verify_never_accepts_a_cheat_even_a_faster_one(study: Path, executor, cheat: str) -> None:
    from infrarsi.stages.verify import verify_stage

    honest = Workload.from_yaml(FIXTURES / "honest.yaml")
    cheating = Workload.from_yaml(FIXTURES / f"{cheat}.yaml")
    original = executor.run_trial

    def run_trial(config, stage, **kw):
        # The baseline runs honest code, the candidate the cheating code.
        role = kw["extra"].role if kw.get("extra") is not None else None
        executor.runner.workload = cheating if role == "candidate" else honest
        return original(config, stage, **kw)

    executor.run_trial = run_trial
    try:
        base = executor.full_config(dict(executor.workload.baseline))
        # Same knobs as the baseline: any measured "win" comes from the cheat (or noise).
        out = verify_stage(study, candidates=[base], pairs=2, rounds=1, executor=executor)
    finally:
        executor.run_trial = original
    assert out["best"] is None
    cand = out["candidates"][0]
    assert cand["accepted"] is False
    assert cand["rounds"][0]["statuses"] == ["invariant_violation", "invariant_violation"]
    assert "invariant_violation" in cand["rounds"][0]["reason"]


def test_an_out_of_scope_config_is_refused_before_it_runs(tmp_path: Path) -> None:
    from infrarsi.orchestration.executor import StudyExecutor
    from infrarsi.study.contract import Contract
    from infrarsi.study.trial_log import read_trials, rows

    d = tmp_path / "scoped"
    Contract.create(
        FIXTURES / "honest.yaml",
        study_dir=d,
        memory_capacity_bytes=1 << 30,
        editable_knobs=["zero_stage"],
    ).save(d)
    ex = StudyExecutor(d)
    try:
        from infrarsi.orchestration.common import baseline_config

        base = baseline_config(ex.contract, d)
        other = next(k for k in ex.space.knobs if k.name != "zero_stage" and len(k.values) > 1)
        value = next(v for v in other.values if v != base[other.name])
        got = ex.run_trial({**base, other.name: value}, "run")
    finally:
        ex.close()
    assert got["status"] == "failed" and got["extra"]["out_of_scope"] is True
    assert (
        "editable.knobs" in got["error"]
        and repr(other.name) in got["error"]
        and repr(value) in got["error"]
    )
    assert [r.trial_id for r in rows(read_trials(d))] == [got["trial_id"]]


def test_a_full_disk_at_the_log_write_is_a_log_error_and_resume_logs_the_trial_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC at the trial log's fsync (fault injected at the write; surrogate trials, no Ray):
    ``run_trial`` raises the ``LogError`` naming the segment and the fix, the row logged before
    is intact, the failed trial is not half logged, and its in-flight marker stays, so the next
    harness logs it as interrupted (with its device time up to its last heartbeat)."""
    import errno
    import os

    from infrarsi.errors import LogError
    from infrarsi.orchestration.executor import StudyExecutor
    from infrarsi.stages.init import init_stage
    from infrarsi.study.trial_log import read_trials, rows

    def enospc(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    d = tmp_path / "study"
    init_stage(SURROGATE, d)
    ex = StudyExecutor(d)
    try:
        base = ex.full_config(dict(ex.workload.baseline))
        first = ex.run_trial(base, "doctor")
        monkeypatch.setattr(os, "fsync", enospc)
        with pytest.raises(LogError) as info:
            ex.run_trial(base, "doctor")
        monkeypatch.undo()
    finally:
        ex.close()
    msg = str(info.value)
    assert str(d / "trials") in msg and "No space left on device" in msg and "free space" in msg
    before = rows(read_trials(d))
    assert [r.trial_id for r in before] == [first["trial_id"]]

    again = StudyExecutor(d)
    try:
        (recovered,) = again.recover_inflight()
    finally:
        again.close()
    after = {r.trial_id: r for r in rows(read_trials(d))}
    assert (
        sorted(after)
        == [first["trial_id"], recovered["trial_id"]]
        == ["doctor-0000", "doctor-0001"]
    )
    lost = after["doctor-0001"]
    assert lost.extra.interrupted is True and lost.status == "failed"
    assert lost.device_seconds == pytest.approx(
        lost.world_size * (lost.ended_at - lost.started_at), abs=1e-3
    )
    assert after["doctor-0000"].to_dict() == before[0].to_dict()


def test_a_retried_attempt_key_returns_the_first_rows_and_runs_nothing_twice(
    tmp_path: Path,
) -> None:
    """Ray Tune retries a trial whose trial actor died (killed, node lost) while the executor was
    still running it: the retry's call (same ``attempt_key``) waits for the first call and gets
    its row; the trial is run and logged once. Surrogate trials held 0.3 s each, no Ray."""
    import threading

    import yaml

    from infrarsi.orchestration.executor import StudyExecutor
    from infrarsi.stages.init import init_stage
    from infrarsi.study.trial_log import read_trials, rows

    data = yaml.safe_load(SURROGATE.read_text())
    data["surrogate"]["wall_clock_scale"] = 0.3 / 200  # ~0.3 s a trial (about 200 simulated s)
    data["search_space"] = str((SURROGATE.parent / data["search_space"]).resolve())
    wl = tmp_path / "slow.yaml"
    wl.write_text(yaml.safe_dump(data))
    d = tmp_path / "study"
    init_stage(wl, d)
    ex = StudyExecutor(d)
    got: dict[str, dict] = {}
    try:
        base = ex.full_config(dict(ex.workload.baseline))
        first = threading.Thread(
            target=lambda: got.update(first=ex.run_trial(base, "run", attempt_key="t_00001"))
        )
        first.start()
        while not list((d / "inflight").glob("*.json")):  # the first attempt is in flight
            threading.Event().wait(0.01)
        got["retry"] = ex.run_trial(base, "run", attempt_key="t_00001")  # waits for the first
        first.join()
        got["later"] = ex.run_trial(base, "run", attempt_key="t_00001")  # after it ended
        got["other"] = ex.run_trial(base, "run", attempt_key="t_00002")
        got["unkeyed"] = ex.run_trial(base, "run")
    finally:
        ex.close()
    assert got["retry"] == got["first"] == got["later"]
    logged = [r.trial_id for r in rows(read_trials(d))]
    assert (
        logged
        == ["run-0000", "run-0001", "run-0002"]
        == [got["first"]["trial_id"], got["other"]["trial_id"], got["unkeyed"]["trial_id"]]
    )


def test_an_attempt_that_raised_leaves_its_key_free_for_the_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first call that raised (a harness error) logged nothing: a retry with its key runs."""
    from infrarsi.orchestration.executor import StudyExecutor
    from infrarsi.stages.init import init_stage
    from infrarsi.study.trial_log import read_trials, rows

    d = tmp_path / "study"
    init_stage(SURROGATE, d)
    ex = StudyExecutor(d)
    try:
        base = ex.full_config(dict(ex.workload.baseline))
        monkeypatch.setattr(
            ex.runner, "run", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))
        )
        with pytest.raises(RuntimeError, match="boom"):
            ex.run_trial(base, "run", attempt_key="t_00001")
        monkeypatch.undo()
        ex.markers.done("run-0000")  # what resume would log as interrupted
        row = ex.run_trial(base, "run", attempt_key="t_00001")
    finally:
        ex.close()
    assert row["status"] == "ok" and [r.trial_id for r in rows(read_trials(d))] == [row["trial_id"]]
