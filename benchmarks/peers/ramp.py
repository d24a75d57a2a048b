"""A DeepSpeed-autotuner-style ramp: per ZeRO stage, raise the micro-batch until OOM.

This follows the DeepSpeed autotuner's "fast" mode: the user's config fixes every other knob
(here: the workload baseline, then each knob's default), and the tuner walks ZeRO stages
0 -> 3, raising ``micro_batch_size`` through its values until a trial runs out of memory (or
fails, or gets slower than the previous micro-batch). To use a larger budget generously, the
ramp then repeats with the other ``activation_checkpointing`` values (baseline's first). It
learns nothing from an OOM beyond "stop raising".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from benchmarks.peers.base import BestObserved, Observation
from infrarsi.search.space import SearchSpace


class RampPeer(BestObserved):
    """Stage-by-stage micro-batch ramp; OOM ends the ramp of that stage."""

    def __init__(
        self, space: SearchSpace, memory_capacity: float, seed: int, baseline: dict[str, Any]
    ) -> None:
        super().__init__()
        self.space = space
        self.base = {**space.default_config(), **baseline}
        self._stop_ramp = False
        self._prev_time: float | None = None
        self._gen = self._plan()
        self._fallback = space.enumerate() or []
        self._seen: set[str] = set()

    def _outer(self) -> list[dict[str, Any]]:
        names = self.space.names
        if "activation_checkpointing" not in names:
            return [{}]
        values = list(self.space.knob("activation_checkpointing").values)
        first = self.base.get("activation_checkpointing", values[0])
        return [
            {"activation_checkpointing": v} for v in [first] + [v for v in values if v != first]
        ]

    def _plan(self) -> Iterator[dict[str, Any]]:
        stages = (
            list(self.space.knob("zero_stage").values)
            if "zero_stage" in self.space.names
            else [None]
        )
        mbs_values = sorted(self.space.knob("micro_batch_size").values)
        for outer in self._outer():
            for stage in stages:
                self._stop_ramp, self._prev_time = False, None
                for mbs in mbs_values:
                    cfg = {**self.base, **outer, "micro_batch_size": mbs}
                    if stage is not None:
                        cfg["zero_stage"] = stage
                    cfg = self.space.resolve(cfg)
                    if self.space.violated(cfg):
                        continue
                    yield cfg
                    if self._stop_ramp:
                        break

    def ask(self) -> dict[str, Any]:
        for cfg in self._gen:
            key = self.space.key(cfg)
            if key not in self._seen:
                self._seen.add(key)
                return cfg
        for cfg in self._fallback:  # plan exhausted: the grid in order (never reached at 48)
            key = self.space.key(cfg)
            if key not in self._seen:
                self._seen.add(key)
                return dict(cfg)
        return dict(self.base)

    def tell(self, config: dict[str, Any], obs: Observation) -> None:
        self._record(config, obs)
        if obs.status != "ok" or obs.step_time_s is None:
            self._stop_ramp = True
            return
        if self._prev_time is not None and obs.step_time_s > self._prev_time:
            self._stop_ramp = True
        self._prev_time = obs.step_time_s
