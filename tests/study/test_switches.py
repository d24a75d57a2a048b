"""The study's switches: one parser with one word list, the environment only as init's default.

End to end: the switches a contract records decide how the stages behave, whatever the environment says
later: the executor's loss guard, the optimizer's analytic prior and the experience bank (warm
start and adding the finished study). Real parts, no Ray: the surrogate backend answers trials,
the bank is built from a study those trials logged.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from infrarsi.bank.feed import add_to_bank
from infrarsi.bank.store import Bank
from infrarsi.errors import ConfigError
from infrarsi.orchestration.executor import StudyExecutor
from infrarsi.orchestration.optimizer_factory import bank_warm_start_configs, build_optimizer
from infrarsi.search import Optimizer
from infrarsi.stages.init import init_stage
from infrarsi.study.contract import Contract
from infrarsi.study.doctor_report import DoctorReport, StepTimeNoise
from infrarsi.study.switches import (
    DEFAULT_BANK,
    OFF_WORDS,
    StudySwitches,
    parse_bank,
    parse_switch,
    prior_from_environment,
)
from infrarsi.study.trial_log import read_results


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
    assert (
        parse_bank(" s3://bucket/bank ", what="--bank") == "s3://bucket/bank"
    )  # shared across clusters
    with pytest.raises(ConfigError, match="scheme and a path"):
        parse_bank("s3://", what="--bank")
    with pytest.raises(ConfigError, match="local directory"):
        parse_bank("  ", what="--bank")


def test_bank_paths_are_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_bank("rel/bank", what="--bank") == str(tmp_path / "rel/bank")
    assert parse_bank("~/b", what="--bank") == str(Path.home() / "b")


def test_resolve_explicit_then_environment_then_default(tmp_path: Path) -> None:
    env = {"INFRARSI_PRIOR": "off", "INFRARSI_LOSS_GUARD": "0", "INFRARSI_BANK": str(tmp_path)}
    assert StudySwitches.resolve(environ=env) == StudySwitches(
        analytic_prior=False, loss_guard=False, bank=str(tmp_path)
    )
    assert StudySwitches.resolve(
        analytic_prior=True, loss_guard=True, bank="off", environ=env
    ) == StudySwitches(analytic_prior=True, loss_guard=True, bank=None)
    assert StudySwitches.resolve(environ={"INFRARSI_BANK": ""}) == StudySwitches(
        analytic_prior=True, loss_guard=True, bank=str(Path(DEFAULT_BANK).expanduser())
    )
    assert prior_from_environment({"INFRARSI_PRIOR": "no"}) is False
    assert prior_from_environment({}) is True
    with pytest.raises(ConfigError, match="INFRARSI_LOSS_GUARD"):
        StudySwitches.resolve(environ={"INFRARSI_LOSS_GUARD": "sometimes"})


FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "stages" / "surrogate_small.yaml"
FAST = {"zero_stage": 1, "micro_batch_size": 2, "activation_checkpointing": "selective"}


def _doctor_report(study: Path) -> None:
    """A doctor's report with a baseline loss trace (what turns the loss guard on)."""
    rows = [r for r in read_results(study) if r.stage == "doctor"]
    DoctorReport(
        trials=len(rows),
        ok_trials=len(rows),
        statuses={"ok": len(rows)},
        step_time_s=StepTimeNoise(median=float(rows[0].step_time_s or 1.0)),
        noise_margin=0.01,
        reference_loss=list(rows[0].loss),
        baseline_trial_wall_s=10.0,
    ).save(study)


@pytest.fixture(scope="module")
def bank(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bank holding one finished surrogate study (2 baseline trials, 1 faster config)."""
    root = tmp_path_factory.mktemp("switches")
    src = root / "source"
    init_stage(FIXTURE, src, bank="off")
    ex = StudyExecutor(src, check=False)
    try:
        base = ex.full_config(dict(ex.workload.baseline))
        for _ in range(2):
            ex.run_trial(base, "doctor")
        ex.run_trial(ex.full_config({**base, **FAST}), "run")
    finally:
        ex.close()
    _doctor_report(src)
    Bank(root / "bank").add_study(src)
    return root / "bank"


def _study(tmp_path: Path, name: str, bank: Path, on: bool) -> Path:
    d = tmp_path / name
    init_stage(FIXTURE, d, analytic_prior=on, loss_guard=on, bank=str(bank) if on else "off")
    ex = StudyExecutor(d, check=False)
    try:
        ex.run_trial(ex.full_config(dict(ex.workload.baseline)), "doctor")
    finally:
        ex.close()
    _doctor_report(d)
    return d


def test_switches_off_in_the_contract_stay_off(
    tmp_path: Path, bank: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = _study(tmp_path, "off", bank, on=False)
    for name, value in (
        ("INFRARSI_PRIOR", "on"),
        ("INFRARSI_LOSS_GUARD", "on"),
        ("INFRARSI_BANK", str(bank)),
    ):
        monkeypatch.setenv(name, value)
    contract = Contract.load(d)
    ex = StudyExecutor(d)
    try:
        assert ex.reference is not None and ex.reference.reference_loss
        assert ex.loss_guard() is None
    finally:
        ex.close()
    elsewhere = [
        dataclasses.replace(r, hardware={**r.hardware, "device": "other-gpu"})
        for r in read_results(d)
    ]
    opt = build_optimizer(contract, elsewhere, study_dir=d)
    assert type(opt) is Optimizer and opt.prior is None
    assert bank_warm_start_configs(contract, opt.space, elsewhere) == []
    files = sorted(bank.iterdir())
    assert add_to_bank(d) == {"disabled": True} and sorted(bank.iterdir()) == files


def test_switches_on_in_the_contract_stay_on(
    tmp_path: Path, bank: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = _study(tmp_path, "on", bank, on=True)
    for name in ("INFRARSI_PRIOR", "INFRARSI_LOSS_GUARD", "INFRARSI_BANK"):
        monkeypatch.setenv(name, "off")
    contract = Contract.load(d)
    ex = StudyExecutor(d)
    try:
        guard = ex.loss_guard()
        assert guard is not None and guard.reference == ex.reference.reference_loss  # type: ignore[union-attr]
    finally:
        ex.close()
    opt = build_optimizer(contract, [], study_dir=d)
    assert opt.prior is not None
    # The bank seeds a study on OTHER hardware: this one's rows, as if measured on another GPU.
    elsewhere = [
        dataclasses.replace(r, hardware={**r.hardware, "device": "other-gpu"})
        for r in read_results(d)
    ]
    prior = bank_warm_start_configs(contract, opt.space, elsewhere)
    assert {p["source_study"] for p in prior} == {"source"}
    assert all(prior[0]["config"][k] == v for k, v in FAST.items())  # the faster config first
    assert add_to_bank(d)["rows"] == 1 and len(Bank(bank).files()) == 2
