"""The optimizer's models and their refit schedule (warm starts, capped iterations).

``ModelSet.update_time`` / ``update_memory`` refit only a model whose data changed. A refit
warm-starts from the last parameters and runs a few iterations; a full refit (more iterations)
happens when the data grew by ``OptimizerSettings.full_refit_growth`` since the last full one
(iterations: ``time_gp_iters``, ``memory_gp_iters``). When the parameters were already fitted on exactly
the current data (e.g. after ``load_state_dict``), the model is rebuilt without optimisation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from infrarsi.search.models.predict import ExactMarginal, VariationalMarginal
from infrarsi.search.models.time_gp import (
    State,
    acquisition_variance_cut,
    fit_time_gp,
    state_from_json,
    state_to_json,
)
from infrarsi.search.models.tobit import fit_tobit_gp
from infrarsi.search.settings import DEFAULT_SETTINGS, OptimizerSettings


@dataclass
class _Slot:
    """One model with its warm-start state."""

    model: Any = None
    """The fitted BoTorch model (None before two points)."""
    pred: Any = None
    """Fast marginal predictor of ``model`` (``ExactMarginal`` or ``VariationalMarginal``)."""
    state: State | None = None
    """Its parameters, for the next warm start."""
    fitted_key: str = ""
    """Fingerprint of the data the state was fitted on."""
    full_n: int = 0
    """Number of points at the last full refit."""


@dataclass
class ModelSet:
    """The step-time and memory GPs, with warm-start state."""

    mean_indices: list[int]
    """Memory-tagged feature indices (for the Tobit prior mean)."""
    mean_signs: list[float]
    """+1 for hungry, -1 for saver features."""
    prior_dim: int | None = None
    """With an analytic prior: the number of real features ``d``; inputs then carry two more
    columns, the prior's log step time (column ``d``) and log(peak / capacity) (column ``d + 1``)."""
    settings: OptimizerSettings = DEFAULT_SETTINGS
    """Refit schedule, iterations and the step-time kernel's settings."""
    time: _Slot = field(default_factory=_Slot)
    """The step-time GP."""
    memory: _Slot = field(default_factory=_Slot)
    """The censored memory GP."""

    @staticmethod
    def _key(*tensors: torch.Tensor) -> str:
        return "|".join(f"{tuple(t.shape)}:{float(t.double().sum()):.12g}:{float((t.double() ** 2).sum()):.12g}"
                        for t in tensors)

    def update_time(self, X: torch.Tensor, log_t: torch.Tensor) -> None:
        """Refit the step-time GP on ``X`` (``(n, d)``), ``log_t`` (``(n,)``) if they changed."""
        if X.shape[0] < 2:
            self.time.model = self.time.pred = None
            return
        key = self._key(X, log_t)
        if self.time.model is not None and key == self.time.fitted_key:
            return
        n = X.shape[0]
        if key == self.time.fitted_key and self.time.state is not None:
            iters = 0
        elif self.time.state is None or n >= self.settings.full_refit_growth * self.time.full_n:
            iters, self.time.full_n = self.settings.time_gp_iters[0 if self.time.state is None else 1], n
        else:
            iters = self.settings.time_gp_iters[2]
        off = None if self.prior_dim is None else (self.prior_dim, self.prior_dim)
        s = self.settings
        self.time.model, self.time.state = fit_time_gp(X, log_t, warm=self.time.state, maxiter=iters, offset=off,
                                                       config_sd=s.config_deviation_sd, kernel=s.time_kernel)
        cut = acquisition_variance_cut(self.time.model, s.config_deviation_sd, s.acquisition_config_sd)
        self.time.pred = ExactMarginal(self.time.model, cut)
        self.time.fitted_key = key

    def update_memory(self, X: torch.Tensor, y: torch.Tensor, censored: torch.Tensor) -> None:
        """Refit the Tobit GP on log(peak/capacity) ``y`` with the censoring mask, if they changed."""
        if X.shape[0] < 2:
            self.memory.model = self.memory.pred = None
            return
        key = self._key(X, y, censored)
        if self.memory.model is not None and key == self.memory.fitted_key:
            return
        n = X.shape[0]
        if key == self.memory.fitted_key and self.memory.state is not None:
            iters = 0
        elif self.memory.state is None or n >= self.settings.full_refit_growth * self.memory.full_n:
            iters, self.memory.full_n = self.settings.memory_gp_iters[0 if self.memory.state is None else 1], n
        else:
            iters = self.settings.memory_gp_iters[2]
        self.memory.model, self.memory.state = fit_tobit_gp(
            X, y, censored, mean_indices=self.mean_indices, mean_signs=self.mean_signs,
            warm=self.memory.state, maxiter=iters,
            offset=None if self.prior_dim is None else (self.prior_dim, self.prior_dim + 1))
        self.memory.pred = VariationalMarginal(self.memory.model)
        self.memory.fitted_key = key

    def state_dict(self) -> dict[str, Any]:
        """JSON-able warm-start state."""
        return {name: {"state": state_to_json(s.state), "fitted_key": s.fitted_key, "full_n": s.full_n}
                for name, s in (("time", self.time), ("memory", self.memory))}

    def load_state_dict(self, raw: dict[str, Any]) -> None:
        """Inverse of ``state_dict`` (models are rebuilt lazily)."""
        for name in ("time", "memory"):
            r = raw.get(name) or {}
            setattr(self, name, _Slot(model=None, state=state_from_json(r.get("state")),
                                      fitted_key=str(r.get("fitted_key", "")), full_n=int(r.get("full_n", 0))))
