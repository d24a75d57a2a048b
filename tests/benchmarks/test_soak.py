"""The soak benchmark's fault plan (``benchmarks.soak._plan``); the soak itself (a Ray cluster under faults) is not run here."""

from __future__ import annotations

import random

from benchmarks.soak import _plan


def test_plan_strikes_at_distinct_points_inside_the_budget() -> None:
    plan = _plan(random.Random(0), 60, ["actor_kill"] * 3 + ["raylet_kill"] * 2 + ["harness_sigkill"])
    points = [p for p, _ in plan]
    assert points == sorted(points) and len(set(points)) == 6 and points[0] >= 3 and points[-1] < 57
    assert sorted(k for _, k in plan) == sorted(["actor_kill"] * 3 + ["raylet_kill"] * 2 + ["harness_sigkill"])
