"""What the stage commands print: the doctor's data-order row and tune's closing summary."""

from __future__ import annotations

from pathlib import Path

from infrarsi.cli.app import console
from infrarsi.cli.summaries import print_doctor, tune_summary
from infrarsi.study.doctor_report import DataOrder, DoctorReport


def _printed(report: DoctorReport) -> str:
    with console.capture() as cap:
        print_doctor(report)
    return " ".join(cap.get().split())


def test_the_doctor_says_whether_candidates_must_feed_the_baselines_data() -> None:
    base = {"trials": 2, "ok_trials": 2}
    checked = DoctorReport(
        **base, data_order=DataOrder(repeatable=True), reference_data_digests=[1]
    )
    assert "every candidate must feed the baseline's data" in _printed(checked)
    split = DoctorReport(
        **base, data_order=DataOrder(repeatable=True, same_under_honest_changes=False)
    )
    assert "not checked for candidates" in _printed(split)
    assert "not recorded" in _printed(DoctorReport(**base))


def test_tune_summary_without_a_winner_says_so_and_where_the_report_is() -> None:
    out = {"run": {"baseline_step_time_s": 2.0}, "verify": {"best": None}, "report_html": "r.html"}
    rows = dict(tune_summary(out, Path("study.log")))
    assert rows["baseline"] == "2.0000 s/step"
    assert rows["verified best"].startswith("none:")
    assert rows["long check"].startswith("not run")
    assert (rows["report"], rows["full log"]) == ("r.html", "study.log")
