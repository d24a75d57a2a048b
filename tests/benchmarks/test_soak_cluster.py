"""The soak's CLI runner (``benchmarks.soak_cluster.cli``): a failing command raises with its exit code and stderr."""

from __future__ import annotations

import pytest

from benchmarks.soak_cluster import cli, soak_env


def test_the_soak_environment_has_no_bank_and_no_token_auth() -> None:
    env = soak_env()
    assert env["INFRARSI_BANK"] == "off" and env["RAY_AUTH_MODE"] == "disabled"


def test_a_failing_command_raises_with_its_exit_code_and_stderr() -> None:
    with pytest.raises(RuntimeError, match="exited 2") as e:
        cli("init", "/no/such/workload.yaml", "--study", "/tmp/never-made", timeout=120)
    assert "no/such/workload.yaml" in str(e.value)
