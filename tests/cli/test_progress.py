"""The stage progress bars (``infrarsi.cli.progress``): one bar per stage that runs trials, fed by
the structured log's events, none for ``run`` (it draws its own) or the stages without trials."""

from __future__ import annotations

import io
import math

import structlog
from rich.console import Console

from infrarsi.cli.progress import StageBars, describe_trial
from infrarsi.structlog_config import configure_logging


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=120, force_terminal=False), buf


def test_a_bar_per_stage_counts_the_trials_that_end_in_it() -> None:
    configure_logging("text", "info", verbose=False)
    log = structlog.get_logger("test")
    console, buf = _console()
    with StageBars(console) as bars:
        log.info("tune.stage", stage="init")
        log.info("tune.stage", stage="doctor")
        log.info("trial.end", trial_id="doctor-0000", status="ok", step_time_s=2.5)
        log.info("trial.end", trial_id="doctor-0001", status="oom", step_time_s=math.nan)
        log.info("tune.stage", stage="run")  # run draws its own bar
        assert bars.stage == "run" and bars._progress is None
        log.info("trial.end", trial_id="run-0000", status="ok", step_time_s=1.0)
        log.info("tune.stage", stage="verify")
        log.info("trial.end", trial_id="verify-0000", status="ok", step_time_s=1.25)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    assert len(lines) == 2, lines  # doctor's and verify's, each printed once
    assert lines[0].startswith("doctor") and "2 trials, last oom" in lines[0]
    assert lines[1].startswith("verify") and "1 trial, last ok 1.250 s/step" in lines[1]


def test_a_stage_command_opens_its_own_bar_and_disabled_draws_nothing() -> None:
    configure_logging("text", "info", verbose=False)
    console, buf = _console()
    with StageBars(console, stage="long-check"):
        structlog.get_logger().info("trial.end", status="ok", step_time_s=3.0)
    assert "long-check" in buf.getvalue() and "1 trial, last ok 3.000 s/step" in buf.getvalue()
    console, buf = _console()
    with StageBars(console, stage="long-check"):
        pass  # skipped: its budget bought no step past the trial's horizon
    assert "no trial run" in buf.getvalue() and "starting" not in buf.getvalue()
    console, buf = _console()
    with StageBars(console, stage="doctor", enabled=False) as bars:
        structlog.get_logger().info("trial.end", status="ok", step_time_s=3.0)
    assert buf.getvalue() == "" and bars.trials == 1


def test_describe_trial_names_the_status_and_a_finite_step_time_only() -> None:
    assert (
        describe_trial(1, {"status": "ok", "step_time_s": 0.5}) == "1 trial, last ok 0.500 s/step"
    )
    assert describe_trial(3, {"status": "failed", "step_time_s": None}) == "3 trials, last failed"
    assert describe_trial(2, {"step_time_s": float("nan")}) == "2 trials, last ?"
