"""``DoctorReport``: doctor.json written and read through one typed record; old files load; a
missing or malformed file is a ``StudyError`` naming the file, the field, the rule, the value and
the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infrarsi.errors import StudyError
from infrarsi.study.doctor_report import DoctorReport, StepTimeNoise, Stragglers, ToleranceInForce

OLD_FORMAT = {
    # The keys an earlier doctor wrote (tests/synthetic_study.py keeps the same shape), plus a key
    # this version does not know: both must load.
    "trials": 3,
    "ok_trials": 3,
    "statuses": {"ok": 3},
    "baseline_config": {"zero_stage": 3},
    "step_time_s": {
        "median": 2.05,
        "per_trial": [2.0, 2.05, 2.1],
        "run_to_run_cv": 0.024,
        "within_trial_cv": 0.02,
    },
    "noise_margin": 0.05,
    "stragglers": {"flag": False, "rank": None, "spread": 0.01, "rule": "slowest"},
    "phase_times_s": {"forward": 0.6},
    "peak_memory_bytes": 322122547,
    "mfu": 0.005,
    "peak_flops_per_s": 5e10,
    "loss_tolerance": 1e-4,
    "loss_tolerance_floor": 1e-5,
    "loss_run_to_run_max_abs_diff": 1e-7,
    "reference_loss": [8.3, 8.25],
    "reference_eval_loss": 7.9,
    "baseline_trial_wall_s": 20.0,
    "loss_tolerance_in_force": {"atol": 1e-4, "rtol": 0.0, "source": "doctor"},
    "eval_tolerance_in_force": {"atol": 1e-3, "rtol": 0.0},
    "how_measured": "3 separate baseline trials.",
    "a_key_from_a_later_version": 1,
}


def _write(study: Path, data: object) -> Path:
    study.mkdir(parents=True, exist_ok=True)
    p = study / "doctor.json"
    p.write_text(json.dumps(data))
    return p


def test_old_format_loads_and_saves_with_the_same_keys(tmp_path: Path) -> None:
    _write(tmp_path, OLD_FORMAT)
    r = DoctorReport.load(tmp_path)
    assert r.baseline_step_time_s == 2.05 and r.noise_margin == 0.05
    assert r.reference_loss == [8.3, 8.25] and r.reference_eval_loss == 7.9
    assert r.loss_tolerance_in_force == ToleranceInForce(atol=1e-4, rtol=0.0, source="doctor")
    assert r.stragglers is not None and r.stragglers.flag is False
    assert r.device_memory_capacity_bytes is None  # not recorded by old doctors
    r.save(tmp_path)
    again = json.loads((tmp_path / "doctor.json").read_text())
    known = set(OLD_FORMAT) - {"a_key_from_a_later_version"}
    assert known <= set(again)
    for key in known - {"stragglers", "eval_tolerance_in_force"}:  # these gain their new defaults
        assert again[key] == OLD_FORMAT[key], key
    assert DoctorReport.load(tmp_path) == r


def test_roundtrip_of_a_full_report(tmp_path: Path) -> None:
    r = DoctorReport(
        trials=2,
        ok_trials=2,
        statuses={"ok": 2},
        step_time_s=StepTimeNoise(median=1.5, per_trial=[1.4, 1.6], run_to_run_cv=0.09),
        noise_margin=0.09,
        stragglers=Stragglers(reason="fewer than two ranks"),
        device_memory_capacity_bytes=80 * 2**30,
        reference_loss=[1.0, 0.9],
    )
    r.save(tmp_path)
    assert DoctorReport.load(tmp_path) == r
    assert DoctorReport.load_if_present(tmp_path) == r


def test_missing_report_says_run_doctor(tmp_path: Path) -> None:
    assert DoctorReport.load_if_present(tmp_path) is None
    with pytest.raises(StudyError) as e:
        DoctorReport.load(tmp_path)
    assert "doctor.json" in str(e.value) and f"infrarsi doctor {tmp_path}" in str(e.value)


@pytest.mark.parametrize(
    ("change", "field", "rule", "value"),
    [
        ({"noise_margin": -0.5}, "noise_margin", "greater than or equal to 0", "-0.5"),
        ({"step_time_s": {"median": 0.0}}, "step_time_s.median", "greater than 0", "0.0"),
        ({"ok_trials": "three"}, "ok_trials", "integer", "'three'"),
        ({"ok_trials": 5}, "(top level)", "ok_trials (5) must be <= trials (3)", ""),
        ({"step_time_s": None}, "step_time_s", "required once doctor succeeded", "<absent>"),
    ],
)
def test_malformed_report_names_file_field_rule_value_and_fix(
    tmp_path: Path, change: dict, field: str, rule: str, value: str
) -> None:
    p = _write(tmp_path, {**OLD_FORMAT, **change})
    with pytest.raises(StudyError) as e:
        DoctorReport.load(tmp_path)
    msg = str(e.value)
    assert str(p) in msg and f"field {field!r}" in msg and rule in msg and value in msg
    assert f"re-run `infrarsi doctor {tmp_path}`" in msg


def test_not_json_and_not_an_object(tmp_path: Path) -> None:
    p = tmp_path / "doctor.json"
    p.write_text("{not json")
    with pytest.raises(StudyError, match="must be JSON"):
        DoctorReport.load(tmp_path)
    _write(tmp_path, [1, 2])
    with pytest.raises(StudyError, match="must be a JSON object; got list"):
        DoctorReport.load_if_present(tmp_path)


def test_failed_analysis_is_written_apart(tmp_path: Path) -> None:
    partial = DoctorReport(trials=3, ok_trials=1, statuses={"ok": 1, "oom": 2})
    partial.save_failed(tmp_path)
    assert not (tmp_path / "doctor.json").exists()
    assert DoctorReport.read(tmp_path / "doctor.failed.json") == partial
