"""The options the stage commands share: a bare ``--wait`` and sizes without a unit."""

from __future__ import annotations

import pytest

from infrarsi.cli.options import expand_bare_wait, size_arg
from infrarsi.errors import ConfigError


@pytest.mark.parametrize(
    ("argv", "expanded"),
    [
        (["run", "S", "--wait"], ["run", "S", "--wait=forever"]),
        (["run", "S", "--wait", "10m"], ["run", "S", "--wait", "10m"]),
        (["run", "S", "--wait", "--resume"], ["run", "S", "--wait=forever", "--resume"]),
        (["run", "S", "--wait=90s"], ["run", "S", "--wait=90s"]),
        (["verify", "--wait", "S"], ["verify", "--wait=forever", "S"]),
    ],
)
def test_a_bare_wait_means_as_long_as_it_takes(argv: list[str], expanded: list[str]) -> None:
    assert expand_bare_wait(argv) == expanded


def test_a_size_needs_its_unit_and_none_stays_none() -> None:
    assert size_arg("2GiB", "--memory-capacity") == 2 * 1024**3
    assert size_arg(None, "--memory-capacity") is None
    with pytest.raises(ConfigError, match="--memory-capacity"):
        size_arg("2", "--memory-capacity")
