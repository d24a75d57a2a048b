"""The bank's similar studies as a ``TransferPrior``: absolute outcomes, the source's own prior,
invalid configs dropped."""

from __future__ import annotations

from pathlib import Path

from synthetic_study import BEST, GIB, make_study

from infrarsi.bank.store import Bank
from infrarsi.bank.transfer import bank_transfer_prior
from infrarsi.orchestration.common import baseline_config, scoped_space
from infrarsi.orchestration.optimizer_factory import revalidate_config
from infrarsi.study.contract import Contract
from infrarsi.study.switches import StudySwitches

ROOT = Path(__file__).resolve().parents[2]


def test_bank_studies_become_sources_with_their_trials_and_prior(tmp_path: Path) -> None:
    bank = Bank(tmp_path / "bank")
    bank.add_study(make_study(tmp_path, "a", hw="box-a"))
    d = tmp_path / "new"
    contract = Contract.create(
        ROOT / "workloads/dense_debug.yaml",
        study_dir=d,
        memory_capacity_bytes=GIB,
        switches=StudySwitches(analytic_prior=True, loss_guard=True, bank=str(bank.root)),
    )
    contract.save(d)
    space, base = scoped_space(contract, d), baseline_config(contract, d)
    record, summary = bank_transfer_prior(
        contract,
        space,
        bank_root=bank.root,
        baseline=base,
        hardware=None,
        num_params=None,
        revalidate=revalidate_config,
    )
    assert record is not None and summary is not None
    (src,) = record.sources
    assert src.name == "a" and src.prior is not None  # rebuilt from a's contract
    assert summary["sources"][0]["own_prior"] and summary["sources"][0]["dropped"] == 0
    assert len(src.configs) == 13  # ok and oom trials (failed and invariant violations left out)
    i = next(
        k for k, c in enumerate(src.configs) if space.key(c) == space.key(space.validate(BEST))
    )
    assert src.step_times_s[i] == 0.66 and src.memory_capacity_bytes == GIB  # absolute, as measured
    oom = [k for k, c in enumerate(src.memory_censored) if c]
    assert len(oom) == 1 and src.step_times_s[oom[0]] is None
    # another study on this study's own hardware is a source too; a missing bank is no transfer
    same_hw, _ = bank_transfer_prior(
        contract,
        space,
        bank_root=bank.root,
        baseline=base,
        hardware={"device": "cpu", "device_kind": "box-a", "host": "h1"},
        num_params=None,
        revalidate=revalidate_config,
    )
    assert same_hw is not None and [s.name for s in same_hw.sources] == ["a"]
    assert bank_transfer_prior(
        contract,
        space,
        bank_root=tmp_path / "none",
        baseline=base,
        hardware=None,
        num_params=None,
        revalidate=revalidate_config,
    ) == (None, None)
