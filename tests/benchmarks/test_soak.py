"""The soak benchmark's fault plan and its duplicate-launch verdict (``benchmarks.soak._plan``);
the soak itself (a Ray cluster under faults) is not run here."""

from __future__ import annotations

import random

from benchmarks.soak import _plan, duplicate_launch_outcome, surrogate_faults


def test_plan_strikes_at_distinct_points_inside_the_budget() -> None:
    plan = _plan(
        random.Random(0), 60, ["actor_kill"] * 3 + ["raylet_kill"] * 2 + ["harness_sigkill"]
    )
    points = [p for p, _ in plan]
    assert points == sorted(points) and len(set(points)) == 6 and points[0] >= 3 and points[-1] < 57
    assert sorted(k for _, k in plan) == sorted(
        ["actor_kill"] * 3 + ["raylet_kill"] * 2 + ["harness_sigkill"]
    )


def test_the_surrogate_phase_plans_a_duplicate_launch() -> None:
    assert surrogate_faults(60).count("duplicate_launch") == 1
    assert surrogate_faults(120).count("duplicate_launch") == 2


def test_a_duplicate_launch_counts_as_refused_only_with_exit_2_naming_the_run() -> None:
    msg = (
        "error: /s/study.lock: the study is held by `run` on host h, pid 7, since 2026-12-05 08:00:00 UTC\n"
        "(3 s ago; last heartbeat 1 s ago). Rule: one writer per study at a time."
    )
    assert duplicate_launch_outcome(2, msg)["refused"] is True
    assert "held by `run`" in duplicate_launch_outcome(2, msg)["message"]
    assert duplicate_launch_outcome(0, "")["refused"] is False  # it ran beside the first
    assert duplicate_launch_outcome(1, msg)["refused"] is False
    assert duplicate_launch_outcome(2, "error: --trials: bad value")["refused"] is False
