"""The CPU memory measure and capacity enforcement (single process)."""

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
