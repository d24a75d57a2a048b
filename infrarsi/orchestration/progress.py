"""A progress bar for ``run`` (trial n/N, best so far, speedup) that also logs.

A rich progress bar for ``run`` (trial n/N, best so far, speedup vs baseline) that is also a
Ray Tune callback, plus the device-hours budget stopper."""

from __future__ import annotations

import math
import pickle
from typing import Any

from ray.tune import Callback, Stopper
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from infrarsi.result import TrialResult


class _DeviceBudgetStopper(Stopper):
    def __init__(self, progress: RunProgress, budget_device_s: float | None) -> None:
        self.progress = progress
        self.budget = budget_device_s

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        if self.progress.harness_errors:  # stop at the first harness error (fail fast)
            return True
        return self.budget is not None and self.progress.device_seconds >= self.budget


def is_lost_actor(error: BaseException | None) -> bool:
    """Whether a Tune trial's error is its trial actor's death (killed, or its node lost: Tune
    retries the trial) rather than an exception raised by the trainable's code (a harness error:
    the log cannot be written, the executor died...; a ``RayTaskError``)."""
    from ray.exceptions import RayActorError, RayTaskError

    return isinstance(error, RayActorError) and not isinstance(error, RayTaskError)


class RunProgress(Callback):
    """Tracks completed trials, the best step time and device-seconds; renders a progress bar."""

    def __init__(
        self,
        *,
        total: int,
        done: int,
        baseline_step_time_s: float | None,
        enabled: bool = True,
        history: list[TrialResult] | None = None,
    ) -> None:
        self.total = total
        self.done = done
        self.baseline = baseline_step_time_s
        self.best = math.inf
        self.device_seconds = 0.0
        self.statuses: dict[str, int] = {}
        for r in history or []:
            self._account(r.status, r.step_time_s, r.device_seconds)
        self.enabled = enabled
        self.harness_errors: list[BaseException] = []
        """Errors raised by a trainable's code (not a trial actor's death); the first stops the run."""
        self._progress: Progress | None = None
        self._task: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles callbacks and stoppers into its experiment checkpoint; the live rich
        # progress bar (locks, a console) stays behind.
        state = dict(self.__dict__)
        state["_progress"] = None
        state["_task"] = None
        state["harness_errors"] = []
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
                TextColumn(f"{'run':<10}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                transient=False,
                console=Console(stderr=True),  # stdout: the result
            )
            self._progress.start()
            self._task = self._progress.add_task(
                self.describe(), total=self.total, completed=self.done
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def set_done(self, done: int) -> None:
        """Trials of the budget done so far (read from the log when a Tune run starts)."""
        self.done = done
        if self._progress is not None:
            self._progress.update(self._task, completed=self.done, description=self.describe())

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        self.done += 1
        self._account(result.get("status"), result.get("step_time_s"), result.get("device_seconds"))
        if self._progress is not None:
            self._progress.update(self._task, completed=self.done, description=self.describe())

    def _check_error(self, trial: Any) -> None:
        error: BaseException | None
        try:  # Tune pickled it into the trial's local folder just before calling back
            with open(trial.pickled_error_file, "rb") as f:
                error = pickle.load(f)
        except Exception as e:  # unreadable: count it as the harness's (stops the run)
            error = e
        if not is_lost_actor(error):
            self.harness_errors.append(
                error
                if error is not None
                else RuntimeError(
                    f"Ray Tune trial {getattr(trial, 'trial_id', '?')} failed without a stored error"
                )
            )

    @property
    def errors(self) -> list[BaseException]:
        """The harness errors (read by ``raise_harness_errors``)."""
        return self.harness_errors

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._check_error(trial)  # a lost trial actor is retried; anything else stops the run

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._check_error(trial)
        self.done += 1
        self.statuses["failed"] = self.statuses.get("failed", 0) + 1
        if self._progress is not None:
            self._progress.update(self._task, completed=self.done, description=self.describe())

    def stopper(self, budget_device_s: float | None) -> Stopper:
        return _DeviceBudgetStopper(self, budget_device_s)
