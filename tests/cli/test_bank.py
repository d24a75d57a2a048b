"""``infrarsi bank ingest | query | stats``: a round trip through the CLI, idempotent; bad input exits 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from synthetic_study import BEST, make_study

from infrarsi.cli import app


def _flat(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("uri", [False, True])
def test_ingest_query_stats_round_trip_is_idempotent(tmp_path: Path, uri: bool) -> None:
    make_study(tmp_path / "studies", "a", hw="box-a")
    make_study(tmp_path / "studies", "b", hw="box-b")
    bank = (tmp_path / "bank").as_uri() if uri else str(tmp_path / "bank")
    for _ in range(2):  # ingest twice: the same bank
        res = _invoke("bank", "ingest", str(tmp_path / "studies"), "--bank", bank, "--json")
        assert res.exit_code == 0, res.output
        assert [o["rows"] for o in json.loads(res.output)] == [15, 15]
    res = _invoke("bank", "stats", "--bank", bank, "--json")
    assert res.exit_code == 0, res.output
    stats = json.loads(res.output)
    assert (stats["studies"], stats["rows"], stats["files"]) == (2, 30, 2)
    assert stats["hardware"] == {"box-a": 15, "box-b": 15} and stats["workloads"] == {
        "dense_debug": 30
    }
    assert stats["rows_by_status"]["ok"] == 24
    res = _invoke(
        "bank",
        "query",
        "--bank",
        bank,
        "--device",
        "box-b",
        "--status",
        "ok",
        "--limit",
        "50",
        "--json",
    )
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert len(rows) == 12 and {r["study"] for r in rows} == {"b"}
    assert any(r["config"] == BEST for r in rows) and all(
        r["hw_device_name"] == "box-b" for r in rows
    )
    res = _invoke("bank", "query", "--bank", bank, "--workload", "dense", "--limit", "2")
    assert res.exit_code == 0, res.output
    assert "2 rows" in _flat(res.output)
    res = _invoke("bank", "stats", "--bank", bank)
    assert res.exit_code == 0 and "2 studies, 30 rows" in _flat(res.output)


def test_ingest_defaults_to_the_studys_bank(tmp_path: Path) -> None:
    from infrarsi.study.switches import StudySwitches

    s = make_study(
        tmp_path,
        "a",
        switches=StudySwitches(
            analytic_prior=True, loss_guard=True, bank=str(tmp_path / "its-bank")
        ),
    )
    res = _invoke("bank", "ingest", str(s))
    assert res.exit_code == 0, res.output
    assert "15 rows" in _flat(res.output) and (tmp_path / "its-bank").is_dir()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["ingest", "{tmp}/nothing-here"], "a study directory"),
        (["ingest", "{study}", "--bank", "off"], "not off"),
        (["ingest", "{study}", "--bank", "nosuchprotocol-xyz://b/x"], "Fix"),
        (["query", "--bank", "{tmp}/b", "--status", "great"], "--status"),
        (["query", "--bank", "{tmp}/b", "--limit", "-1"], "--limit"),
        (["stats", "--bank", "s3://"], "scheme and a path"),
    ],
)
def test_bad_input_exits_2_with_the_rule_and_fix(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    s = make_study(tmp_path, "a")
    res = _invoke("bank", *[a.format(tmp=tmp_path, study=s) for a in args])
    assert res.exit_code == 2, res.output
    assert needle in _flat(res.output) and "rule" in res.output


def test_an_empty_study_is_bad_input(tmp_path: Path) -> None:
    s = make_study(tmp_path, "a")
    for f in (s / "trials").iterdir():
        f.unlink()
    res = _invoke("bank", "ingest", str(s), "--bank", str(tmp_path / "b"))
    assert res.exit_code == 2 and "logged trials" in _flat(res.output)
