"""``infrarsi state`` and ``infrarsi propose``: JSON in, JSON out, exit 2 on a broken proposal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from malformed import refused
from typer.testing import CliRunner

from infrarsi.cli import app


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_propose_queues_and_state_shows_it_as_json(study: Path) -> None:
    res = _invoke(
        "propose", str(study), "--config", '{"micro_batch_size": 2}', "--why", "fuller GEMMs"
    )
    assert res.exit_code == 0, res.output
    assert "prop-0001" in res.output
    res = _invoke("state", str(study), "--json")
    assert res.exit_code == 0, res.output
    state = json.loads(res.output)
    assert state["proposals"]["queued"][0]["asked"] == {"micro_batch_size": 2}
    assert state["budget"]["run_trials_left"] == 4


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--config", "{not json"], "--config"),
        (["--config", "[1, 2]"], "JSON object"),
        (["--config", '{"activation_checkpointing": "none"}'], "editable.knobs"),
        (["--config", '{"micro_batch_size": 3}'], "micro_batch_size"),
        (["--config", "{}", "--patch", "/no/such.diff"], "does not exist"),
    ],
)
def test_a_broken_proposal_exits_2_naming_the_rule(
    study: Path, args: list[str], needle: str
) -> None:
    refused(_invoke("propose", str(study), *args, "--why", "because"), needle)


def test_state_refuses_a_predict_that_is_not_a_json_object(study: Path) -> None:
    refused(_invoke("state", str(study), "--predict", "7"), "--predict")


def test_state_predicts_in_text_on_a_new_study(study: Path) -> None:
    """A study with no ok trial has no step-time prediction (null in --json): the text form says
    so instead of failing to format None."""
    res = _invoke("state", str(study), "--predict", '{"micro_batch_size": 4}')
    assert res.exit_code == 0, res.output
    out = res.output.replace("\n", "")
    assert (
        '"micro_batch_size": 4' in out and "step time not predicted yet" in out and "P(fit) " in out
    )


def test_withdraw_takes_a_queued_proposal_back_and_exits_2_for_any_other(study: Path) -> None:
    assert (
        _invoke(
            "propose", str(study), "--config", '{"micro_batch_size": 2}', "--why", "fuller GEMMs"
        ).exit_code
        == 0
    )
    res = _invoke("withdraw", str(study), "prop-0001")
    assert res.exit_code == 0 and "withdrew prop-0001" in res.output, res.output
    refused(_invoke("withdraw", str(study), "prop-0001"), "already withdrawn", "Queued now: none")


def test_propose_refuses_a_duplicate_with_exit_2(study: Path) -> None:
    assert (
        _invoke(
            "propose", str(study), "--config", '{"micro_batch_size": 2}', "--why", "fuller GEMMs"
        ).exit_code
        == 0
    )
    refused(
        _invoke("propose", str(study), "--config", '{"micro_batch_size": 2}', "--why", "again"),
        "duplicate",
        "prop-0001",
        "withdraw prop-0001",
    )
