"""The memory capacity is resolved in one place: --memory-capacity, else the workload's, else the
device's (filled in by doctor), else an explicit, labelled "unlimited"."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from infrarsi.errors import ContractError
from infrarsi.study.capacity import (
    UNLIMITED_MEMORY_CAPACITY_BYTES,
    MemoryCapacity,
    resolve_memory_capacity,
)
from infrarsi.study.contract import Contract
from infrarsi.workload import Workload

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


@pytest.fixture
def workloads(tmp_path: Path) -> tuple[Path, Path]:
    """(dense debug workload without a capacity, the same with ``memory_capacity: 2GiB``)."""
    (tmp_path / "workloads").mkdir()
    (tmp_path / "search_spaces").mkdir()
    shutil.copy(ROOT / "search_spaces/deepspeed_dense.yaml", tmp_path / "search_spaces")
    plain = tmp_path / "workloads/dense_debug.yaml"
    shutil.copy(ROOT / "workloads/dense_debug.yaml", plain)
    assert "memory_capacity" not in plain.read_text()
    capped = tmp_path / "workloads/dense_capped.yaml"
    capped.write_text(plain.read_text() + "memory_capacity: 2GiB\n")
    return plain, capped


def test_resolution_order(workloads: tuple[Path, Path]) -> None:
    plain, capped = (Workload.from_yaml(p) for p in workloads)
    assert resolve_memory_capacity(
        flag_bytes=GIB, workload=capped, device_bytes=80 * GIB
    ) == MemoryCapacity(GIB, "--memory-capacity")
    assert resolve_memory_capacity(
        flag_bytes=None, workload=capped, device_bytes=80 * GIB
    ) == MemoryCapacity(2 * GIB, "workload")
    assert resolve_memory_capacity(
        flag_bytes=None, workload=plain, device_bytes=80 * GIB
    ) == MemoryCapacity(80 * GIB, "device")
    unlimited = resolve_memory_capacity(flag_bytes=None, workload=plain, device_bytes=None)
    assert unlimited == MemoryCapacity(None, "unlimited") and unlimited.unlimited
    assert unlimited.optimizer_memory_capacity_bytes == float(UNLIMITED_MEMORY_CAPACITY_BYTES)
    assert "unlimited" in unlimited.describe() and "1e15" in unlimited.describe()
    assert MemoryCapacity(GIB, "workload").optimizer_memory_capacity_bytes == float(GIB)


def test_contract_says_where_its_capacity_came_from(
    tmp_path: Path, workloads: tuple[Path, Path]
) -> None:
    plain, capped = workloads
    flag = Contract.create(capped, study_dir=tmp_path / "flag", memory_capacity_bytes=GIB)
    assert flag.memory_capacity == MemoryCapacity(GIB, "--memory-capacity")
    from_wl = Contract.create(capped, study_dir=tmp_path / "wl")
    assert from_wl.memory_capacity_bytes == 2 * GIB
    assert from_wl.memory_capacity == MemoryCapacity(2 * GIB, "workload")
    none = Contract.create(plain, study_dir=tmp_path / "none")
    assert Contract.load(tmp_path / "none").memory_capacity == MemoryCapacity(None, "unlimited")
    # doctor fills in the device's memory when init left the capacity unset ...
    none.with_calibration(
        memory_capacity_bytes=80 * GIB, reason="doctor: the device's memory"
    ).save(tmp_path / "none")
    measured = Contract.load(tmp_path / "none")
    assert measured.memory_capacity == MemoryCapacity(80 * GIB, "device")
    assert measured.memory_capacity.describe() == "80.00 GiB per device (device)"
    # ... and never overrides one that init resolved.
    with pytest.raises(ContractError, match="fixed at"):
        from_wl.with_calibration(memory_capacity_bytes=80 * GIB)
