"""The pure search core of infrarsi (no Ray): search spaces, models, acquisition, ask/tell.

::

    from infrarsi.search import SearchSpace, Optimizer, Outcome
    space = SearchSpace.from_yaml("search_spaces/deepspeed_dense.yaml")
    opt = Optimizer(space, memory_capacity=80e9, seed=0, baseline={...})
    cfg = opt.ask()                     # opt.last_ask_info: an AskInfo (why it was asked)
    opt.tell(cfg, Outcome(status="ok", step_time=1.9, peak_memory=6.1e10))
    opt.best()                          # opt.best_choice(): a BestChoice (the config and why)

Every tunable is a field of ``OptimizerSettings`` (``Optimizer(..., settings=...)``). Why a config
was asked is a ``Phase`` (``opt.last_ask_info.phase``); the schedule of phases is ``schedule.next_phase``.

``Optimizer`` (and the torch/BoTorch stack behind it) is imported on first use, so loading a
search space stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from infrarsi.search.ask_info import AskInfo, Phase, WarmStartOrigin
from infrarsi.search.best_choice import BEST_REASONS, BestChoice, BestReason, Evidence
from infrarsi.search.expr import Expression
from infrarsi.search.knob import Knob
from infrarsi.search.outcome import FAILURE_STATUSES, Observation, Outcome
from infrarsi.search.settings import OptimizerSettings
from infrarsi.search.space import SearchSpace

if TYPE_CHECKING:
    from infrarsi.search.optimizer import Optimizer, SearchExhausted

_LAZY = {"Optimizer", "SearchExhausted"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from infrarsi.search import optimizer

        return getattr(optimizer, name)
    raise AttributeError(f"module 'infrarsi.search' has no attribute {name!r}")


__all__ = [
    "BEST_REASONS",
    "FAILURE_STATUSES",
    "AskInfo",
    "BestChoice",
    "BestReason",
    "Evidence",
    "Expression",
    "Knob",
    "Observation",
    "Optimizer",
    "OptimizerSettings",
    "Outcome",
    "Phase",
    "SearchExhausted",
    "SearchSpace",
    "WarmStartOrigin",
]
