"""The accelerator catalogue: datasheet figures of the GPU kinds infrarsi knows, in one place.

The surrogate backend simulates a job on one of these kinds, the analytic prior starts its
hardware terms from them, and MFU divides by their dense bf16 peak. Bus bandwidths are what
NCCL achieves on the links, not the links' peaks. A figure here is a nominal starting point:
the prior refits every term on a study's own trials, and on CPU the peak is measured.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator kind and its links."""

    name: str
    """Kind, e.g. ``h100_sxm``."""
    peak_flops: float
    """Dense bf16 peak, FLOP/s per device."""
    memory_bytes: int
    """Device memory (the default capacity), bytes."""
    hbm_bytes_per_s: float
    """Memory bandwidth, bytes/s (optimizer step is memory-bound)."""
    nvlink_bytes_per_s: float
    """Achievable intra-node collective bus bandwidth per device, bytes/s."""
    internode_bytes_per_s: float
    """Achievable inter-node bandwidth per device (one NIC each), bytes/s."""
    pcie_bytes_per_s: float
    """Achievable host<->device bandwidth per device, bytes/s (offload)."""


GPUS: dict[str, GpuSpec] = {
    "h100_sxm": GpuSpec("h100_sxm", 989e12, 80 * 10**9, 3.35e12, 360e9, 45e9, 25e9),
    "h200_sxm": GpuSpec("h200_sxm", 989e12, 141 * 10**9, 4.8e12, 360e9, 45e9, 25e9),
    "a100_sxm": GpuSpec("a100_sxm", 312e12, 80 * 10**9, 2.0e12, 230e9, 22e9, 20e9),
}
"""Known GPU kinds with every figure; a surrogate workload's ``surrogate.gpu`` picks one."""

NOMINAL_GPU = GPUS["h100_sxm"]
"""The kind whose figures start the analytic prior of a real ``cuda`` job."""

DENSE_BF16_PEAK_BY_DEVICE_NAME: dict[str, float] = {
    "H200": GPUS["h200_sxm"].peak_flops,
    "H100": GPUS["h100_sxm"].peak_flops,
    "A100": GPUS["a100_sxm"].peak_flops,
    "L40S": 362e12,
    "A10G": 125e12,
    "L4": 121e12,
}
"""Dense bf16 tensor-core peak, FLOP/s, by a substring of ``torch.cuda.get_device_name()``."""
