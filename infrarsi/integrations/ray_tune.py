"""``InfrarsiSearcher``: the infrarsi optimizer as a Ray Tune ``Searcher``.

A thin adapter over ``infrarsi.search.Optimizer`` for a user's own Tune job::

    from ray import tune
    from ray.tune.search import ConcurrencyLimiter
    from infrarsi.integrations.ray_tune import InfrarsiSearcher

    searcher = InfrarsiSearcher("search_spaces/deepspeed_dense.yaml", memory_capacity=80e9)
    tuner = tune.Tuner(
        my_trainable,                    # reports {"status": "ok"|"oom"|..., "step_time_s": ...,
                                         #          "peak_memory_bytes": ...}
        tune_config=tune.TuneConfig(search_alg=ConcurrencyLimiter(searcher, 4), num_samples=24),
    )
    tuner.fit()
    print(searcher.optimizer.best())

Trainables report an OOM or another failure as a normal result with a ``status`` field, read by
``Outcome.from_row`` (a missing status with a valid step time is ok). A trainable that raises
reaches the searcher as ``on_trial_complete(error=True, result=None)`` (how Ray 2.60 reports an
errored trial, without the exception) and is told to the optimizer as ``failed``; so wrap a
trainable that may run out of memory in ``oom_as_result``, which turns its
``torch.OutOfMemoryError`` into an ``oom`` result (peak >= capacity: the memory model learns from
it) instead of a failure it cannot tell apart from a crash::

    tuner = tune.Tuner(oom_as_result(my_trainable), tune_config=...)

Trials running at once are pending in the optimizer, so each ``suggest`` is a batch pick given
them (give your trainable its real resources with ``tune.with_resources``). The searcher pickles
whole, so ``Tuner.restore(path,
trainable=..., restart_errored=True)`` resumes it; ``save``/``restore`` write its state as JSON
(never pickle: a checkpoint file is data, not code).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray.tune.search import Searcher

from infrarsi.errors import ConfigError
from infrarsi.search import Optimizer, Outcome, SearchSpace

STEP_TIME_METRICS = ("step_time_s", "step_time")
"""Metric names the searcher accepts: it always minimises seconds per optimizer step."""


class InfrarsiSearcher(Searcher):
    """Ray Tune ``Searcher`` over an ``infrarsi.search.Optimizer``.

    Pass either ``space`` (a ``SearchSpace``, or a YAML path/text) with the ``Optimizer``
    keyword arguments (``memory_capacity`` in bytes per device, ``seed``, ``baseline``,
    ``settings``, ``prior``, ...), or a ready ``optimizer=``. The metric is the step time
    (``step_time_s``), minimised.
    """

    def __init__(
        self,
        space: SearchSpace | str | Path | None = None,
        *,
        optimizer: Optimizer | None = None,
        memory_capacity: float | None = None,
        metric: str = "step_time_s",
        mode: str = "min",
        **optimizer_kwargs: Any,
    ) -> None:
        _check_metric(metric, mode)
        super().__init__(metric=metric, mode=mode)
        if optimizer is None:
            if space is None:
                raise ConfigError(
                    "InfrarsiSearcher needs `space` (a SearchSpace or YAML) or `optimizer=`."
                )
            if memory_capacity is None:
                raise ConfigError(
                    "InfrarsiSearcher: `memory_capacity` (bytes per device) is required with `space`."
                )
            if not isinstance(space, SearchSpace):
                space = SearchSpace.from_yaml(space)
            optimizer = Optimizer(space, memory_capacity=memory_capacity, **optimizer_kwargs)
        elif space is not None or optimizer_kwargs or memory_capacity is not None:
            raise ConfigError(
                "InfrarsiSearcher: pass either `optimizer=` or `space` with its options, not both."
            )
        self.optimizer: Optimizer = optimizer
        """The wrapped ask/tell optimizer (its state is the searcher's state)."""
        self.live: dict[str, dict[str, Any]] = {}
        """Trial id -> config handed out and not yet completed."""
        self.told: int = 0
        """Number of outcomes told to the optimizer through this searcher."""

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict, **spec: Any
    ) -> bool:
        """Accept Tune's metric/mode when they name a step time minimised; the Tune
        ``param_space`` is merged by Tune into each trial's config (the searcher's knobs win)."""
        if metric is not None or mode is not None:
            _check_metric(metric or self._metric, mode or self._mode)
            self._metric = metric or self._metric
            self._mode = mode or self._mode
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        """The next config from ``Optimizer.ask()``."""
        asked = self.optimizer.ask()
        if not isinstance(asked, dict):  # ask() without n returns one config
            raise TypeError(
                f"Optimizer.ask() returned {type(asked).__name__}, expected a config dict"
            )
        config = dict(asked)
        self.live[trial_id] = config
        return dict(config)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """Intermediate results are ignored: a trial's outcome is its final result."""

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        """Tell the optimizer the trial's outcome (``error=True`` or no result: ``failed``)."""
        config = self.live.pop(trial_id, None)
        if config is None:
            return  # not ours (or already told, e.g. a restarted trial)
        outcome = Outcome(status="failed") if error or result is None else Outcome.from_row(result)
        self.optimizer.tell(config, outcome)
        self.told += 1

    def get_state(self) -> dict[str, Any]:
        # The optimizer's JSON-able state_dict, not the object: fitted GPyTorch models hold
        # closures that do not pickle (Tune checkpoints the searcher with pickle).
        return {
            "optimizer_state": self.optimizer.state_dict(),
            "live": dict(self.live),
            "told": self.told,
            "metric": self._metric,
            "mode": self._mode,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        if "optimizer_state" in state:
            self.optimizer = Optimizer.from_state(state["optimizer_state"])
        else:  # states written before the state_dict format
            self.optimizer = state["optimizer"]
        self.live = dict(state["live"])
        self.told = int(state["told"])
        self._metric, self._mode = state["metric"], state["mode"]

    def save(self, checkpoint_path: str) -> None:
        """Write the searcher state (the optimizer with all its observations) to a JSON file."""
        Path(checkpoint_path).write_text(json.dumps(self.get_state(), default=str))

    def restore(self, checkpoint_path: str) -> None:
        """Load a state written by ``save`` (a ``ConfigError`` naming the file when it is not one)."""
        try:
            state = json.loads(Path(checkpoint_path).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(
                f"{checkpoint_path}: not a searcher state written by InfrarsiSearcher.save "
                f"(JSON): {e}. Fix: restore from the file save() wrote."
            ) from None
        self.set_state(state)


def oom_as_result(trainable: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
    """A Tune function trainable that reports running out of memory instead of raising it.

    ``torch.OutOfMemoryError`` (CUDA, ROCm, XPU) or ``MemoryError`` raised by ``trainable(config)``
    becomes one ``tune.report`` of ``{"status": "oom", "step_time_s": nan, "peak_memory_bytes":
    ...}`` (the device's peak reserved bytes when a CUDA device was used, else None: the searcher
    then takes its capacity as the lower bound), and the trial ends normally. ``InfrarsiSearcher``
    tells it as ``oom``, a censored observation (peak >= capacity) that teaches its memory model
    where the limit is; a raised OOM would reach it only as ``failed``. Any other exception is
    raised as before (Tune marks the trial errored, the searcher tells ``failed``). Only function
    trainables: a ``tune.Trainable`` class reports from its ``step()``, so catch the OOM there.
    """
    if isinstance(trainable, type) or not callable(trainable):
        raise ConfigError(
            f"oom_as_result: rule: takes a Tune function trainable, `def f(config)`; got "
            f"{trainable!r}. Fix: for a tune.Trainable class, catch torch.OutOfMemoryError in "
            f"step() and return {{'status': 'oom', 'step_time_s': float('nan')}}."
        )

    @functools.wraps(trainable)
    def run(config: dict[str, Any]) -> Any:
        import torch
        from ray import tune

        try:
            return trainable(config)
        except (torch.OutOfMemoryError, MemoryError) as e:
            peak: float | None = None
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                peak = float(torch.cuda.max_memory_reserved()) or None
            tune.report(
                {
                    "status": "oom",
                    "step_time_s": math.nan,
                    "peak_memory_bytes": peak,
                    "error": f"{type(e).__name__}: {e}"[:500],
                }
            )
            return None

    return run


def _check_metric(metric: str | None, mode: str | None) -> None:
    if metric is not None and metric not in STEP_TIME_METRICS:
        raise ConfigError(
            f"InfrarsiSearcher: metric must be one of {list(STEP_TIME_METRICS)} (seconds per "
            f"optimizer step), but got {metric!r}. Report step_time_s from the trainable."
        )
    if mode is not None and mode != "min":
        raise ConfigError(
            f"InfrarsiSearcher: mode must be 'min' (step time is minimised), but got {mode!r}."
        )
