"""The doctor's pure analysis: noise, stragglers, loss tolerance."""

from __future__ import annotations

from pathlib import Path

import pytest

from infrarsi.result import TrialResult
from infrarsi.search.space import SearchSpace
from infrarsi.stages.doctor_analysis import (
    HONEST_CHANGE_FACTOR,
    LOSS_TOLERANCE_FLOOR,
    analyse_baseline,
    honest_change_configs,
)
from infrarsi.study.doctor_report import DoctorReport

ROOT = Path(__file__).resolve().parents[2]


def _row(
    i: int, step: float, loss: list[float], ranks: list[float] | None = None, status: str = "ok"
) -> TrialResult:
    return TrialResult(
        trial_id=f"doctor-{i:04d}",
        stage="doctor",
        config={},
        status=status,
        step_time_s=step if status == "ok" else None,
        step_time_samples_s=[step * 0.99, step, step * 1.01],
        loss=loss,
        eval_loss=loss[-1],
        rank_step_time_s=ranks or [step, step],
        phase_times_s={"forward": step / 3, "backward": step / 2},
        peak_memory_bytes=100 + i,
        tokens_per_s=2048 / step,
        tokens_per_step=2048,
        optimizer_steps=len(loss),
        hardware={"peak_flops_per_s": 1e11},
        mfu=0.1,
    )


def test_noise_and_tolerance_from_repeats() -> None:
    rows = [_row(0, 2.0, [8.0, 7.5]), _row(1, 2.2, [8.0, 7.5 + 1e-3]), _row(2, 1.8, [8.0, 7.5])]
    out = analyse_baseline(rows)
    assert isinstance(out, DoctorReport)
    assert out.ok_trials == 3
    assert out.step_time_s is not None
    assert out.step_time_s.median == pytest.approx(2.0)
    assert out.step_time_s.run_to_run_cv == pytest.approx(0.1, rel=1e-6)
    assert out.noise_margin == pytest.approx(0.1, rel=1e-6)
    # 10 x the largest run-to-run difference (1e-3) beats the floor.
    assert out.loss_tolerance == pytest.approx(1e-2)
    assert out.reference_loss == [8.0, 7.5]
    assert out.peak_memory_bytes == 102
    assert out.device_memory_capacity_bytes is None  # the hardware reported none


def test_device_memory_is_the_smallest_the_hardware_reports() -> None:
    rows = [_row(i, 1.0, [1.0]) for i in range(2)]
    rows[0].hardware["memory_per_device_bytes"] = 80 * 2**30
    rows[1].hardware["memory_per_device_bytes"] = 40 * 2**30
    assert analyse_baseline(rows).device_memory_capacity_bytes == 40 * 2**30


def test_tolerance_floor_when_runs_agree_bitwise() -> None:
    rows = [_row(i, 1.0, [8.0, 7.0]) for i in range(3)]
    out = analyse_baseline(rows)
    assert out.loss_run_to_run_max_abs_diff == 0.0
    assert out.loss_tolerance == LOSS_TOLERANCE_FLOOR


def test_straggler_flagged_only_when_consistent() -> None:
    slow = [_row(i, 1.0, [1.0], ranks=[1.0, 1.3, 1.0, 1.0]) for i in range(3)]
    flagged = analyse_baseline(slow).stragglers
    assert flagged is not None and flagged.flag is True and flagged.rank == 1
    moving = [
        _row(i, 1.0, [1.0], ranks=[1.3 if j == i else 1.0 for j in range(4)]) for i in range(3)
    ]
    unflagged = analyse_baseline(moving).stragglers
    assert unflagged is not None and unflagged.flag is False


def test_failed_rows_do_not_count() -> None:
    rows = [_row(0, 1.0, [1.0]), _row(1, 1.0, [1.0], status="oom")]
    out = analyse_baseline(rows)
    assert out.ok_trials == 1
    assert out.statuses == {"ok": 1, "oom": 1}


def test_an_honest_change_widens_the_tolerance_when_repeats_agree_bitwise() -> None:
    """bf16 repeats on one GPU can agree bitwise; the honest changes (another micro-batch split,
    another ZeRO stage) show what honest candidates do to the loss: the tolerance takes 3x the
    largest."""
    rows = [_row(i, 1.0, [12.0, 11.9, 11.8]) for i in range(2)]
    split = _row(9, 0.9, [12.0, 11.93, 11.76])
    split.config = {"micro_batch_size": 2}
    zero = _row(10, 0.5, [12.0, 11.95, 11.9])
    zero.config = {"zero_stage": 0}
    out = analyse_baseline(rows, honest_changes=[("micro_batch_size", split), ("zero_stage", zero)])
    assert out.loss_run_to_run_max_abs_diff == 0.0
    assert [c.changed for c in out.honest_changes] == ["micro_batch_size", "zero_stage"]
    assert out.honest_changes[0].loss_max_abs_diff == pytest.approx(0.04)
    assert out.honest_changes[1].loss_max_abs_diff == pytest.approx(0.1)
    assert out.loss_honest_change_max_abs_diff == pytest.approx(0.1)
    assert out.loss_tolerance == pytest.approx(HONEST_CHANGE_FACTOR * 0.1)


