"""The analytic prior's side of ``Optimizer`` (mixed into it): model inputs and coefficient fits.

With a prior (``infrarsi.search.priors.mean``), every model input row is the encoded config plus two
columns: the fitted prior's log step time and its log(peak / capacity) (``models.offset_mean``).
The prior's terms are cached per config; its time coefficients are refitted on the trusted ok
step times and its memory coefficients on every memory observation (OOMs as censored rows), each
only when its data changed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from infrarsi.search.encoding import Encoder
from infrarsi.search.priors.mean import (
    MEMORY_NOISE_SD,
    TIME_NOISE_SD,
    PriorMean,
    fit_log_coefficients,
    log_prior_sum,
)
from infrarsi.search.space import SearchSpace

if TYPE_CHECKING:
    from infrarsi.search.optimizer import Observation


class PriorInputsMixin:
    """Prior methods of ``Optimizer``."""

    space: SearchSpace
    encoder: Encoder
    memory_capacity: float
    prior: PriorMean | None
    prior_coef: dict[str, np.ndarray | None]
    prior_fit_keys: dict[str, str | None]
    _prior_rows: dict[str, tuple[np.ndarray, np.ndarray]]

    def _terms(self, configs: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        """The prior's ``(n, kt)`` time and ``(n, km)`` memory terms (cached per config)."""
        assert self.prior is not None  # internal: only called with a prior
        keys = [self.space.key(c) for c in configs]
        todo = {k: c for k, c in zip(keys, configs, strict=True) if k not in self._prior_rows}
        if todo:
            T, M = self.prior.terms(list(todo.values()))
            for i, k in enumerate(todo):
                self._prior_rows[k] = (T[i], M[i])
        kt, km = len(self.prior.time_names), len(self.prior.memory_names)
        if not keys:
            return np.zeros((0, kt)), np.zeros((0, km))
        return (np.stack([self._prior_rows[k][0] for k in keys]), np.stack([self._prior_rows[k][1] for k in keys]))

    def _augment(self, X: torch.Tensor, T: np.ndarray, M: np.ndarray) -> torch.Tensor:
        """``X`` plus the fitted prior's log step time and log(peak / capacity) columns."""
        kt, km = T.shape[1], M.shape[1]
        ct, cm = self.prior_coef["time"], self.prior_coef["memory"]
        off_t = log_prior_sum(T, np.zeros(kt) if ct is None else ct)
        off_m = log_prior_sum(M / self.memory_capacity, np.zeros(km) if cm is None else cm)
        return torch.cat([X, off_t.reshape(-1, 1), off_m.reshape(-1, 1)], dim=-1)

    def _X(self, configs: Sequence[Mapping[str, Any]]) -> torch.Tensor:
        """Model inputs of ``configs``: encoded features (plus the prior's columns)."""
        X = self.encoder.encode(configs)
        return X if self.prior is None else self._augment(X, *self._terms(configs))

    def _fit_prior_time(self, ok: list[Observation]) -> None:
        """Refit the prior's time coefficients when their data changed (a refit on the same data
        drifts by ~1e-7, which changed the GPs' inputs and made them refit too)."""
        if not ok or self.prior is None:
            return
        y = np.array([math.log(o.outcome.step_time) for o in ok])  # type: ignore[arg-type]
        key = repr(([self.space.key(o.config) for o in ok], y.tolist()))
        if key != self.prior_fit_keys["time"]:
            T, _ = self._terms([o.config for o in ok])
            self.prior_coef["time"] = fit_log_coefficients(T, y, noise_sd=TIME_NOISE_SD, warm=self.prior_coef["time"])
            self.prior_fit_keys["time"] = key

    def _fit_prior_memory(self, mem_rows: list[dict[str, Any]], mem_y: list[float], mem_cens: list[bool]) -> None:
        """Refit the prior's memory coefficients when their data changed (OOMs as censored rows)."""
        if not mem_rows or self.prior is None:
            return
        key = repr(([self.space.key(c) for c in mem_rows], mem_y, mem_cens))
        if key != self.prior_fit_keys["memory"]:
            _, M = self._terms(mem_rows)
            self.prior_coef["memory"] = fit_log_coefficients(
                M, np.array(mem_y), np.array(mem_cens), noise_sd=MEMORY_NOISE_SD, scale=self.memory_capacity,
                warm=self.prior_coef["memory"])
            self.prior_fit_keys["memory"] = key
