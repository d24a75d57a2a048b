"""pynvml device telemetry sampled during a trial (GPU only; a no-op on CPU).

``TelemetrySampler(device, device_index).start()`` samples utilisation (%), SM clock (MHz),
power (W) and memory used (bytes) every ``interval_s`` in a daemon thread; ``stop()`` returns the
aggregate ``{metric: {"mean", "max", "n"}}`` (``aggregate``). Without a GPU or pynvml it samples
nothing and returns ``{}``.

Which GPU: ``device_index`` is the rank's CUDA ordinal (``torch.cuda.current_device()``), which
counts only the devices in ``CUDA_VISIBLE_DEVICES`` (Ray sets it per actor), while NVML counts
every GPU of the machine. ``visible_device`` maps the ordinal through ``CUDA_VISIBLE_DEVICES``
the way CUDA reads it (comma-separated integer indices or ``GPU-``/``MIG-`` UUIDs, ending at the
first entry that is neither): ``CUDA_VISIBLE_DEVICES=3,5`` and ordinal 1 is NVML index 5, a UUID
is opened with ``nvmlDeviceGetHandleByUUID`` (a UUID prefix, which CUDA accepts, by matching the
machine's GPUs). Unset, the ordinal is the NVML index. When the ordinal is not visible or no GPU
matches, nothing is sampled (better no telemetry than another rank's GPU). Integer entries are
NVML indices only when CUDA enumerates in PCI bus order (``CUDA_DEVICE_ORDER=PCI_BUS_ID``, or a
machine of identical GPUs, where CUDA's default order is the same).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

METRICS = ("gpu_util_pct", "sm_clock_mhz", "power_w", "memory_used_bytes")
"""Names of the sampled metrics."""


def aggregate(samples: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per-metric mean, max and count over ``samples`` (metrics missing from a sample skipped)."""
    out: dict[str, dict[str, float]] = {}
    for name in METRICS:
        vals = [s[name] for s in samples if name in s]
        if vals:
            out[name] = {"mean": sum(vals) / len(vals), "max": max(vals), "n": float(len(vals))}
    return out


def visible_device(ordinal: int, env: Mapping[str, str] | None = None) -> int | str | None:
    """The physical GPU behind CUDA ordinal ``ordinal`` under ``env``'s (default: this process's)
    ``CUDA_VISIBLE_DEVICES``: an NVML index (int) or a UUID (str), or None when no visible
    device has that ordinal. See the module docstring for the rule."""
    raw = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return ordinal if ordinal >= 0 else None
    visible: list[int | str] = []
    for entry in (e.strip() for e in raw.split(",")):
        if entry.isdigit():
            visible.append(int(entry))
        elif entry.startswith(("GPU-", "MIG-")):
            visible.append(entry)
        else:  # CUDA ignores this entry and every one after it
            break
    return visible[ordinal] if 0 <= ordinal < len(visible) else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_handle(nvml: Any, ordinal: int, env: Mapping[str, str] | None = None) -> Any | None:
    """The NVML handle of the GPU behind CUDA ordinal ``ordinal`` (``nvml``: the initialised
    ``pynvml`` module), or None when it cannot be told which GPU that is."""
    target = visible_device(ordinal, env)
    if target is None:
        return None
    if isinstance(target, int):
        return nvml.nvmlDeviceGetHandleByIndex(target)
    with contextlib.suppress(Exception):
        return nvml.nvmlDeviceGetHandleByUUID(target)
    matches = []
    for i in range(int(nvml.nvmlDeviceGetCount())):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        if _text(nvml.nvmlDeviceGetUUID(h)).startswith(target):
            matches.append(h)
    return matches[0] if len(matches) == 1 else None


def nvml_reader(
    device_index: int, nvml: Any | None = None, env: Mapping[str, str] | None = None
) -> Callable[[], dict[str, float]] | None:
    """A reader of the rank's GPU (CUDA ordinal ``device_index``), or None without one."""
    try:
        lib: Any = nvml if nvml is not None else importlib.import_module("pynvml")
        lib.nvmlInit()
        h = nvml_handle(lib, device_index, env)
    except Exception:
        return None
    if h is None:
        return None

    def read() -> dict[str, float]:
        return {
            "gpu_util_pct": float(lib.nvmlDeviceGetUtilizationRates(h).gpu),
            "sm_clock_mhz": float(lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_SM)),
            "power_w": lib.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "memory_used_bytes": float(lib.nvmlDeviceGetMemoryInfo(h).used),
        }

    return read


class TelemetrySampler:
    """Background sampler. ``device``: ``cpu`` (no-op) or ``cuda``; ``device_index``: the rank's
    CUDA ordinal (mapped to its physical GPU by ``visible_device``)."""

    def __init__(
        self,
        device: str = "cpu",
        device_index: int = 0,
        interval_s: float = 0.5,
        reader: Callable[[], dict[str, float]] | None = None,
    ) -> None:
        self.device, self.device_index, self.interval_s = device, device_index, interval_s
        self._reader = reader
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> TelemetrySampler:
        if self._reader is None and self.device == "cuda":
            self._reader = nvml_reader(self.device_index)
        if self._reader is not None:
            self._thread = threading.Thread(
                target=self._run, name="infrarsi-telemetry", daemon=True
            )
            self._thread.start()
        return self

    def _run(self) -> None:
        assert self._reader is not None
        while True:
            try:
                self.samples.append(self._reader())
            except Exception:
                return
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        return aggregate(self.samples)