def test_a_failed_honest_change_is_recorded_but_not_used() -> None:
    rows = [_row(i, 1.0, [8.0, 7.0]) for i in range(2)]
    variant = _row(9, 1.0, [8.5], status="oom")
    out = analyse_baseline(rows, honest_changes=[("zero_stage", variant)])
    assert out.honest_changes[0].status == "oom"
    assert out.honest_changes[0].loss_max_abs_diff is None
    assert out.loss_honest_change_max_abs_diff is None
    assert out.loss_tolerance == LOSS_TOLERANCE_FLOOR


SPACE = SearchSpace.from_dict(
    {
        "name": "s",
        "knobs": [
            {"name": "zero_stage", "type": "choice", "values": [0, 1, 2, 3]},
            {"name": "micro_batch_size", "type": "int", "values": [1, 2, 4, 8, 16]},
        ],
        "constraints": ["not (zero_stage == 0 and micro_batch_size == 2)"],
    }
)


@pytest.mark.parametrize(
    ("base", "per_rank", "want"),
    [
        ({"zero_stage": 3, "micro_batch_size": 4}, 16, 2),  # the nearest smaller split
        ({"zero_stage": 3, "micro_batch_size": 1}, 16, 2),  # none smaller: the nearest larger
        ({"zero_stage": 0, "micro_batch_size": 4}, 16, 1),  # 2 breaks a constraint: skipped
        ({"zero_stage": 3, "micro_batch_size": 4}, 12, 2),  # 8 and 16 do not divide 12
        ({"zero_stage": 3, "micro_batch_size": 1}, 1, None),  # no other split at all
    ],
)
def test_the_split_change_is_the_baseline_with_the_nearest_other_split(
    base, per_rank, want
) -> None:
    changes = dict(honest_change_configs(base, SPACE, per_rank))
    assert changes.get("micro_batch_size", {}).get("micro_batch_size") == want
    if want is not None:
        assert changes["micro_batch_size"]["zero_stage"] == base["zero_stage"]


@pytest.mark.parametrize(
    ("base", "want"),
    [
        (
            {"zero_stage": 3, "micro_batch_size": 4},
            0,
        ),  # the far end: DeepSpeed's other optimizer path
        ({"zero_stage": 0, "micro_batch_size": 4}, 3),  # from ZeRO-0, the highest
        (
            {"zero_stage": 3, "micro_batch_size": 2},
            1,
        ),  # ZeRO-0 with micro-batch 2 breaks a constraint
    ],
)
def test_the_zero_change_goes_to_the_far_stage(base, want) -> None:
    changes = dict(honest_change_configs(base, SPACE, 16))
    assert changes["zero_stage"] == {**base, "zero_stage": want}


SPACE_16BIT = SearchSpace.from_dict(
    {
        "name": "s",
        "knobs": [
            {"name": "zero_stage", "type": "choice", "values": [0, 1, 2, 3]},
            {"name": "micro_batch_size", "type": "int", "values": [1, 2, 4]},
            {"name": "dtype", "type": "choice", "values": ["bf16", "fp32"]},
        ],
    }
)


@pytest.mark.parametrize(
    ("base", "want"),
    [
        (
            {"zero_stage": 3, "micro_batch_size": 1, "dtype": "bf16"},
            1,
        ),  # ZeRO-0 in bf16 has no fp32 masters
        (
            {"zero_stage": 1, "micro_batch_size": 1, "dtype": "bf16"},
            3,
        ),  # from the lowest of 1-3, the highest
        (
            {"zero_stage": 0, "micro_batch_size": 1, "dtype": "bf16"},
            None,
        ),  # nothing else trains pure bf16
        (
            {"zero_stage": 3, "micro_batch_size": 1, "dtype": "fp32"},
            0,
        ),  # fp32: every stage is one arithmetic
    ],
)
def test_the_zero_change_never_crosses_zero0_and_zero1_in_16_bit(base, want) -> None:
    changes = dict(honest_change_configs(base, SPACE_16BIT, 4))
    assert changes.get("zero_stage", {}).get("zero_stage") == want


