"""Clocks of a training step: the phases of each micro-batch and the time inside collectives.

``PhaseClock`` splits each micro-batch into forward, backward and optimizer time without
stalling the device; ``CommTimer`` adds up the seconds DeepSpeed's collectives take on CPU.
"""

from __future__ import annotations

import time
from typing import Any

import torch


class PhaseClock:
    """Marks the forward / backward / optimizer boundaries of each micro-batch without stalling
    the device: host clock marks on CPU (where each call blocks anyway), CUDA events on GPU (no
    host synchronisation inside a step; ``micro_batch_phases`` is read after the step's own
    final sync). Four marks per micro-batch: before forward, before backward, before the
    optimizer step, after it."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"
        self._marks: list[Any] = []

    def reset(self) -> None:
        self._marks.clear()

    def mark(self) -> None:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self._marks.append(e)
        else:
            self._marks.append(time.perf_counter())

    def _seconds(self, a: Any, b: Any) -> float:
        return float(a.elapsed_time(b)) / 1000.0 if self.cuda else float(b - a)

    def micro_batch_phases(self) -> list[tuple[float, float, float]]:
        """(forward, backward, optimizer) seconds of each micro-batch marked since ``reset``."""
        m = self._marks
        return [
            (
                self._seconds(m[i], m[i + 1]),
                self._seconds(m[i + 1], m[i + 2]),
                self._seconds(m[i + 2], m[i + 3]),
            )
            for i in range(0, len(m) - 3, 4)
        ]


class CommTimer:
    """Seconds spent inside DeepSpeed's collectives (wraps the methods of ``deepspeed.comm``'s
    backend once per process). CPU only: gloo collectives block, so the time is real; on GPU
    timing them would need a sync that distorts overlap, so it reports 0."""

    _total = [0.0]
    _installed = False
    OPS = (
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "reduce_scatter_tensor",
        "reduce_scatter",
        "broadcast",
        "all_to_all_single",
        "reduce",
        "allgather_fn",
        "all_reduce_coalesced",
        "all_gather_coalesced",
        "reduce_scatter_fn",
        "inference_all_reduce",
    )

    @classmethod
    def install(cls, device: str) -> type[CommTimer]:
        if device != "cpu" or cls._installed:
            return cls
        from deepspeed.comm import comm as dscomm

        cdb = dscomm.cdb
        if cdb is None:
            return cls
        for name in cls.OPS:
            fn = getattr(cdb, name, None)
            if fn is None:
                continue

            def wrapped(*a: Any, __fn: Any = fn, **k: Any) -> Any:
                t = time.perf_counter()
                try:
                    return __fn(*a, **k)
                finally:
                    cls._total[0] += time.perf_counter() - t

            setattr(cdb, name, wrapped)
        cls._installed = True
        return cls

    @classmethod
    def total_s(cls) -> float:
        return cls._total[0]
