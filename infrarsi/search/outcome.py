"""``Outcome``: what one trial of a config told the optimizer."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from infrarsi.errors import UserInputError
from infrarsi.result import STATUSES

FAILURE_STATUSES = ("failed", "timeout", "nan", "invariant_violation")
"""Non-OOM failures: they feed the feasibility model and are never proposed again."""


@dataclass(frozen=True)
class Outcome:
    """The result of one trial, as the optimizer sees it."""

    status: str
    """One of ``ok``, ``oom``, ``failed``, ``timeout``, ``nan``, ``invariant_violation``."""
    step_time: float | None = None
    """Seconds per optimizer step (median over measured steps); required when ``ok``."""
    peak_memory: float | None = None
    """Peak bytes per device; for ``oom`` an optional known lower bound of the true peak."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else the caller wants kept with the observation (not used by the models)."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise UserInputError(f"Outcome.status: rule: must be one of {list(STATUSES)}; got {self.status!r}.")
        if self.status == "ok" and (self.step_time is None or not math.isfinite(self.step_time) or self.step_time <= 0):
            raise UserInputError(
                f"Outcome.step_time: rule: an ok outcome needs a finite step_time > 0 seconds; got {self.step_time!r}."
            )
        if self.peak_memory is not None and (not math.isfinite(self.peak_memory) or self.peak_memory <= 0):
            raise UserInputError(f"Outcome.peak_memory: rule: must be a finite number of bytes > 0 or None; got {self.peak_memory!r}.")

    @property
    def feasible(self) -> bool:
        """True when the trial ran and was measured (``ok``)."""
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (``from_dict`` inverts it)."""
        return {"status": self.status, "step_time": self.step_time, "peak_memory": self.peak_memory,
                "extra": dict(self.extra)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Outcome:
        """Inverse of ``to_dict``."""
        return cls(status=raw["status"], step_time=raw.get("step_time"), peak_memory=raw.get("peak_memory"),
                   extra=dict(raw.get("extra") or {}))

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Outcome:
        """From a trial-log row (``status``, ``step_time_s``, ``peak_memory_bytes``, ...)."""
        status = str(row.get("status") or "failed")
        step = row.get("step_time_s")
        peak = row.get("peak_memory_bytes")
        if status == "ok" and (step is None or not step > 0):
            status = "failed"
        if status != "ok":
            step = None
        return cls(status=status, step_time=None if step is None else float(step),
                   peak_memory=float(peak) if peak is not None and peak > 0 else None,
                   extra={"memory_censored": bool(row.get("memory_censored", status == "oom"))})
