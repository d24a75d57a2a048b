"""NVML telemetry reads the rank's own GPU: the CUDA ordinal is mapped through
``CUDA_VISIBLE_DEVICES`` (a stand-in for pynvml stands for the machine's GPUs), and the sampler's
aggregation."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from infrarsi.execution.telemetry import (
    TelemetrySampler,
    aggregate,
    nvml_handle,
    nvml_reader,
    visible_device,
)

UUIDS = [f"GPU-{i:08x}-1111-2222-3333-44445555666{i}" for i in range(8)]
MIG = "MIG-8f1e2d3c-aaaa-bbbb-cccc-000000000001"


class FakeNvml:
    """Eight GPUs (NVML indices 0-7, UUIDS) plus one MIG instance; a handle is ("gpu", index)
    or ("mig", uuid). Memory used reads 1000 x the index, so a reading names its GPU."""

    NVML_CLOCK_SM = 1

    def __init__(self) -> None:
        self.initialised = False

    def nvmlInit(self) -> None:
        self.initialised = True

    def nvmlDeviceGetCount(self) -> int:
        return len(UUIDS)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> tuple[str, int]:
        if not 0 <= i < len(UUIDS):
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return ("gpu", i)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> tuple[str, Any]:
        u = uuid.decode() if isinstance(uuid, bytes) else uuid
        if u in UUIDS:
            return ("gpu", UUIDS.index(u))
        if u == MIG:
            return ("mig", u)
        raise RuntimeError("NVML_ERROR_NOT_FOUND")

    def nvmlDeviceGetUUID(self, h: tuple[str, int]) -> bytes:
        return UUIDS[h[1]].encode()  # older pynvml returns bytes

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> SimpleNamespace:
        return SimpleNamespace(gpu=50)

    def nvmlDeviceGetClockInfo(self, h: Any, which: int) -> int:
        return 1980

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return 300_000

    def nvmlDeviceGetMemoryInfo(self, h: tuple[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(used=1000 * h[1] if h[0] == "gpu" else 7)


def test_the_ordinal_follows_cuda_visible_devices() -> None:
    assert visible_device(1, {"CUDA_VISIBLE_DEVICES": "3,5"}) == 5
    assert visible_device(0, {"CUDA_VISIBLE_DEVICES": " 6 "}) == 6
    assert visible_device(1, {"CUDA_VISIBLE_DEVICES": f"{UUIDS[4]},{UUIDS[2]}"}) == UUIDS[2]
    assert visible_device(0, {"CUDA_VISIBLE_DEVICES": MIG}) == MIG
    assert visible_device(2, {}) == 2  # unset: the ordinal is the NVML index


def test_an_ordinal_that_is_not_visible_has_no_device() -> None:
    assert visible_device(2, {"CUDA_VISIBLE_DEVICES": "3,5"}) is None
    assert visible_device(0, {"CUDA_VISIBLE_DEVICES": ""}) is None
    assert visible_device(0, {"CUDA_VISIBLE_DEVICES": "-1"}) is None
    # CUDA stops reading at the first invalid entry
    assert visible_device(0, {"CUDA_VISIBLE_DEVICES": "3,bogus,5"}) == 3
    assert visible_device(1, {"CUDA_VISIBLE_DEVICES": "3,bogus,5"}) is None
    assert visible_device(-1, {}) is None


def test_handles_by_index_by_uuid_and_by_uuid_prefix() -> None:
    nvml = FakeNvml()
    assert nvml_handle(nvml, 1, {"CUDA_VISIBLE_DEVICES": "3,5"}) == ("gpu", 5)
    assert nvml_handle(nvml, 0, {"CUDA_VISIBLE_DEVICES": f"{UUIDS[6]},{UUIDS[1]}"}) == ("gpu", 6)
    assert nvml_handle(nvml, 0, {"CUDA_VISIBLE_DEVICES": MIG}) == ("mig", MIG)
    assert nvml_handle(nvml, 0, {"CUDA_VISIBLE_DEVICES": UUIDS[7][:12]}) == (
        "gpu",
        7,
    )  # unique prefix
    assert nvml_handle(nvml, 0, {"CUDA_VISIBLE_DEVICES": "GPU-0000"}) is None  # prefix of several
    assert nvml_handle(nvml, 0, {"CUDA_VISIBLE_DEVICES": "GPU-ffffffff"}) is None  # no such GPU
    assert nvml_handle(nvml, 3, {"CUDA_VISIBLE_DEVICES": "3,5"}) is None


def test_the_reader_samples_the_ranks_gpu_or_nothing() -> None:
    nvml = FakeNvml()
    read = nvml_reader(1, nvml, {"CUDA_VISIBLE_DEVICES": "3,5"})
    assert read is not None and nvml.initialised
    assert read() == {
        "gpu_util_pct": 50.0,
        "sm_clock_mhz": 1980.0,
        "power_w": 300.0,
        "memory_used_bytes": 5000.0,
    }
    assert nvml_reader(4, nvml, {"CUDA_VISIBLE_DEVICES": "3,5"}) is None

    class Broken(FakeNvml):
        def nvmlInit(self) -> None:
            raise RuntimeError("NVML_ERROR_DRIVER_NOT_LOADED")

    assert nvml_reader(0, Broken(), {}) is None


def test_aggregate_and_a_sampler_with_a_given_reader() -> None:
    out = aggregate([{"power_w": 100.0}, {"power_w": 300.0, "gpu_util_pct": 10.0}])
    assert out == {
        "gpu_util_pct": {"mean": 10.0, "max": 10.0, "n": 1.0},
        "power_w": {"mean": 200.0, "max": 300.0, "n": 2.0},
    }
    seen = threading.Event()

    def reader() -> dict[str, float]:
        seen.set()
        return {"memory_used_bytes": 42.0}

    sampler = TelemetrySampler("cuda", 0, interval_s=0.01, reader=reader).start()
    assert seen.wait(2.0)
    assert sampler.stop()["memory_used_bytes"]["max"] == pytest.approx(42.0)
    assert TelemetrySampler("cpu").start().stop() == {}
