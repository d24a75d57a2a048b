"""One progress bar per stage on stderr, fed by the structured log's events.

The stages log ``trial.end`` for every trial they run and ``tune`` logs ``tune.stage`` as it moves
to the next stage; ``StageBars`` listens to those events (``infrarsi.structlog_config.add_listener``)
and draws a rich bar for each stage that runs trials: the trials done, the last one's status and
step time, the elapsed time. ``run`` draws its own bar (``infrarsi.orchestration.progress.RunProgress``,
a Ray Tune callback: its trials end in the executor actor, not in this process). Bars go to
stderr, so that stdout holds only the result (a table, or one JSON object with ``--json``); when
stderr is not a terminal, each bar is printed once, when its stage ends.
"""

from __future__ import annotations

import math
import threading
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from infrarsi.structlog_config import add_listener, remove_listener

BAR_STAGES = ("doctor", "verify", "long-check")
"""Stages that get a bar here (``run`` draws its own; ``init`` and ``report`` run no trial)."""
STAGE_EVENT = "tune.stage"
"""The event ``tune`` logs (field ``stage``) when it starts a stage."""


class StageBars:
    """A listener of the structured log that draws one progress bar per stage (module doc)."""

    def __init__(self, console: Console, *, stage: str | None = None, enabled: bool = True) -> None:
        self.console = console
        """Where the bars are drawn (the CLI's stderr console)."""
        self.enabled = enabled
        """False draws nothing (the listener still counts)."""
        self.first_stage = stage
        """The stage whose bar opens on entry (a stage command's own); ``tune`` opens them by event."""
        self.stage: str | None = None
        """The stage whose bar is open, if any."""
        self.trials = 0
        """Trials ended in the open stage."""
        self._progress: Progress | None = None
        self._task: Any = None
        self._lock = threading.Lock()

    def __enter__(self) -> StageBars:
        add_listener(self)
        if self.first_stage:
            self.start(self.first_stage)
        return self

    def __exit__(self, *exc: object) -> None:
        remove_listener(self)
        with self._lock:
            self._close()

    def start(self, stage: str) -> None:
        """Close the open bar and open ``stage``'s (when it is one of ``BAR_STAGES``)."""
        with self._lock:
            self._close()
            self.stage, self.trials = stage, 0
            if not self.enabled or stage not in BAR_STAGES:
                return
            self._progress = Progress(
                TextColumn(f"{stage:<10}"),
                BarColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task("starting", total=None)

    def _close(self) -> None:
        if self._progress is not None:
            done = max(self.trials, 1)
            if not self.trials:  # e.g. a long check skipped because its budget buys nothing
                self._progress.update(self._task, description="no trial run")
            self._progress.update(self._task, total=done, completed=done)
            self._progress.stop()
        self._progress = self._task = None

    def __call__(self, event: dict[str, Any]) -> None:
        """Take one structured-log event."""
        name = event.get("event")
        if name == STAGE_EVENT and event.get("stage"):
            self.start(str(event["stage"]))
        elif name == "trial.end":
            with self._lock:
                self.trials += 1
                if self._progress is not None:
                    self._progress.update(
                        self._task, description=describe_trial(self.trials, event)
                    )


def describe_trial(done: int, event: dict[str, Any]) -> str:
    """The bar's text after ``done`` trials, the last one's ``trial.end`` event: its status and step time."""
    st = event.get("step_time_s")
    step = f" {float(st):.3f} s/step" if isinstance(st, int | float) and math.isfinite(st) else ""
    return f"{done} trial{'s' if done != 1 else ''}, last {event.get('status') or '?'}{step}"


__all__ = ["BAR_STAGES", "STAGE_EVENT", "StageBars", "describe_trial"]
