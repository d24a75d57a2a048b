"""The logging set-up (``infrarsi.structlog_config``): a quiet terminal unless verbose, every event
as a JSON line in the study's log (kept in memory until the study exists), listeners fed before
the terminal's filter, bad options refused naming the flag."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from infrarsi.errors import ConfigError
from infrarsi.structlog_config import (
    STUDY_LOG,
    add_listener,
    configure_logging,
    is_verbose,
    remove_listener,
    study_log,
)


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    yield
    configure_logging(
        "text", "info", verbose=True
    )  # the library's default, for the tests after these


def test_quiet_shows_warnings_only_and_verbose_shows_every_event(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("text", "info", verbose=False)
    log = structlog.get_logger("t")
    log.info("quiet.info_event")
    log.warning("quiet.warning_event")
    err = capsys.readouterr().err
    assert "quiet.info_event" not in err and "quiet.warning_event" in err and not is_verbose()
    configure_logging("json", "info", verbose=True)
    log.info("loud.info_event", step_time_s=1.5)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert json.loads(line)["event"] == "loud.info_event" and is_verbose()
    configure_logging("text", "warning", verbose=True)  # verbose keeps the level asked for
    log.info("below.level")
    assert "below.level" not in capsys.readouterr().err


def test_the_study_log_holds_every_event_once_the_study_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("text", "info", verbose=False)
    log = structlog.get_logger("t")
    study = tmp_path / "s"
    with study_log(study) as sink:
        log.info("before.the_study", n=1)  # no contract yet: kept in memory
        assert not sink.path.exists()
        study.mkdir()
        (study / "contract.yaml").write_text("x: 1\n")
        log.info("after.the_study", n=2)
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("with.a_traceback")
    log.info("after.detach")
    assert sink.path == study.resolve() / STUDY_LOG
    events = [json.loads(line) for line in sink.path.read_text().splitlines()]
    assert [e["event"] for e in events] == [
        "before.the_study",
        "after.the_study",
        "with.a_traceback",
    ]
    assert events[0]["n"] == 1 and events[0]["level"] == "info" and "timestamp" in events[0]
    assert "ValueError: boom" in events[2]["exception"]
    assert "before.the_study" not in capsys.readouterr().err


def test_a_directory_that_never_becomes_a_study_gets_no_log(tmp_path: Path) -> None:
    configure_logging("text", "info", verbose=False)
    with study_log(tmp_path) as sink:
        structlog.get_logger().info("nothing.to_keep")
    assert not sink.path.exists() and not (tmp_path / "logs").exists()


def test_listeners_get_events_the_terminal_hides(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("text", "info", verbose=False)
    got: list[dict] = []
    add_listener(got.append)
    try:
        structlog.get_logger().info("trial.end", status="ok")
    finally:
        remove_listener(got.append)
    structlog.get_logger().info("trial.end", status="late")
    assert [e["status"] for e in got] == ["ok"]
    assert "trial.end" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("fmt", "level", "flag"), [("xml", "info", "--log-format"), ("text", "loud", "--log-level")]
)
def test_bad_options_are_refused_naming_the_flag(fmt: str, level: str, flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        configure_logging(fmt, level)


def test_attaching_a_study_twice_writes_each_event_once(tmp_path: Path) -> None:
    """The CLI attaches the study's log and ``tune_stage`` attaches it again inside: one sink."""
    configure_logging("text", "info", verbose=False)
    (tmp_path / "contract.yaml").write_text("x: 1\n")
    log = structlog.get_logger()
    with study_log(tmp_path) as outer:
        with study_log(tmp_path) as inner:
            assert inner is outer
            log.info("inside.both")
        log.info("inside.outer")
    log.info("after.both")
    events = [json.loads(line)["event"] for line in outer.path.read_text().splitlines()]
    assert events == ["inside.both", "inside.outer"]
