"""The report stage on a study where every config ran out of memory (surrogate backend: the
trials are analytic, the contract, the doctor, the Arrow log and the report are real)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infrarsi.errors import StudyError
from infrarsi.study.trial_log import read_trials, rows

SURROGATE = Path(__file__).resolve().parents[1] / "fixtures" / "stages" / "surrogate_small.yaml"


def test_every_trial_out_of_memory_is_said_with_the_savers_to_allow(tmp_path: Path) -> None:
    """A 1 GiB capacity for an 8B model on 8 GPUs, with only micro_batch_size and dtype editable:
    every baseline trial runs out of memory, so the doctor stops; its error and the report both
    say that every trial ran out of memory and name the memory-saver knobs the contract could
    allow (zero_stage, activation_checkpointing, tp, pp, offload_optimizer)."""
    from infrarsi.stages.doctor import doctor_stage
    from infrarsi.stages.init import init_stage
    from infrarsi.stages.report import write_report

    study = tmp_path / "study"
    init_stage(
        SURROGATE,
        study,
        memory_capacity_bytes=1 << 30,
        editable_knobs=["micro_batch_size", "dtype"],
    )
    with pytest.raises(StudyError) as info:
        doctor_stage(study, repeats=2)
    logged = rows(read_trials(study))
    assert len(logged) == 2 and {r.status for r in logged} == {"oom"}
    assert all(r.memory_censored and r.device_seconds > 0 for r in logged)
    savers = {"zero_stage", "activation_checkpointing", "tp", "pp", "offload_optimizer"}
    for text in (str(info.value), write_report(study).markdown.read_text()):
        assert "Every trial ran out of memory: all 2 trials that ran ended 'oom'" in text
        assert "1.00 GiB per device (--memory-capacity)" in text
        fixed = text.split("does not allow yet: ")[1].split(".")[0].split(", ")
        assert set(fixed) == savers
        assert "--knob micro_batch_size --knob dtype --knob " in text
