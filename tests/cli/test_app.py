"""The root of the CLI (``infrarsi.cli.app``): ``--version``, exit codes in the help, a directory
that is not a study (exit 2), Ctrl-C (exit 130, how to resume) and output never wrapped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from malformed import refused
from typer.testing import CliRunner

from infrarsi.cli import app
from infrarsi.cli.app import (
    EXIT_CODES,
    EXIT_INTERRUPTED,
    PIPE_WIDTH,
    _Console,
    command,
    handle_errors,
    package_version,
)

ROOT = Path(__file__).resolve().parents[2]


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_version_prints_the_package_version() -> None:
    from importlib.metadata import version

    res = _invoke("--version")
    assert res.exit_code == 0, res.output
    assert res.output.strip() == f"infrarsi {version('infrarsi')}"


def test_version_falls_back_to_the_module_attribute(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    import infrarsi

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    monkeypatch.setattr(infrarsi, "__version__", "9.9.9", raising=False)
    assert package_version() == "9.9.9"


def test_root_help_documents_every_exit_code() -> None:
    res = _invoke("--help")
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    for code in (0, 1, 2, 130):
        assert code in EXIT_CODES
        assert f"{code} " in text, (code, res.output)
    assert "Exit codes" in text and "--resume" in text


STUDY_COMMANDS = [
    ["doctor"],
    ["run"],
    ["verify"],
    ["report"],
    ["apply", "--repo", "."],
    ["state"],
    ["propose", "--why", "because"],
    ["mcp"],
]


@pytest.mark.parametrize("cmd", STUDY_COMMANDS, ids=lambda c: c[0])
def test_a_directory_without_a_contract_is_not_a_study(cmd: list[str], tmp_path: Path) -> None:
    res = _invoke(cmd[0], str(tmp_path), *cmd[1:])
    refused(res, str(tmp_path), "not a study", "contract.yaml", "infrarsi init")


@pytest.mark.parametrize("cmd", STUDY_COMMANDS, ids=lambda c: c[0])
def test_a_missing_directory_is_not_a_study(cmd: list[str], tmp_path: Path) -> None:
    refused(_invoke(cmd[0], str(tmp_path / "nowhere"), *cmd[1:]), "nowhere", "does not exist")


def test_ctrl_c_exits_130_and_says_how_to_resume(
    study: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import infrarsi.stages.run

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(infrarsi.stages.run, "run_stage", interrupted)
    res = _invoke("run", str(study))
    assert res.exit_code == EXIT_INTERRUPTED == 130, res.output
    assert f"infrarsi run {study} --resume" in res.output.replace("\n", "")


def test_ctrl_c_outside_a_study_exits_130() -> None:
    def boom() -> None:
        raise KeyboardInterrupt

    probe = typer.Typer()
    probe.command()(handle_errors(boom))
    res = CliRunner().invoke(probe, [])
    assert res.exit_code == 130 and "interrupted" in res.output and "--resume" not in res.output


def test_an_error_is_printed_verbatim_not_as_markup() -> None:
    from infrarsi.errors import ConfigError

    @command("probe-markup", hidden=True)
    def probe() -> None:
        raise ConfigError("--x: rule: one of [bold] or [min, max]; Fix: --x '[1, 2]'")

    try:
        res = _invoke("probe-markup")
    finally:
        app.registered_commands[:] = [
            c for c in app.registered_commands if c.name != "probe-markup"
        ]
    assert res.exit_code == 2
    assert "one of [bold] or [min, max]; Fix: --x '[1, 2]'" in res.output


def _piped(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "infrarsi", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
    )


def test_piped_errors_are_never_wrapped(tmp_path: Path) -> None:
    proc = _piped(
        "init",
        "workloads/dense_debug.yaml",
        "--study",
        str(tmp_path / "a-rather-long-study-name"),
        "--memory-capacity",
        "160",
    )
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and len(lines[0]) > 80, proc.stderr
    assert "--memory-capacity 160MiB? --memory-capacity 160GB?" in lines[0]


def test_piped_tables_are_not_folded_at_80_columns() -> None:
    con = _Console(file=open(os.devnull, "w"))  # noqa: SIM115 - closed below
    try:
        if "COLUMNS" not in os.environ:
            assert con.width == PIPE_WIDTH
        con.size = (50, 20)
        assert con.width == 50
    finally:
        con.file.close()


def test_quiet_by_default_verbose_shows_every_event_and_the_study_log_keeps_them(
    study: Path,
) -> None:
    """A command given a study logs every event to DIR/logs/infrarsi.jsonl; the terminal shows
    info events only with -v (warnings always)."""
    import json

    from infrarsi.structlog_config import get_logger

    @command("probe-log", hidden=True)
    def probe(study: Path = typer.Argument(...)) -> None:
        get_logger("probe").info("probe.info_event", step_time_s=1.5)
        get_logger("probe").warning("probe.warning_event")
        print("result")

    try:
        quiet = _invoke("probe-log", str(study))
        loud = _invoke("-v", "probe-log", str(study))
    finally:
        app.registered_commands[:] = [c for c in app.registered_commands if c.name != "probe-log"]
        from infrarsi.structlog_config import configure_logging

        configure_logging(verbose=True)  # the library's default, for the tests after these
    assert quiet.exit_code == 0 and loud.exit_code == 0, quiet.output + loud.output
    assert "probe.info_event" not in quiet.output and "probe.warning_event" in quiet.output
    assert quiet.stdout == "result\n"
    assert "probe.info_event" in loud.output and "probe.warning_event" in loud.output
    events = [
        json.loads(line) for line in (study / "logs" / "infrarsi.jsonl").read_text().splitlines()
    ]
    assert [e["event"] for e in events] == ["probe.info_event", "probe.warning_event"] * 2
    assert events[0]["step_time_s"] == 1.5 and events[0]["logger"] == "probe"


def test_root_help_names_verbose_and_the_environment_variables() -> None:
    from infrarsi.cli.app import ENV_VARS

    res = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    assert "--verbose" in res.output and "-v" in res.output and "logs/infrarsi.jsonl" in res.output
    for var in ("INFRARSI_BANK", "INFRARSI_PRIOR", "INFRARSI_LOSS_GUARD", "RAY_ADDRESS"):
        assert var in ENV_VARS and f"{var}:" in res.output, var


def test_env_help_refuses_a_variable_the_root_help_does_not_list() -> None:
    from infrarsi.cli.app import env_help

    assert env_help("The bank.", "INFRARSI_BANK") == r"The bank. \[env var: INFRARSI_BANK]"
    with pytest.raises(KeyError, match="ENV_VARS"):
        env_help("x", "INFRARSI_UNKNOWN")


def test_print_json_writes_one_line_dataclasses_as_objects(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json
    from dataclasses import dataclass

    from infrarsi.cli.app import print_json

    @dataclass
    class Out:
        path: Path
        n: int

    print_json(Out(Path("/tmp/x"), 3))
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and json.loads(out) == {"path": "/tmp/x", "n": 3}
