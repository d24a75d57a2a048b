"""The stage commands' options: ``init`` records the switches and the memory capacity in the
contract (the environment is only the default), bad values exit 2 naming the option."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infrarsi.cli import app
from infrarsi.study.contract import Contract

ROOT = Path(__file__).resolve().parents[2]
DENSE = str(ROOT / "workloads" / "dense_debug.yaml")


def _invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env=env)


def test_init_records_the_switches_given(tmp_path: Path) -> None:
    study = tmp_path / "s"
    env = {"INFRARSI_PRIOR": "on", "INFRARSI_LOSS_GUARD": "on", "INFRARSI_BANK": str(tmp_path / "env-bank")}
    res = _invoke("init", DENSE, "--study", str(study), "--no-analytic-prior", "--no-loss-guard", "--bank", "off",
                  "--memory-capacity", "160MiB", env=env)
    assert res.exit_code == 0, res.output
    assert "160.00 MiB per device (--memory-capacity)" in res.output
    data = yaml.safe_load((study / "contract.yaml").read_text())
    assert data["switches"] == {"analytic_prior": False, "loss_guard": False, "bank": None}
    assert data["memory_capacity_bytes"] == 160 << 20


def test_init_takes_the_environment_as_default(tmp_path: Path) -> None:
    study = tmp_path / "s"
    env = {"INFRARSI_PRIOR": "off", "INFRARSI_LOSS_GUARD": "", "INFRARSI_BANK": str(tmp_path / "env-bank")}
    res = _invoke("init", DENSE, "--study", str(study), env=env)
    assert res.exit_code == 0, res.output
    sw = Contract.load(study).switches
    assert sw is not None and (sw.analytic_prior, sw.loss_guard, sw.bank) == (False, True, str(tmp_path / "env-bank"))
    assert "unlimited" in res.output  # dense_debug sets no capacity: said so, not hidden


@pytest.mark.parametrize(("args", "env", "needle"), [
    (["--bank", "s3://bucket/bank"], {}, "--bank"),
    ([], {"INFRARSI_PRIOR": "maybe"}, "INFRARSI_PRIOR"),
    ([], {"INFRARSI_LOSS_GUARD": "sometimes"}, "INFRARSI_LOSS_GUARD"),
])
def test_bad_switch_values_exit_2_and_name_them(tmp_path: Path, args: list[str], env: dict[str, str],
                                                needle: str) -> None:
    res = _invoke("init", DENSE, "--study", str(tmp_path / "s"), *args, env=env)
    assert res.exit_code == 2, res.output
    assert needle in res.output
    assert not (tmp_path / "s" / "contract.yaml").exists()
