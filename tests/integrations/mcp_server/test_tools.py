"""The tools' bodies, called directly (the SDK round trip is tests/test_mcp_server.py): every
tool has its hints, the report never competes with a writer, predictions come as one object."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from infrarsi.errors import StudyLockedError
from infrarsi.integrations.mcp_server.tools import HINTS, StudyTools


def test_every_tool_has_its_hints_and_every_parameter_a_description() -> None:
    methods = {
        n for n, _ in inspect.getmembers(StudyTools, inspect.isfunction) if not n.startswith("_")
    }
    assert set(HINTS) == methods
    assert [n for n, h in HINTS.items() if h.read_only] == [
        "state",
        "predict",
        "watch",
    ]


def test_the_report_is_refused_while_another_writer_holds_the_study(study: Path) -> None:
    from infrarsi.study.lock import hold_study

    with (
        hold_study(study, "run"),
        pytest.raises(StudyLockedError, match=r"held by `run`.*call watch"),
    ):
        StudyTools(study.resolve()).report()
    assert not (study / "report.md").exists()


def test_predictions_come_back_as_one_object_in_the_order_asked(study: Path) -> None:
    out = StudyTools(study.resolve()).predict([{"micro_batch_size": 4}, {}])
    assert [p["config"]["micro_batch_size"] for p in out["predictions"]] == [4, 1]


def test_watch_on_a_quiet_study_shows_no_job_and_the_whole_budget(study: Path) -> None:
    seen = StudyTools(study.resolve()).watch()
    assert seen["job"] is None and seen["held_by"] is None and seen["in_flight"] == []
    assert (seen["run_trials_done"], seen["run_trials_left"], seen["last_trials"]) == (0, 4, [])
