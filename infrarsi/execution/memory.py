"""Per-device peak memory, with a capacity that really fails.

GPU (``cuda``), two measures:

- ``cuda_max_allocated`` (the peak, ``RankResult.peak_memory_bytes``):
  ``torch.cuda.max_memory_allocated`` since ``reset_peak_memory_stats``: tensors in PyTorch's
  caching allocator. An emulated smaller device uses ``torch.cuda.set_per_process_memory_fraction``,
  and a real ``torch.cuda.OutOfMemoryError`` is the OOM.
- ``device_used`` (``RankResult.device_used_peak_bytes``): the device's used memory
  (``torch.cuda.mem_get_info``: total - free, everything on the GPU, inside PyTorch's allocator
  or not: allocator caching and fragmentation, NCCL buffers, library workspaces, CUDA context
  growth; other processes on the same GPU too) over its value when ``start`` ran (before the
  model is built), sampled by a watchdog thread every ``poll_s``. With a capacity, a crossing
  of it is an OOM too (``MemoryCapacityExceeded`` raised asynchronously in the rank's thread):
  memory the allocator's fraction does not limit still has to fit the emulated device.

CPU: an allocator-level measure that moves with micro-batch and checkpointing the way GPU memory
does: glibc ``mallinfo2()`` in-use bytes (``uordblks + hblkhd``) minus a baseline taken before
the model is built (RSS sits on a ~490 MB base and is noisy). It is sampled at deterministic
points (``check``: module forward hooks, their output-gradient hooks, after each micro-step and
optimizer step) and by a watchdog thread. Over capacity, ``check`` raises
``MemoryCapacityExceeded`` in the rank's own thread; the watchdog raises it there
asynchronously (``PyThreadState_SetAsyncExc``). The OOM's ``peak_bytes`` is the value that
crossed the capacity: a known lower bound of the true need.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class MemoryCapacityExceeded(RuntimeError):
    """The rank's memory measure crossed its capacity (a CPU-emulated out-of-memory)."""

    def __init__(self, peak_bytes: int = 0, capacity_bytes: int = 0, where: str = "") -> None:
        super().__init__(
            f"memory {peak_bytes} B exceeded capacity {capacity_bytes} B at {where or 'watchdog'}"
        )
        self.peak_bytes, self.capacity_bytes, self.where = peak_bytes, capacity_bytes, where


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


_LIBC: Any = None


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        lib = ctypes.CDLL("libc.so.6")
        lib.mallinfo2.restype = _Mallinfo2
        _LIBC = lib
    return _LIBC


def malloc_in_use_bytes() -> int:
    """glibc heap bytes in use (``uordblks``) plus mmapped chunks (``hblkhd``), all arenas."""
    mi = _libc().mallinfo2()
    return int(mi.uordblks + mi.hblkhd)


def mallinfo2_available() -> bool:
    try:
        malloc_in_use_bytes()
        return True
    except (OSError, AttributeError):
        return False


