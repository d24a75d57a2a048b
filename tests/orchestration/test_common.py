"""The stages' shared helpers: the scoped search space and the scope check."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from synthetic_study import BASE, ROOT

from infrarsi.orchestration.common import baseline_config, scope_violation, scoped_space
from infrarsi.study.contract import Contract


def test_scoped_space_pins_every_other_knob_and_the_check_names_the_knob(tmp_path: Path) -> None:
    d = tmp_path / "s"
    contract = Contract.create(
        ROOT / "workloads/dense_debug.yaml",
        study_dir=d,
        memory_capacity_bytes=1 << 30,
        editable_knobs=["zero_stage"],
    )
    contract.save(d)
    space = scoped_space(contract, d)
    base = baseline_config(contract, d)
    assert all(
        len(k.values) == 1 and k.values[0] == base[k.name]
        for k in space.knobs
        if k.name != "zero_stage"
    )
    assert {c["zero_stage"] for c in space.enumerate() or []} == set(
        contract.search_space(d).knob("zero_stage").values
    )
    assert (
        scope_violation(contract, contract.search_space(d), base, {**BASE, "zero_stage": 1}) is None
    )
    why = scope_violation(contract, contract.search_space(d), base, {**BASE, "micro_batch_size": 4})
    assert why is not None
    assert (
        "editable.knobs" in why
        and "'micro_batch_size'" in why
        and "baseline value 1" in why
        and "proposed 4" in why
    )
