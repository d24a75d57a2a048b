"""The audit's bank blocks read ``bank_warm_start.json`` as a ``WarmStartRecord``; a damaged one
is named in the audit, which goes on from the trial log."""

from __future__ import annotations

from pathlib import Path

from synthetic_study import make_study

from infrarsi.report.bank_section import bank_blocks
from infrarsi.report.data import load_study
from infrarsi.report.document import Para, Table
from infrarsi.study.paths import StudyPaths
from infrarsi.study.warm_start_record import (
    TransferSource,
    TransferSummary,
    WarmStartEntry,
    WarmStartRecord,
)


def test_no_record_and_no_warm_start_is_no_block(tmp_path: Path) -> None:
    assert bank_blocks(load_study(make_study(tmp_path))) == []


def test_the_record_gives_the_used_dropped_and_transfer_tables(tmp_path: Path) -> None:
    d = make_study(tmp_path)
    record = WarmStartRecord(
        bank="/banks/b",
        used=[WarmStartEntry(config={"zero_stage": 9}, source_study="s0", trial_id="run-7")],
        dropped=[WarmStartEntry(source_study="s1", trial_id="run-1", reason="no such value")],
        transfer=TransferSummary(sources=[TransferSource(study="s0", rows=4, dropped=1)]),
    )
    StudyPaths(d).bank_warm_start.write_text(record.model_dump_json())
    blocks = bank_blocks(load_study(d))
    assert isinstance(blocks[0], Para) and "Experience bank /banks/b: 1 entries" in blocks[0].text
    tables = {b.headers[-1]: b for b in blocks if isinstance(b, Table)}
    assert tables["here"].rows[0][:2] == ["s0", "run-7"]
    assert tables["why invalid here"].rows[0][0] == "s1, run-1"
    assert tables["its own prior"].rows[0][:4] == ["s0", "-", "4", "1"]
    assert any(
        "4 bank trials of 1 similar studies" in b.text for b in blocks if isinstance(b, Para)
    )


def test_a_damaged_record_is_named_and_the_audit_goes_on(tmp_path: Path) -> None:
    d = make_study(tmp_path)
    path = StudyPaths(d).bank_warm_start
    path.write_text('{"used": 3}')
    blocks = bank_blocks(load_study(d))
    assert len(blocks) == 1 and isinstance(blocks[0], Para)
    assert str(path) in blocks[0].text and "'used'" in blocks[0].text
