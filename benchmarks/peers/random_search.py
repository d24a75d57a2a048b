"""Random search: uniform over valid configs, without repeats."""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.peers.base import BestObserved, Observation
from infrarsi.search.space import SearchSpace


class RandomPeer(BestObserved):
    """Draws valid configs uniformly from the enumerated grid, never the same one twice."""

    def __init__(
        self, space: SearchSpace, memory_capacity: float, seed: int, baseline: dict[str, Any]
    ) -> None:
        super().__init__()
        self.space = space
        rows = space.enumerate()
        if rows is None:
            raise ValueError(f"random peer needs an enumerable space; {space.file} is too large")
        self._order = [rows[i] for i in np.random.default_rng(seed).permutation(len(rows))]
        self._next = 0

    def ask(self) -> dict[str, Any]:
        cfg = self._order[self._next % len(self._order)]
        self._next += 1
        return dict(cfg)

    def tell(self, config: dict[str, Any], obs: Observation) -> None:
        self._record(config, obs)
