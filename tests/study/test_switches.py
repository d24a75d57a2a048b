"""The study's switches: one parser with one word list, the environment only as init's default."""

from __future__ import annotations

from pathlib import Path

import pytest

from infrarsi.errors import ConfigError
from infrarsi.study.switches import (
    DEFAULT_BANK,
    OFF_WORDS,
    StudySwitches,
    parse_bank,
    parse_switch,
    prior_from_environment,
)


@pytest.mark.parametrize("word", [*OFF_WORDS, " OFF ", "False"])
def test_off_words_turn_every_switch_off(word: str) -> None:
    assert parse_switch(word, what="x") is False
    assert parse_bank(word, what="x") is None


@pytest.mark.parametrize("word", ["on", "1", "true", "YES", "enabled"])
def test_on_words(word: str) -> None:
    assert parse_switch(word, what="x") is True


def test_a_word_that_is_neither_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError) as e:
        parse_switch("maybe", what="environment variable INFRARSI_PRIOR")
    assert "INFRARSI_PRIOR" in str(e.value) and "'maybe'" in str(e.value) and "Fix" in str(e.value)
    with pytest.raises(ConfigError, match="local directory"):
        parse_bank("s3://bucket/bank", what="--bank")
    with pytest.raises(ConfigError, match="local directory"):
        parse_bank("  ", what="--bank")


def test_bank_paths_are_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_bank("rel/bank", what="--bank") == str(tmp_path / "rel/bank")
    assert parse_bank("~/b", what="--bank") == str(Path.home() / "b")


def test_resolve_explicit_then_environment_then_default(tmp_path: Path) -> None:
    env = {"INFRARSI_PRIOR": "off", "INFRARSI_LOSS_GUARD": "0", "INFRARSI_BANK": str(tmp_path)}
    assert StudySwitches.resolve(environ=env) == StudySwitches(analytic_prior=False, loss_guard=False,
                                                               bank=str(tmp_path))
    assert StudySwitches.resolve(analytic_prior=True, loss_guard=True, bank="off", environ=env) == \
        StudySwitches(analytic_prior=True, loss_guard=True, bank=None)
    assert StudySwitches.resolve(environ={"INFRARSI_BANK": ""}) == StudySwitches(
        analytic_prior=True, loss_guard=True, bank=str(Path(DEFAULT_BANK).expanduser()))
    assert prior_from_environment({"INFRARSI_PRIOR": "no"}) is False
    assert prior_from_environment({}) is True
    with pytest.raises(ConfigError, match="INFRARSI_LOSS_GUARD"):
        StudySwitches.resolve(environ={"INFRARSI_LOSS_GUARD": "sometimes"})
