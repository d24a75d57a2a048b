"""The memory capacity per device of a study: resolved in one place, with where it came from.

Resolution order (``resolve_memory_capacity``, first that is set wins):

1. ``--memory-capacity`` given to ``infrarsi init`` / ``infrarsi tune`` (source ``--memory-capacity``),
2. the workload's ``memory_capacity`` (source ``workload``),
3. the memory of one device the doctor measured (``DoctorReport.device_memory_capacity_bytes``;
   recorded in the contract as a calibration, source ``device``),
4. none of them: ``unlimited`` (source ``unlimited``), labelled as such. The trials then run
   under the device's own limit, and the optimizer, which needs a finite capacity, gets
   ``UNLIMITED_MEMORY_CAPACITY_BYTES``.

Init resolves 1-2 into ``Contract.memory_capacity_bytes``; doctor fills in 3 when that is unset;
every reader then uses ``Contract.memory_capacity`` (a ``MemoryCapacity``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from infrarsi.units import format_bytes
from infrarsi.workload import Workload

UNLIMITED_MEMORY_CAPACITY_BYTES = 10**15
"""What the optimizer is told when the capacity is unlimited (it needs a finite number, bytes)."""

CapacitySource = Literal["--memory-capacity", "workload", "device", "unlimited"]
"""Where a study's memory capacity came from (``resolve_memory_capacity``'s order)."""


@dataclass(frozen=True)
class MemoryCapacity:
    """The memory capacity per device a study enforces, and where it came from."""

    memory_capacity_bytes: int | None
    """Capacity of one device, bytes; None: unlimited (the device's own limit applies)."""
    source: CapacitySource
    """Which rule of the resolution order set it."""

    @property
    def unlimited(self) -> bool:
        """True when nothing set a capacity."""
        return self.memory_capacity_bytes is None

    @property
    def optimizer_memory_capacity_bytes(self) -> float:
        """The capacity the optimizer models, bytes: ``memory_capacity_bytes``, or
        ``UNLIMITED_MEMORY_CAPACITY_BYTES`` when unlimited."""
        if self.memory_capacity_bytes is None:
            return float(UNLIMITED_MEMORY_CAPACITY_BYTES)
        return float(self.memory_capacity_bytes)

    def describe(self) -> str:
        """E.g. ``4.00 GiB per device (--memory-capacity)`` or ``unlimited (...)``."""
        if self.memory_capacity_bytes is None:
            return (
                "unlimited (no --memory-capacity, no workload memory_capacity, no device memory "
                "measured; the optimizer models it as 1e15 bytes)"
            )
        return f"{format_bytes(self.memory_capacity_bytes)} per device ({self.source})"


def resolve_memory_capacity(
    *, flag_bytes: int | None, workload: Workload | None, device_bytes: int | None
) -> MemoryCapacity:
    """The study's memory capacity: ``flag_bytes`` (``--memory-capacity``), else the workload's
    ``memory_capacity``, else ``device_bytes`` (the device's memory as the doctor measured it),
    else unlimited (module docstring)."""
    if flag_bytes is not None:
        return MemoryCapacity(int(flag_bytes), "--memory-capacity")
    wl_bytes = workload.memory_capacity_bytes if workload is not None else None
    if wl_bytes is not None:
        return MemoryCapacity(wl_bytes, "workload")
    if device_bytes is not None:
        return MemoryCapacity(int(device_bytes), "device")
    return MemoryCapacity(None, "unlimited")


__all__ = [
    "UNLIMITED_MEMORY_CAPACITY_BYTES",
    "CapacitySource",
    "MemoryCapacity",
    "resolve_memory_capacity",
]
