"""The audit's bank blocks read ``bank_warm_start.json`` as a ``WarmStartRecord``; a damaged one
is named in the audit, which goes on from the trial log."""

from __future__ import annotations

import time
from pathlib import Path

from synthetic_study import BEST, make_study, row

from infrarsi.report.bank_section import bank_blocks
from infrarsi.report.data import load_study
from infrarsi.report.document import Para, Table
from infrarsi.result import TrialExtra
from infrarsi.search.ask_info import AskInfo, WarmStartOrigin
from infrarsi.study.paths import StudyPaths
from infrarsi.study.trial_log import TrialLogWriter
from infrarsi.study.warm_start_record import (
    TimeRankCheckRecord,
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


def test_the_transfer_says_whether_the_banks_own_trials_earned_it_trust(tmp_path: Path) -> None:
    """The rank check of the bank's own trials is reported: trusted from the start, or started at
    weight 0 because the formulas ranked the bank's trials no better than chance."""
    for trusted, said in ((True, "trusted from the start"), (False, "no better than chance")):
        d = make_study(tmp_path / str(trusted))
        check = TimeRankCheckRecord(
            kendall_tau=0.41 if trusted else -0.05,
            p_value=1e-4 if trusted else 0.7,
            trials=48,
            trusted=trusted,
        )
        record = WarmStartRecord(
            bank="/banks/b",
            transfer=TransferSummary(
                sources=[TransferSource(study="s0", rows=24)], time_rank_check=check
            ),
        )
        StudyPaths(d).bank_warm_start.write_text(record.model_dump_json())
        text = " ".join(b.text for b in bank_blocks(load_study(d)) if isinstance(b, Para))
        assert said in text and "bank's own 48 trials" in text
        assert f"tau {check.kendall_tau:.2f}" in text


def test_a_damaged_record_is_named_and_the_audit_goes_on(tmp_path: Path) -> None:
    d = make_study(tmp_path)
    path = StudyPaths(d).bank_warm_start
    path.write_text('{"used": 3}')
    blocks = bank_blocks(load_study(d))
    assert len(blocks) == 1 and isinstance(blocks[0], Para)
    assert str(path) in blocks[0].text and "'used'" in blocks[0].text


def test_a_mapped_warm_start_is_listed_with_the_transfer_not_as_a_bank_entry(
    tmp_path: Path,
) -> None:
    """A run trial asked as a mapped warm start (no bank study measured its config) gets its own
    line with what it measured; the bank entry whose turn it took reads so, not "budget spent"."""
    d = make_study(tmp_path)
    record = WarmStartRecord(
        bank="/banks/b",
        used=[WarmStartEntry(config={"zero_stage": 9}, source_study="s0", trial_id="run-7")],
        transfer=TransferSummary(sources=[TransferSource(study="s0", rows=4, dropped=0)]),
    )
    StudyPaths(d).bank_warm_start.write_text(record.model_dump_json())
    origin = WarmStartOrigin(source_study="s0", similarity=1.0, rule="mapped")
    info = AskInfo(config=BEST, phase="warm_start", ask_index=9, warm_start_origin=origin)  # type: ignore[arg-type]
    with TrialLogWriter(d) as w:
        w.write(
            row(
                "run-9",
                "run",
                BEST,
                time.time(),
                step=0.5,
                extra=TrialExtra(ask_info=info.to_dict()),
            )
        )
    blocks = bank_blocks(load_study(d))
    assert isinstance(blocks[0], Para) and "1 entries" in blocks[0].text  # the bank's one only
    here = next(b for b in blocks if isinstance(b, Table) and b.headers[-1] == "here")
    assert here.rows[0][-1].startswith("not tried (its turn asked a mapped warm start")
    mapped = [b.text for b in blocks if isinstance(b, Para) and "Mapped warm starts" in b.text]
    assert len(mapped) == 1 and "run-9 (4.10x vs baseline)" in mapped[0], mapped
