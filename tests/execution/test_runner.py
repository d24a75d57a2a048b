"""TrialRunner checks that need no Ray: validation, knob environment, code directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from infrarsi.errors import KnobError, SearchSpaceError
from infrarsi.execution.runner import TrialRunner, default_code_dir, default_timeout_s, knob_env
from infrarsi.workload import Workload

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dense() -> Workload:
    return Workload.from_yaml(ROOT / "workloads" / "dense_debug.yaml")


def test_validate_fills_every_knob_and_rejects_bad_input_before_ray(dense):
    runner = TrialRunner(dense)
    full = runner.validate({"zero_stage": 2, "micro_batch_size": 4})
    assert set(full) == set(runner.space.names)
    assert full["zero_stage"] == 2 and full["micro_batch_size"] == 4
    with pytest.raises(SearchSpaceError, match="no_such_knob"):
        runner.run({"no_such_knob": 1}, trial_id="x")
    with pytest.raises(SearchSpaceError, match="zero_stage"):
        runner.run({"zero_stage": 9}, trial_id="x")
    assert runner._pool is None  # nothing was started
    runner.close()


def test_a_knob_without_handler_fails_before_any_trial(dense, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("name: s\nobjective: step_time\nknobs:\n  - name: warp_drive\n    type: bool\n")
    wl = Workload.from_dict({**dense.to_yaml_dict(), "search_space": str(space)}, source=str(tmp_path / "wl.yaml"))
    with pytest.raises(KnobError, match="warp_drive"):
        TrialRunner(wl)


def test_knob_env_and_defaults(dense):
    assert knob_env({"threads_per_worker": 2, "zero_stage": 1}, dense) == {"OMP_NUM_THREADS": "2"}
    assert (Path(default_code_dir(dense)) / "workloads" / "__init__.py").exists()
    assert default_timeout_s(dense) > 0
