"""The doctor stage: its calibration reaches the contract (capacity from the device, tolerance from
an honest change)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infrarsi.study.contract import Contract

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "stages" / "surrogate_small.yaml"
GIB = 2**30


def test_the_capacity_defaults_to_the_memory_the_trials_devices_report(
    tmp_path: Path, monkeypatch
) -> None:
    """No --memory-capacity and none in the workload: the doctor records the device's own memory
    (what the ranks report in each trial's hardware record; here a stand-in 24 GiB device) as a
    contract amendment, never a stand-in "unlimited" number. The honest-change trial runs too."""
    from infrarsi.orchestration.executor import StudyExecutor
    from infrarsi.stages.doctor import doctor_stage
    from infrarsi.stages.init import init_stage

    raw = yaml.safe_load(FIXTURE.read_text())
    raw.pop("memory_capacity")
    raw["search_space"] = str((FIXTURE.parent / raw["search_space"]).resolve())
    wl = tmp_path / "surrogate_small.yaml"
    wl.write_text(yaml.safe_dump(raw))

    real_run = StudyExecutor.run_trial

    def on_a_24gib_device(self, config, stage, **kw):  # the ranks' device query, stood in
        row = real_run(self, config, stage, **kw)
        row["hardware"] = {**row.get("hardware", {}), "memory_per_device_bytes": 24 * GIB}
        return row

    monkeypatch.setattr(StudyExecutor, "run_trial", on_a_24gib_device)
    study = tmp_path / "study"
    init_stage(wl, study)
    assert Contract.load(study).memory_capacity.source == "unlimited"
    report = doctor_stage(study, repeats=2)
    contract = Contract.load(study)
    assert contract.memory_capacity.memory_capacity_bytes == 24 * GIB
    assert contract.memory_capacity.source == "device"
    assert report.device_memory_capacity_bytes == 24 * GIB
    changed = {c.changed: c.config for c in report.honest_changes}
    assert set(changed) == {"micro_batch_size", "zero_stage"}
    assert (
        changed["micro_batch_size"]["micro_batch_size"]
        != report.baseline_config["micro_batch_size"]
    )
    assert changed["zero_stage"]["zero_stage"] != report.baseline_config["zero_stage"]
    assert "honest changes" in contract.amendments[0].reason


@pytest.mark.integration
def test_a_script_whose_data_change_from_run_to_run_is_refused_naming_the_fix(
    tmp_path: Path,
) -> None:
    """The example script with ``--data_seed -1`` (a new data seed each run, as an unseeded shuffle
    does): two identical baseline runs feed different token ids, so ``doctor`` exits 2 naming the
    step, the two trials and the fix, and writes its analysis to doctor.failed.json."""
    import os
    import subprocess
    import sys

    for f in ("ds_train.py", "ds.json"):
        (tmp_path / f).write_text((ROOT / "examples" / "scripts" / f).read_text())
    exe = Path(sys.executable).parent / "infrarsi"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    study = tmp_path / "study"
    line = (
        "deepspeed --num_gpus 2 ds_train.py --deepspeed --deepspeed_config ds.json "
        "--steps 1000 --data_seed -1"
    )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(exe), *args], capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path
        )

    out = cli("init", "--script", line, "--study", str(study), "--bank", "off")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    out = cli("doctor", str(study), "--repeats", "2", "--no-honest-change")
    said = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 2, said[-3000:]
    assert "fed different data at optimizer step 0" in said, said[-3000:]
    assert "seed the job's shuffling with a constant" in said
    failed = (study / "doctor.failed.json").read_text()
    assert '"repeatable": false' in failed
    assert not (study / "doctor.json").exists()
