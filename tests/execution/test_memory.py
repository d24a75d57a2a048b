"""The CPU memory measure, the GPU device-used measure (over a stand-in reading) and capacity
enforcement (single process)."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch import nn

from infrarsi.execution.memory import (
    MemoryCapacityExceeded,
    MemoryMonitor,
    is_oom,
    malloc_in_use_bytes,
)


def test_mallinfo2_follows_allocations():
    before = malloc_in_use_bytes()
    t = torch.empty(64 * 2**20, dtype=torch.uint8)
    t.fill_(1)
    during = malloc_in_use_bytes()
    del t
    after = malloc_in_use_bytes()
    assert during - before >= 60 * 2**20
    assert during - after >= 60 * 2**20


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))


def test_peak_grows_with_batch_and_is_relative_to_baseline():
    peaks = []
    for rows in (64, 1024):
        mon = MemoryMonitor("cpu")
        mon.start()
        model = _mlp()
        mon.attach(model)
        model(torch.randn(rows, 256)).sum().backward()
        mon.check("end")
        peaks.append(mon.peak())
        mon.stop()
        del model
    assert 0 < peaks[0] < peaks[1]
    assert peaks[1] - peaks[0] >= (1024 - 64) * 1024 * 4  # at least the extra hidden activations


def test_capacity_below_need_raises_with_a_lower_bound():
    mon = MemoryMonitor("cpu", capacity_bytes=4 * 2**20)
    mon.start()
    model = _mlp()
    mon.attach(model)
    with pytest.raises(MemoryCapacityExceeded) as ei:
        model(torch.randn(4096, 256)).sum().backward()
    mon.stop()
    # raised by a hook or by the watchdog, whichever saw it first
    assert mon.oom_lower_bound() > 4 * 2**20
    assert mon.oom_lower_bound() >= ei.value.peak_bytes
    assert is_oom(ei.value)


def test_capacity_above_need_passes():
    import gc

    gc.collect()  # garbage of earlier tests freed mid-test would sink the host figure under its baseline
    mon = MemoryMonitor("cpu", capacity_bytes=2**30)
    mon.start()
    model = _mlp()
    mon.attach(model)
    model(torch.randn(64, 256)).sum().backward()
    mon.check("end")
    mon.stop()
    assert 0 < mon.peak() < 2**30


def test_watchdog_raises_in_the_owning_thread_outside_hooks():
    mon = MemoryMonitor("cpu", capacity_bytes=8 * 2**20, poll_s=0.001)
    mon.start()
    hold = []
    with pytest.raises(MemoryCapacityExceeded):
        for _ in range(200):  # plain Python allocations, no hook or check call
            hold.append(torch.ones(2**20, dtype=torch.uint8))
            time.sleep(0.005)
    mon.stop()
    assert mon.crossed_bytes is not None and mon.crossed_bytes > 8 * 2**20
    del hold
    time.sleep(0.05)  # a cancelled async raise must not land later
    assert threading.current_thread() is threading.main_thread()


def test_stop_is_idempotent_and_disarms():
    mon = MemoryMonitor("cpu", capacity_bytes=1)
    mon.start()
    mon.stop()
    mon.stop()
    mon.check("after stop")  # disarmed: no raise


class _Device:
    """A stand-in for the GPU's used-memory reading (the logic above it is under test)."""

    def __init__(self, used: int) -> None:
        self.used = used

    def read(self) -> int:
        return self.used


def _cuda_monitor(monkeypatch, device: _Device, capacity: int | None) -> MemoryMonitor:
    monkeypatch.setattr(MemoryMonitor, "_cuda_begin", lambda self: None)  # no allocator here
    monkeypatch.setattr(MemoryMonitor, "_cuda_end", lambda self: None)
    return MemoryMonitor(
        "cuda", capacity_bytes=capacity, poll_s=0.001, device_used_reader=device.read
    )


def test_device_used_peak_is_over_the_baseline_and_outside_the_allocator(monkeypatch):
    dev = _Device(used=3_000)
    mon = _cuda_monitor(monkeypatch, dev, capacity=None)
    mon.start()
    assert mon.device_used_baseline_bytes == 3_000
    dev.used = 7_000  # e.g. NCCL buffers: the allocator never saw them
    time.sleep(0.05)
    dev.used = 5_000
    time.sleep(0.05)
    mon.stop()
    assert mon.device_used_peak_bytes == 4_000
    assert mon.crossed_bytes is None


def test_device_used_over_capacity_is_an_oom_raised_in_the_owning_thread(monkeypatch):
    dev = _Device(used=1_000)
    mon = _cuda_monitor(monkeypatch, dev, capacity=10_000)
    mon.start()
    with pytest.raises(MemoryCapacityExceeded):
        for _ in range(400):
            dev.used += 100  # memory outside PyTorch's allocator grows past the capacity
            time.sleep(0.005)
    mon.stop()
    assert mon.crossed_bytes is not None and mon.crossed_bytes > 10_000
    assert "device_used reached" in mon.describe_oom(MemoryCapacityExceeded())
    assert is_oom(MemoryCapacityExceeded())


def test_an_unreadable_device_leaves_the_measure_unset(monkeypatch):
    def broken() -> int:
        raise RuntimeError("no device")

    monkeypatch.setattr(MemoryMonitor, "_cuda_begin", lambda self: None)
    monkeypatch.setattr(MemoryMonitor, "_cuda_end", lambda self: None)
    mon = MemoryMonitor("cuda", capacity_bytes=1, device_used_reader=broken)
    mon.start()
    mon.stop()
    assert mon.device_used_peak_bytes is None and mon.crossed_bytes is None
