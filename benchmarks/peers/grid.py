"""Grid search: a systematic stride through the enumerated grid.

The grid is the space's enumeration (lexicographic in knob order). With a budget far below its
size, a grid search visits every k-th config; the start is offset by the seed and the stride
points are visited in bit-reversed (van der Corput) order, so every prefix of the run is spread
over the whole grid rather than stuck in its first corner.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.peers.base import BestObserved, Observation
from infrarsi.search.space import SearchSpace

STRIDE_POINTS = 64
"""Number of grid points of the systematic design (>= the largest benchmark budget)."""


def _bit_reversed(n: int) -> list[int]:
    bits = max(1, (n - 1).bit_length())
    order = [int(format(i, f"0{bits}b")[::-1], 2) for i in range(2**bits)]
    return [i for i in order if i < n]


class GridPeer(BestObserved):
    """Visits ``STRIDE_POINTS`` evenly strided configs of the grid, spread-first."""

    def __init__(
        self, space: SearchSpace, memory_capacity: float, seed: int, baseline: dict[str, Any]
    ) -> None:
        super().__init__()
        rows = space.enumerate()
        if rows is None:
            raise ValueError(f"grid peer needs an enumerable space; {space.file} is too large")
        stride = max(1, len(rows) // STRIDE_POINTS)
        offset = int(np.random.default_rng(seed).integers(stride))
        points = [
            rows[(offset + i * stride) % len(rows)] for i in range(min(STRIDE_POINTS, len(rows)))
        ]
        self._order = [points[i] for i in _bit_reversed(len(points))]
        self._next = 0

    def ask(self) -> dict[str, Any]:
        cfg = self._order[self._next % len(self._order)]
        self._next += 1
        return dict(cfg)

    def tell(self, config: dict[str, Any], obs: Observation) -> None:
        self._record(config, obs)
