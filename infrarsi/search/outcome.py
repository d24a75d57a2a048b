"""``Outcome`` and ``Observation``: what one trial of a config told the optimizer."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from infrarsi.errors import UserInputError
from infrarsi.result import STATUSES, Status, TrialResult, is_status

FAILURE_STATUSES = ("failed", "timeout", "nan", "invariant_violation")
"""Non-OOM failures: they feed the feasibility model and are never proposed again."""


@dataclass(frozen=True)
class Outcome:
    """The result of one trial, as the optimizer sees it."""

    status: Status
    """One of ``ok``, ``oom``, ``failed``, ``timeout``, ``nan``, ``invariant_violation``."""
    step_time: float | None = None
    """Seconds per optimizer step (median over measured steps); required when ``ok``."""
    peak_memory: float | None = None
    """Peak bytes per device; for ``oom`` an optional known lower bound of the true peak."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else the caller wants kept with the observation (not used by the models)."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise UserInputError(
                f"Outcome.status: rule: must be one of {list(STATUSES)}; got {self.status!r}."
            )
        if self.status == "ok" and (
            self.step_time is None or not math.isfinite(self.step_time) or self.step_time <= 0
        ):
            raise UserInputError(
                f"Outcome.step_time: rule: an ok outcome needs a finite step_time > 0 seconds; got {self.step_time!r}."
            )
        if self.peak_memory is not None and (
            not math.isfinite(self.peak_memory) or self.peak_memory <= 0
        ):
            raise UserInputError(
                f"Outcome.peak_memory: rule: must be a finite number of bytes > 0 or None; got {self.peak_memory!r}."
            )

    @property
    def feasible(self) -> bool:
        """True when the trial ran and was measured (``ok``)."""
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (``from_dict`` inverts it)."""
        return {
            "status": self.status,
            "step_time": self.step_time,
            "peak_memory": self.peak_memory,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Outcome:
        """Inverse of ``to_dict``."""
        return cls(
            status=raw["status"],
            step_time=raw.get("step_time"),
            peak_memory=raw.get("peak_memory"),
            extra=dict(raw.get("extra") or {}),
        )

    @classmethod
    def from_row(cls, row: Mapping[str, Any] | TrialResult) -> Outcome:
        """The optimizer's view of a trial-log row (a dict or a ``TrialResult``) or of a Ray Tune
        result dict. The one rule, for every caller:

        - status: an explicit ``status`` wins; an unknown one is ``failed``. A missing (or empty)
          status is ``ok`` when the row has a finite ``step_time_s`` > 0, else ``failed``;
        - ``ok`` needs a finite ``step_time_s`` > 0 (``step_time`` is read when ``step_time_s``
          is absent); without one the row is ``failed``;
        - ``peak_memory_bytes``: kept when finite and > 0, for ``ok`` (the measured peak) and
          ``oom`` (a lower bound of the true peak); dropped for other statuses;
        - ``extra["memory_censored"]``: the row's ``memory_censored`` when present, else whether
          the status is ``oom``.
        """
        if isinstance(row, TrialResult):
            row = {
                "status": row.status,
                "step_time_s": row.step_time_s,
                "peak_memory_bytes": row.peak_memory_bytes,
                "memory_censored": row.memory_censored,
            }
        step = _positive(row.get("step_time_s", row.get("step_time")))
        raw_status = row.get("status")
        status: Status
        if raw_status is None or raw_status == "":
            status = "ok" if step is not None else "failed"
        else:
            status = raw_status if is_status(raw_status) else "failed"
        if status == "ok" and step is None:
            status = "failed"
        peak = _positive(row.get("peak_memory_bytes")) if status in ("ok", "oom") else None
        censored = row.get("memory_censored")
        return cls(
            status=status,
            step_time=step if status == "ok" else None,
            peak_memory=peak,
            extra={"memory_censored": bool(status == "oom" if censored is None else censored)},
        )


@dataclass
class Observation:
    """One told trial."""

    config: dict[str, Any]
    """The full config."""
    outcome: Outcome
    """What happened."""


def _positive(value: Any) -> float | None:
    """``value`` as a finite float > 0, else None (missing, NaN, infinite, <= 0 or not a number)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x > 0 else None