def test_the_eval_tolerance_counts_the_honest_changes_eval_difference() -> None:
    rows = [_row(0, 2.0, [8.0, 7.5]), _row(1, 2.1, [8.0, 7.5])]
    change = _row(2, 1.0, [8.0, 7.5 + 2e-3])
    out = analyse_baseline(rows, honest_changes=[("zero_stage", change)])
    (c,) = out.honest_changes
    assert c.eval_loss_abs_diff == pytest.approx(2e-3)
    assert out.eval_tolerance == pytest.approx(
        max(LOSS_TOLERANCE_FLOOR, HONEST_CHANGE_FACTOR * 2e-3)
    )
    alone = analyse_baseline(rows)
    assert alone.eval_tolerance == pytest.approx(LOSS_TOLERANCE_FLOOR)


def _fed(row: TrialResult, digests: list[int]) -> TrialResult:
    row.extra.data_digests = digests
    return row


def test_repeatable_data_becomes_the_data_invariants_reference() -> None:
    rows = [_fed(_row(i, 2.0, [8.0, 7.5]), [11, 12]) for i in range(3)]
    split = _fed(_row(9, 2.0, [8.0, 7.5]), [11, 12])
    out = analyse_baseline(rows, honest_changes=[("micro_batch_size", split)])
    assert out.data_order is not None and out.data_order.repeatable
    assert out.data_order.same_under_honest_changes is True
    assert out.reference_data_digests == [11, 12]


def test_data_that_change_between_identical_runs_are_named() -> None:
    rows = [
        _fed(_row(0, 2.0, [8.0, 7.5]), [11, 12, 13]),
        _fed(_row(1, 2.0, [8.0, 7.5]), [11, 12, 13]),
        _fed(_row(2, 2.0, [8.0, 7.5]), [11, 99, 98]),
    ]
    out = analyse_baseline(rows)
    assert out.data_order is not None and not out.data_order.repeatable
    assert out.data_order.first_differing_step == 1
    assert out.data_order.differing_trial_ids == ["doctor-0000", "doctor-0002"]
    assert out.reference_data_digests == []


def test_data_that_depend_on_the_batch_split_switch_the_data_invariant_off() -> None:
    rows = [_fed(_row(i, 2.0, [8.0, 7.5]), [11, 12]) for i in range(2)]
    split = _fed(_row(9, 2.0, [8.0, 7.5]), [11, 40])
    out = analyse_baseline(rows, honest_changes=[("micro_batch_size", split)])
    assert out.data_order is not None and out.data_order.repeatable
    assert out.data_order.same_under_honest_changes is False
    assert out.reference_data_digests == []
    # rows of an older harness carry no digests: no check, no reference
    assert analyse_baseline([_row(i, 2.0, [8.0, 7.5]) for i in range(2)]).data_order is None


def test_an_allowed_change_of_arithmetic_is_an_honest_change_where_it_is_valid() -> None:
    """float8 cannot run on the baseline's ZeRO-3 (the space's constraint): the doctor measures
    it on the baseline's ZeRO change instead, so the tolerance covers what float8 moves."""
    space = SearchSpace.from_yaml(ROOT / "search_spaces" / "gpu_dense_1gpu.yaml")
    base = {**space.default_config(), "zero_stage": 3, "micro_batch_size": 1, "dtype": "bf16"}
    changes = dict(honest_change_configs(base, space, 16))
    assert changes["float8_linear"] == {**changes["zero_stage"], "float8_linear": True}
    z1 = {**base, "zero_stage": 1}
    assert dict(honest_change_configs(z1, space, 16))["float8_linear"] == {
        **z1,
        "float8_linear": True,
    }


def test_a_change_of_arithmetic_calibrates_only_its_own_tolerances() -> None:
    """float8's larger loss difference widens the tolerances of float8 candidates only; the
    study's own come from the same-arithmetic changes alone."""
    rows = [_row(0, 2.0, [8.0, 7.5]), _row(1, 2.1, [8.0, 7.5])]
    zero = _row(2, 1.0, [8.0, 7.5 + 1e-3])
    f8 = _row(3, 0.9, [8.0, 7.5 + 2e-2])
    out = analyse_baseline(rows, honest_changes=[("zero_stage", zero), ("float8_linear", f8)])
    assert out.loss_tolerance == pytest.approx(
        max(LOSS_TOLERANCE_FLOOR, HONEST_CHANGE_FACTOR * 1e-3)
    )
    assert out.loss_honest_change_max_abs_diff == pytest.approx(1e-3)
    (tol,) = out.arithmetic_tolerances.values()
    assert set(out.arithmetic_tolerances) == {"float8_linear"}
    assert tol.loss_atol == pytest.approx(HONEST_CHANGE_FACTOR * 2e-2)
    assert tol.eval_atol == pytest.approx(HONEST_CHANGE_FACTOR * 2e-2)  # eval = last loss here
    failed = _row(4, 0.9, [8.0, 7.5], status="failed")
    alone = analyse_baseline(rows, honest_changes=[("float8_linear", failed)])
    assert alone.arithmetic_tolerances == {}  # no ok trial with it on: nothing calibrated
