"""The ask/tell surface shared by every searcher in the search-efficiency benchmark."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from infrarsi.search.space import SearchSpace


@dataclass
class Observation:
    """What a searcher is told after one trial."""

    status: str
    """ok | oom | failed (as the trial log's status)."""
    step_time_s: float | None = None
    """Measured (noisy) seconds per optimizer step; None unless ok."""
    peak_memory_bytes: float | None = None
    """Measured peak per device; for oom, the known lower bound (the capacity)."""


class Peer(Protocol):
    """A searcher: proposes configs, learns from observations, recommends one."""

    def ask(self) -> dict[str, Any]: ...

    def tell(self, config: dict[str, Any], obs: Observation) -> None: ...

    def best(self) -> dict[str, Any] | None: ...


PeerFactory = Callable[[SearchSpace, float, int, dict[str, Any]], Peer]


class BestObserved:
    """Mixin: recommend the config with the lowest measured step time (what peers do)."""

    def __init__(self) -> None:
        self._best: tuple[float, dict[str, Any]] | None = None

    def _record(self, config: dict[str, Any], obs: Observation) -> None:
        if (
            obs.status == "ok"
            and obs.step_time_s is not None
            and (self._best is None or obs.step_time_s < self._best[0])
        ):
            self._best = (obs.step_time_s, dict(config))

    def best(self) -> dict[str, Any] | None:
        return None if self._best is None else dict(self._best[1])
