"""The run's progress callback: trials done, best so far and device time, and which trial errors are the harness's."""

from __future__ import annotations

from infrarsi.orchestration.progress import RunProgress, is_lost_actor
from infrarsi.result import TrialResult


def test_progress_counts_history_and_takes_the_done_count_of_a_new_tune_run() -> None:
    history = [
        TrialResult(
            trial_id="run-0000",
            stage="run",
            config={},
            status="ok",
            step_time_s=2.0,
            device_seconds=10.0,
        ),
        TrialResult(trial_id="run-0001", stage="run", config={}, status="oom", device_seconds=1.0),
    ]
    p = RunProgress(total=8, done=2, baseline_step_time_s=4.0, enabled=False, history=history)
    assert p.best == 2.0 and p.device_seconds == 11.0 and p.statuses == {"ok": 1, "oom": 1}
    assert "2.00x vs baseline" in p.describe()
    p.set_done(5)
    assert p.done == 5


def test_a_dead_trial_actor_is_lost_but_an_exception_from_the_trainable_is_not() -> None:
    from ray.exceptions import ActorDiedError, RayTaskError

    assert is_lost_actor(ActorDiedError())
    assert not is_lost_actor(
        RayTaskError("infrarsi_trial", "Traceback ...", ValueError("log unwritable"))
    )
    assert not is_lost_actor(None)
