"""pynvml device telemetry sampled during a trial (GPU only; a no-op on CPU).

``TelemetrySampler(device_index).start()`` samples utilisation (%), SM clock (MHz), power (W)
and memory used (bytes) every ``interval_s`` in a daemon thread; ``stop()`` returns the
aggregate ``{metric: {"mean", "max", "n"}}`` (``aggregate``). Without a GPU or pynvml it samples
nothing and returns ``{}``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
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


def _nvml_reader(device_index: int) -> Callable[[], dict[str, float]] | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(device_index)
    except Exception:
        return None

    def read() -> dict[str, float]:
        return {
            "gpu_util_pct": float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
            "sm_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "memory_used_bytes": float(pynvml.nvmlDeviceGetMemoryInfo(h).used),
        }

    return read


class TelemetrySampler:
    """Background sampler. ``device``: ``cpu`` (no-op) or ``cuda``."""

    def __init__(self, device: str = "cpu", device_index: int = 0, interval_s: float = 0.5,
                 reader: Callable[[], dict[str, float]] | None = None) -> None:
        self.device, self.device_index, self.interval_s = device, device_index, interval_s
        self._reader = reader
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> TelemetrySampler:
        if self._reader is None and self.device == "cuda":
            self._reader = _nvml_reader(self.device_index)
        if self._reader is not None:
            self._thread = threading.Thread(target=self._run, name="infrarsi-telemetry", daemon=True)
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
