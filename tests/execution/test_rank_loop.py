"""The ranks' loss guard: the same rule as the contract's per-step loss invariant."""

from __future__ import annotations

import math

import pytest

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


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_zero3_built_under_zero_init_starts_from_the_same_weights_as_zero0() -> None:
    """Under ZeRO-3 the model is built inside ``deepspeed.zero.Init`` (partitioned as it is
    built); it must start from the very weights ZeRO-0's on-device build has: the same
    first-step loss and, after the same steps, the same parameters (2 gloo ranks)."""
    from tests.execution.spawn_harness import make_spec, run_specs

    cfgs = [{"zero_stage": 0, "micro_batch_size": 2}, {"zero_stage": 3, "micro_batch_size": 2}]
    specs = [make_spec("workloads/dense_debug.yaml", c, warmup=0, measured=2, trial_id=str(i)) for i, c in enumerate(cfgs)]
    z0, z3 = run_specs(specs)
    assert [r["status"] for r in z0 + z3] == ["ok"] * 4, [r["error"][-500:] for r in z0 + z3]
    assert z3[0]["loss"][0] == pytest.approx(z0[0]["loss"][0], abs=1e-6)
    assert z3[0]["param_checksum"] == pytest.approx(z0[0]["param_checksum"], rel=1e-6)
