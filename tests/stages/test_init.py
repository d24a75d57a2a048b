"""``init``'s choice of editable knobs: a knob of another arithmetic is searched only when the
contract allows it by name (``--allow``), and the contract records the choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from infrarsi.errors import ConfigError
from infrarsi.stages.init import allowed_knobs, init_stage
from infrarsi.study.contract import Contract

ROOT = Path(__file__).resolve().parents[2]
KNOBS = ["zero_stage", "float8_linear", "micro_batch_size"]


def test_a_knob_of_another_arithmetic_is_left_out_unless_allowed() -> None:
    assert allowed_knobs(KNOBS, None, [], "s.yaml") == ["zero_stage", "micro_batch_size"]
    assert allowed_knobs(KNOBS, ["zero_stage"], [], "s.yaml") == ["zero_stage"]
    assert allowed_knobs(KNOBS, None, ["float8_linear"], "s.yaml") is None  # every knob
    assert allowed_knobs(["zero_stage"], None, [], "s.yaml") is None  # nothing to leave out
    assert allowed_knobs(KNOBS, ["zero_stage"], ["float8_linear"], "s.yaml") == [
        "zero_stage",
        "float8_linear",
    ]  # --allow makes it editable beside the --knob list
    with pytest.raises(ConfigError, match=r"--knob 'float8_linear'.*Fix: add --allow float8_l"):
        allowed_knobs(KNOBS, ["float8_linear"], [], "s.yaml")
    with pytest.raises(ConfigError, match=r"--allow 'zero_stage'.*s\.yaml.*\['float8_linear'\]"):
        allowed_knobs(KNOBS, None, ["zero_stage"], "s.yaml")


def test_the_contract_records_whether_float8_may_be_searched(tmp_path: Path) -> None:
    wl = ROOT / "workloads" / "dense_1gpu_fast.yaml"
    init_stage(wl, tmp_path / "plain", bank="off")
    init_stage(wl, tmp_path / "f8", allow=["float8_linear"], bank="off")
    plain = Contract.load(tmp_path / "plain").editable.knobs
    f8 = Contract.load(tmp_path / "f8").editable.knobs
    assert "float8_linear" not in plain and "float8_linear" in f8
    assert set(f8) - set(plain) == {"float8_linear"}
