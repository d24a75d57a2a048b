"""A progress bar for ``run`` (trial n/N, best so far, speedup) that also logs.

A rich progress bar for ``run`` (trial n/N, best so far, speedup vs baseline) that is also a
Ray Tune callback, plus the device-hours budget stopper."""

from __future__ import annotations

import math
from typing import Any

from ray.tune import Callback, Stopper
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from infrarsi.result import TrialResult


class _DeviceBudgetStopper(Stopper):
    def __init__(self, progress: RunProgress, budget_device_s: float | None) -> None:
        self.progress = progress
        self.budget = budget_device_s

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return self.budget is not None and self.progress.device_seconds >= self.budget


class RunProgress(Callback):
    """Tracks completed trials, the best step time and device-seconds; renders a progress bar."""

    def __init__(self, *, total: int, done: int, baseline_step_time_s: float | None,
                 enabled: bool = True, history: list[TrialResult] | None = None) -> None:
        self.total = total
        self.done = done
        self.baseline = baseline_step_time_s
        self.best = math.inf
        self.device_seconds = 0.0
        self.statuses: dict[str, int] = {}
        for r in history or []:
            self._account(r.status, r.step_time_s, r.device_seconds)
        self.enabled = enabled
        self._progress: Progress | None = None
        self._task: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles callbacks and stoppers into its experiment checkpoint; the live rich
        # progress bar (locks, a console) stays behind.
        state = dict(self.__dict__)
        state["_progress"] = None
        state["_task"] = None
        return state

    def _account(self, status: str | None, step: float | None, device_s: float | None) -> None:
        status = status or "failed"
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if status == "ok" and step is not None and not math.isnan(step):
            self.best = min(self.best, float(step))
        self.device_seconds += float(device_s or 0.0)

    def describe(self) -> str:
        if math.isinf(self.best):
            best = "best -"
        else:
            best = f"best {self.best:.3f} s/step"
            if self.baseline:
                best += f" ({self.baseline / self.best:.2f}x vs baseline)"
        st = " ".join(f"{k}:{v}" for k, v in sorted(self.statuses.items()))
        return f"{best}  [{st}]"

    def __enter__(self) -> RunProgress:
        if self.enabled:
            self._progress = Progress(
                TextColumn("run"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                TimeElapsedColumn(), transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.describe(), total=self.total, completed=self.done)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        self.done += 1
        self._account(result.get("status"), result.get("step_time_s"), result.get("device_seconds"))
        if self._progress is not None:
            self._progress.update(self._task, completed=self.done, description=self.describe())

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.done += 1
        self.statuses["failed"] = self.statuses.get("failed", 0) + 1
        if self._progress is not None:
            self._progress.update(self._task, completed=self.done, description=self.describe())

    def stopper(self, budget_device_s: float | None) -> Stopper:
        return _DeviceBudgetStopper(self, budget_device_s)
