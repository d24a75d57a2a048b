"""The rank spec: what the runner sends every rank, and the loss guard it carries (the same rule
as the contract's per-step loss invariant)."""

from __future__ import annotations

import math

import pytest

from infrarsi.execution.rank_spec import LossGuard, RankSpec

GUARD = LossGuard(reference=[8.0, 7.5, math.nan], atol=1e-4, rtol=1e-3)


def test_within_tolerance_does_not_trip() -> None:
    assert GUARD.trip(0, 8.0 + 1e-4 + 8e-3 - 1e-9) == ""


def test_outside_tolerance_trips_and_names_the_step() -> None:
    why = GUARD.trip(1, 7.6)
    assert why.startswith("loss guard: step 1 loss 7.6 vs baseline 7.5")
    assert "tolerance 0.0076" in why


def test_steps_without_a_finite_reference_never_trip() -> None:
    assert GUARD.trip(2, 1e9) == ""
    assert GUARD.trip(3, 1e9) == ""


def test_the_spec_crosses_as_a_dict_of_the_fields_set_and_comes_back_equal() -> None:
    spec = RankSpec(
        workload={"name": "w"},
        config={"zero_stage": 1},
        trial_id="t1",
        code_dir="/code",
        loss_guard=GUARD,
        steps=12,
    )
    raw = spec.to_dict()
    assert raw["loss_guard"] == {"reference": [8.0, 7.5, math.nan], "atol": 1e-4, "rtol": 1e-3}
    assert "checkpoint_step" not in raw and "seed" not in raw  # unset: left out
    back = RankSpec.from_dict(raw)
    assert back.loss_guard is not None and back.loss_guard.trip(1, 7.6)
    assert (back.trial_id, back.steps, back.script_cwd) == ("t1", 12, ".")
    with pytest.raises(TypeError, match="unknown keys \\['stepz'\\]"):
        RankSpec.from_dict({**raw, "stepz": 3})


def test_steps_to_train_is_the_workloads_unless_the_spec_asks_for_more() -> None:
    spec = RankSpec(workload={}, config={})
    assert spec.steps_to_train(1, 10) == 11
    spec.steps = 30
    assert spec.steps_to_train(1, 10) == 30
    spec.steps = 1
    with pytest.raises(ValueError, match="must exceed the workload's 1 warm-up steps"):
        spec.steps_to_train(1, 10)
