"""A benchmark problem (``BenchProblem``): what every searcher runs on, and one simulated trial
(``Draw``). The problems themselves are built in ``problems.py`` and ``adversarial.py``."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from infrarsi.execution.surrogate.backend import sample_trial
from infrarsi.search.space import SearchSpace


@runtime_checkable
class TrialSource(Protocol):
    """A problem's own trial sampler (an adversarial surrogate's)."""

    def draw(self, config: dict[str, Any], rng: np.random.Generator) -> Draw:
        """One noisy trial of ``config``."""
        ...


@dataclass
class Draw:
    """One simulated trial."""

    status: str
    """ok | oom | failed."""
    step_time_s: float | None
    """Measured seconds per step (None unless ok)."""
    peak_memory_bytes: float | None
    """Measured peak; for oom the capacity (known lower bound)."""
    device_seconds: float
    """Devices x seconds the trial held them (failed and oom included)."""
    wall_s: float
    """Simulated (surrogate) or measured (tabular) seconds the trial held its devices, start to end."""


@dataclass
class BenchProblem:
    """A problem every searcher runs on with the same budgets and seeds."""

    name: str
    """Problem name."""
    space: SearchSpace
    """Search space."""
    capacity: float
    """Memory capacity per device, bytes."""
    baseline: dict[str, Any]
    """The workload's baseline config."""
    truth: dict[str, float] = field(default_factory=dict)
    """Config key -> noiseless step time (inf when it does not fit or cannot run)."""
    source: Any = None
    """The analytic problem or the tabular rows."""
    prior: Any = None
    """The workload's analytic prior (``infrarsi.workload_prior``), what a study would pass."""
    world_size: int = 1
    """Devices one trial holds (the workload's world size)."""

    @property
    def oracle_time(self) -> float:
        return min(self.truth.values())

    def true_time(self, config: dict[str, Any] | None) -> float:
        if config is None:
            return math.inf
        return self.truth.get(self.space.key(self.space.validate(config)), math.inf)

    def trial(self, config: dict[str, Any], seed: int, index: int) -> Draw:
        key = self.space.key(config)
        rng = np.random.default_rng([seed, index, zlib.crc32(key.encode())])
        if isinstance(self.source, dict):  # tabular: key -> list of replicate rows
            rows = self.source.get(key)
            if not rows:
                raise KeyError(f"{self.name}: config not in the table: {config}")
            r = rows[int(rng.integers(len(rows)))]
            return Draw(
                r["status"],
                r["step_time_s"],
                r["peak_memory_bytes"],
                r["device_seconds"],
                r["device_seconds"] / self.world_size,
            )
        if isinstance(self.source, TrialSource):
            return self.source.draw(config, rng)
        status, _ev, m = sample_trial(self.source, config, rng)
        ws = self.source.world_size
        step = float(np.median(m["step_time_samples_s"])) if status == "ok" else None
        return Draw(status, step, m["peak_memory_bytes"], ws * m["wall_s"], float(m["wall_s"]))
