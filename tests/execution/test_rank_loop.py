"""The ranks' loss guard: the same rule as the contract's per-step loss invariant."""

from __future__ import annotations

import math

from infrarsi.execution.rank_loop import loss_guard_trip

GUARD = {"reference": [8.0, 7.5, math.nan], "atol": 1e-4, "rtol": 1e-3}


def test_within_tolerance_does_not_trip() -> None:
    assert loss_guard_trip(GUARD, 0, 8.0 + 1e-4 + 8e-3 - 1e-9) == ""
    assert loss_guard_trip(None, 0, 100.0) == ""
    assert loss_guard_trip({}, 0, 100.0) == ""


def test_outside_tolerance_trips_and_names_the_step() -> None:
    why = loss_guard_trip(GUARD, 1, 7.6)
    assert why.startswith("loss guard: step 1 loss 7.6 vs baseline 7.5")
    assert "tolerance 0.0076" in why


def test_steps_without_a_finite_reference_never_trip() -> None:
    assert loss_guard_trip(GUARD, 2, 1e9) == ""
    assert loss_guard_trip(GUARD, 3, 1e9) == ""
