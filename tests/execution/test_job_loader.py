"""Tests of the job loader's checks before any trial.

An entry point outside the repository imports and passes ``preflight``; each broken one is a
``JobError`` naming the workload file, the field and the fix, and ``infrarsi init`` exits 2 with it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infrarsi.cli import app
from infrarsi.errors import JobError
from infrarsi.execution.job_loader import preflight
from infrarsi.workload import Workload
from tests.outside_job import SEQ_LEN, SEQUENCES, write_tiny_workload


def test_an_entry_point_outside_the_repository_passes_preflight(tmp_path: Path) -> None:
    wl = Workload.from_yaml(write_tiny_workload(tmp_path))
    job = preflight(wl)
    assert (job.shape.dim, job.shape.vocab_size) == (32, 64)
    b = job.global_batch(0, SEQUENCES) if job.global_batch else None
    assert b is not None and tuple(b.inputs.shape) == (SEQUENCES, SEQ_LEN)
    model = job.build_model()
    assert Path(sys.modules[type(model).__module__].__file__ or "").parent == tmp_path / "my_job"


BROKEN = [
    ("missing_module", "no_such_job:make_job", ["cannot import module 'no_such_job'", "my_job"]),
    (
        "missing_function",
        "tiny_job:no_such_function",
        ["has no function 'no_such_function'", "tiny_job.py"],
    ),
    (
        "wrong_return_type",
        "tiny_job:returns_a_dict",
        ["returned dict, not infrarsi.job.TrainingJob"],
    ),
    (
        "non_module_model",
        "tiny_job:builds_no_module",
        ["build_model() returned list, not a torch.nn.Module"],
    ),
    (
        "wrong_batch_shape",
        "tiny_job:wrong_batch_shape",
        [f"inputs must be a [{SEQUENCES}, {SEQ_LEN}] tensor", f"got ({SEQUENCES}, {SEQ_LEN + 1})"],
    ),
]


@pytest.mark.parametrize(("case", "entry_point", "needles"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_entry_point_is_a_job_error_naming_the_file_and_field(
    tmp_path: Path, case: str, entry_point: str, needles: list[str]
) -> None:
    path = write_tiny_workload(tmp_path, entry_point)
    with pytest.raises(JobError) as err:
        preflight(Workload.from_yaml(path))
    msg = str(err.value)
    assert f"{path}: model.entry_point" in msg
    for needle in needles:
        assert needle in msg, msg


@pytest.mark.parametrize(("case", "entry_point", "needles"), BROKEN, ids=[b[0] for b in BROKEN])
def test_infrarsi_init_exits_2_on_a_broken_entry_point(
    tmp_path: Path, case: str, entry_point: str, needles: list[str]
) -> None:
    path = write_tiny_workload(tmp_path, entry_point)
    study = tmp_path / "study"
    res = CliRunner().invoke(app, ["init", str(path), "--study", str(study)])
    assert res.exit_code == 2, res.output
    out = "".join(res.output.split())  # the console wraps long lines
    assert f"{path}:model.entry_point" in out, res.output
    assert "".join(needles[0].split()) in out, res.output
    assert not (study / "contract.yaml").exists()
