"""bank_warm_start.json's typed record: what the run stage writes loads back, records of earlier
versions load, a malformed one is a ``StudyError`` naming the file, field, rule, value and fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infrarsi.errors import StudyError
from infrarsi.study.paths import StudyPaths
from infrarsi.study.warm_start_record import (
    TransferSource,
    TransferSummary,
    WarmStartEntry,
    WarmStartRecord,
)


def _record() -> WarmStartRecord:
    return WarmStartRecord(
        bank="/banks/b1",
        used=[
            WarmStartEntry(
                config={"zero_stage": 1},
                bank_config={"zero_stage": 1, "gone_knob": 2},
                repairs=["dropped unknown knob gone_knob=2"],
                relative_step_time=0.4,
                similarity=0.9,
                source_study="s0",
                source_key="k0",
                trial_id="run-0003",
                hardware_fingerprint="cpu x2",
                same_hardware=False,
            )
        ],
        dropped=[WarmStartEntry(bank_config={"zero_stage": 9}, reason="zero_stage=9 not allowed")],
        transfer=TransferSummary(sources=[TransferSource(study="s0", key="k0", rows=3)]),
        at=1_700_000_000.0,
    )


def test_what_is_written_loads_back_equal(tmp_path: Path) -> None:
    record = _record()
    path = StudyPaths(tmp_path).bank_warm_start
    path.write_text(json.dumps(record.to_dict()))
    back = WarmStartRecord.load_if_present(tmp_path)
    assert back == record
    assert back.same_choice(record.model_copy(update={"at": 5.0}))
    assert not back.same_choice(WarmStartRecord(bank="/banks/b1"))


def test_no_file_is_none(tmp_path: Path) -> None:
    assert WarmStartRecord.load_if_present(tmp_path) is None


def test_an_earlier_versions_record_loads(tmp_path: Path) -> None:
    """The dict an earlier ``record_warm_start`` wrote (no ``same_hardware``, unknown keys of a
    later version ignored)."""
    old = {
        "bank": None,
        "used": [{"config": {"a": 1}, "bank_config": None, "repairs": [], "trial_id": "run-1"}],
        "dropped": [],
        "transfer": None,
        "at": 1.5,
        "a_key_of_a_newer_version": 1,
    }
    StudyPaths(tmp_path).bank_warm_start.write_text(json.dumps(old))
    back = WarmStartRecord.load_if_present(tmp_path)
    assert back is not None and back.used[0].trial_id == "run-1" and back.transfer is None
    assert back.used[0].same_hardware is None and back.at == 1.5


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("{not json", ["must be JSON"]),
        ("[1, 2]", ["must be a JSON object", "list"]),
        (json.dumps({"used": [{"similarity": "high"}]}), ["used.0.similarity", "'high'"]),
        (json.dumps({"used": 3}), ["'used'", "valid list", "3"]),
    ],
)
def test_a_malformed_record_names_file_field_rule_value_and_fix(
    tmp_path: Path, text: str, names: list[str]
) -> None:
    path = StudyPaths(tmp_path).bank_warm_start
    path.write_text(text)
    with pytest.raises(StudyError) as err:
        WarmStartRecord.load_if_present(tmp_path)
    msg = str(err.value)
    assert str(path) in msg and "rule" in msg and "fix: delete the file" in msg
    for name in names:
        assert name in msg, msg
