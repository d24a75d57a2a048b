"""The phase clock splits each micro-batch into forward, backward and optimizer time."""

from __future__ import annotations

from infrarsi.execution.clocks import PhaseClock


def test_phase_clock_splits_each_micro_batch_into_its_three_phases() -> None:
    clock = PhaseClock("cpu")
    clock._marks = [0.0, 1.0, 3.0, 3.5, 10.0, 10.5, 11.5, 12.0]
    assert clock.micro_batch_phases() == [(1.0, 2.0, 0.5), (0.5, 1.0, 0.5)]
    clock.reset()
    clock.mark()
    assert clock.micro_batch_phases() == []  # an unfinished micro-batch has no phases yet