class MemoryMonitor:
    """Peak memory of this rank's device, and capacity enforcement.

    ``device``: ``cpu`` or ``cuda``. ``capacity_bytes``: per device; None = unlimited.
    Use: ``start()`` before the model is built, ``attach(model)`` once, ``check(where)`` at
    any point, ``stop()`` always (also on failure)."""

    measure_cpu = "mallinfo2"
    measure_gpu = "cuda_max_allocated"
    measure_device_used = "device_used"

    def __init__(
        self,
        device: str = "cpu",
        capacity_bytes: int | None = None,
        poll_s: float = 0.01,
        device_used_reader: Callable[[], int] | None = None,
    ) -> None:
        self.device = device
        self.capacity_bytes = int(capacity_bytes) if capacity_bytes else None
        self.poll_s = poll_s
        self.baseline_bytes = 0
        self.peak_bytes = 0
        self.device_used_baseline_bytes = 0
        """``cuda``: the device's used bytes when ``start`` ran."""
        self.device_used_peak_bytes: int | None = None
        """``cuda``: peak of the device's used bytes over ``device_used_baseline_bytes`` (None
        on cpu, or when the device cannot be read)."""
        self._device_used = device_used_reader
        self.crossed_bytes: int | None = None
        self.crossed_where = ""
        self._thread_id: int | None = None
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._hooks: list[Any] = []
        self._armed = False
        self._lock = threading.Lock()

    @property
    def measure(self) -> str:
        return self.measure_gpu if self.device == "cuda" else self.measure_cpu

    def current_bytes(self) -> int:
        if self.device == "cuda":
            return int(torch.cuda.memory_allocated())
        return max(0, malloc_in_use_bytes() - self.baseline_bytes)

    def start(self) -> None:
        """Take the baseline (before the model is built), set the emulated capacity, arm."""
        self._thread_id = threading.get_ident()
        if self.device == "cuda":
            self._cuda_begin()
            self._start_device_watch()
        else:
            self.baseline_bytes = malloc_in_use_bytes()
            if self.capacity_bytes:
                self._stop.clear()
                self._watchdog = threading.Thread(
                    target=self._watch, name="infrarsi-mem-watchdog", daemon=True
                )
                self._watchdog.start()
        self._armed = True

    def _cuda_begin(self) -> None:
        """Empty the allocator's cache, reset its peak, apply the emulated capacity."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        if self.capacity_bytes:
            total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, self.capacity_bytes / total))

    def _cuda_end(self) -> None:
        if self.capacity_bytes:
            torch.cuda.set_per_process_memory_fraction(1.0)

    def _start_device_watch(self) -> None:
        """Baseline the device's used memory and watch it (the ``device_used`` measure)."""
        if self._device_used is None:
            ordinal = torch.cuda.current_device()  # the watchdog thread's own current device is 0

            def read() -> int:
                free, total = torch.cuda.mem_get_info(ordinal)
                return int(total - free)

            self._device_used = read
        try:
            self.device_used_baseline_bytes = int(self._device_used())
        except Exception:
            return
        self.device_used_peak_bytes = 0
        self._stop.clear()
        self._watchdog = threading.Thread(
            target=self._watch_device, name="infrarsi-device-watchdog", daemon=True
        )
        self._watchdog.start()

    def _watch_device(self) -> None:
        assert self._device_used is not None
        while not self._stop.wait(self.poll_s):
            if not self._armed:
                continue
            try:
                cur = max(0, int(self._device_used()) - self.device_used_baseline_bytes)
            except Exception:
                return
            if cur > (self.device_used_peak_bytes or 0):
                self.device_used_peak_bytes = cur
            if self.capacity_bytes and cur > self.capacity_bytes and self._armed:
                self._record_crossing(cur, f"{self.measure_device_used} watchdog")
                if self._thread_id is not None:
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        ctypes.c_ulong(self._thread_id), ctypes.py_object(MemoryCapacityExceeded)
                    )
                return

    def peak(self) -> int:
        """Peak bytes so far (this rank)."""
        if self.device == "cuda":
            return int(torch.cuda.max_memory_allocated())
        return self.peak_bytes

    def check(self, where: str = "") -> None:
        """Sample now; raise ``MemoryCapacityExceeded`` (CPU) when over capacity."""
        if not self._armed or self.device == "cuda":
            return
        cur = self.current_bytes()
        if cur > self.peak_bytes:
            self.peak_bytes = cur
        if self.capacity_bytes and cur > self.capacity_bytes:
            self._record_crossing(cur, where)
            raise MemoryCapacityExceeded(cur, self.capacity_bytes, where)

    def _record_crossing(self, cur: int, where: str) -> None:
        with self._lock:
            if self.crossed_bytes is None:
                self.crossed_bytes, self.crossed_where = cur, where
            self._armed = False  # one OOM per trial; the rank now unwinds

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            if not self._armed:
                continue
            cur = self.current_bytes()
            if cur > self.peak_bytes:
                self.peak_bytes = cur
            if self.capacity_bytes and cur > self.capacity_bytes and self._armed:
                self._record_crossing(cur, "watchdog")
                if self._thread_id is not None:
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        ctypes.c_ulong(self._thread_id), ctypes.py_object(MemoryCapacityExceeded)
                    )
                return

    def attach(self, model: nn.Module) -> None:
        """Check at every module's forward and at the gradient of its output in backward."""

        def post(mod: nn.Module, args: Any, out: Any) -> None:
            self.check("forward")
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(self._grad_hook)

        for m in model.modules():
            self._hooks.append(m.register_forward_hook(post))

    def _grad_hook(self, grad: torch.Tensor) -> None:
        self.check("backward")

    def stop(self) -> None:
        """Disarm, stop the watchdog, remove hooks, cancel a not-yet-delivered async raise."""
        self._armed = False
        self._stop.set()
        if self._watchdog is not None:
            self._watchdog.join(timeout=1.0)
            self._watchdog = None
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        if self._thread_id is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._thread_id), None)
        if self.device == "cuda":
            self._cuda_end()

    def describe_oom(self, exc: BaseException) -> str:
        """A message naming the measure, the crossing value, the capacity and where."""
        if self.crossed_bytes is None:
            return f"out of memory: {type(exc).__name__}: {exc}"
        measure = self.measure_device_used if self.device == "cuda" else self.measure
        return (
            f"out of memory: {measure} reached {self.crossed_bytes} B over the pre-build baseline, "
            f"above the capacity of {self.capacity_bytes} B (at {self.crossed_where})"
        )

    def oom_lower_bound(self) -> int:
        """For an OOM: the known lower bound of the need (the crossing value, or the peak)."""
        if self.device == "cuda":
            return max(self.peak(), self.capacity_bytes or 0, self.crossed_bytes or 0)
        return max(self.crossed_bytes or 0, self.peak_bytes)


def is_oom(exc: BaseException) -> bool:
    """True for a real or emulated out-of-memory."""
    if isinstance(exc, MemoryCapacityExceeded):
        return True
    oom_t = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_t is not None and isinstance(exc, oom_t):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
