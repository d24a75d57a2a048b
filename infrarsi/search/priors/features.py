"""``PriorFeatures``: the models' input rows (with the analytic prior's columns) and its coefficient fits.

With a prior (``infrarsi.search.priors.mean``), every model input row is the encoded config plus two
columns: the fitted prior's log step time and its log(peak / capacity) (``models.offset_mean``).
Without one, it is the encoded config alone. The prior's terms are cached per config; its time
coefficients are refitted on the trusted ok step times and its memory coefficients on every
memory observation (OOMs as censored rows), each only when its data changed.

With a bank transfer (``search.transfer.TransferModel``), the coefficient fits are centred on the
similar studies' coefficients and the time column adds the transferred residual, times the
transfer's weight (which each time fit re-chooses from the study's ok trials).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from infrarsi.errors import InfrarsiError
from infrarsi.search.encoding import Encoder
from infrarsi.search.priors.mean import PriorMean, fit_log_coefficients, log_prior_sum
from infrarsi.search.settings import OptimizerSettings
from infrarsi.search.space import SearchSpace

if TYPE_CHECKING:
    from infrarsi.search.transfer import TransferModel

KINDS = ("time", "memory")
"""The prior's two term sets: step time and peak memory."""


class PriorFeatures:
    """Model inputs of configs (``inputs``) and the prior's fitted log coefficients."""

    def __init__(
        self,
        space: SearchSpace,
        encoder: Encoder,
        prior: PriorMean | None,
        memory_capacity: float,
        settings: OptimizerSettings,
        transfer: TransferModel | None = None,
    ) -> None:
        self.space = space
        self.encoder = encoder
        self.prior = prior
        """The analytic prior mean, or None (inputs are then the encoded configs alone)."""
        self.memory_capacity = memory_capacity
        """Bytes per device; the memory column is log(prior peak / capacity)."""
        self.settings = settings
        """Noise and prior sds and iterations of the coefficient fits (``prior_*``)."""
        self.coefficients: dict[str, np.ndarray | None] = {"time": None, "memory": None}
        """Fitted log coefficients of the prior's time and memory terms (None: nominal)."""
        self.fit_keys: dict[str, str | None] = {"time": None, "memory": None}
        """Fingerprint of the data each coefficient set was fitted on."""
        self._term_rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.transfer = transfer if prior is not None else None
        """The bank transfer (``search.transfer``), or None; never without a prior."""

    def _coef(self, kind: str, k: int) -> np.ndarray:
        """The current log coefficients of ``kind`` (before a fit: the transfer's centre, else 0)."""
        c = self.coefficients[kind]
        if c is not None:
            return c
        centre = None if self.transfer is None else self.transfer.centre(kind)
        return np.zeros(k) if centre is None or len(centre) != k else centre

    def _require_prior(self) -> PriorMean:
        if self.prior is None:
            raise InfrarsiError(
                "PriorFeatures: the prior's terms were asked for, but the optimizer has no prior."
            )
        return self.prior

    def terms(self, configs: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        """The prior's ``(n, kt)`` time and ``(n, km)`` memory terms (cached per config)."""
        prior = self._require_prior()
        keys = [self.space.key(c) for c in configs]
        todo = {k: c for k, c in zip(keys, configs, strict=True) if k not in self._term_rows}
        if todo:
            T, M = prior.terms(list(todo.values()))
            for i, k in enumerate(todo):
                self._term_rows[k] = (T[i], M[i])
        kt, km = len(prior.time_names), len(prior.memory_names)
        if not keys:
            return np.zeros((0, kt)), np.zeros((0, km))
        return (
            np.stack([self._term_rows[k][0] for k in keys]),
            np.stack([self._term_rows[k][1] for k in keys]),
        )

    def augment(self, X: torch.Tensor, T: np.ndarray, M: np.ndarray) -> torch.Tensor:
        """``X`` plus the fitted prior's log step time and log(peak / capacity) columns."""
        off_t = log_prior_sum(T, self._coef("time", T.shape[1]))
        off_m = log_prior_sum(M / self.memory_capacity, self._coef("memory", M.shape[1]))
        if self.transfer is not None:
            off_t = off_t + self.transfer.offset(X)
        return torch.cat([X, off_t.reshape(-1, 1), off_m.reshape(-1, 1)], dim=-1)

    def inputs(self, configs: Sequence[Mapping[str, Any]]) -> torch.Tensor:
        """Model inputs of ``configs``: encoded features (plus the prior's columns)."""
        X = self.encoder.encode(configs)
        return X if self.prior is None else self.augment(X, *self.terms(configs))

    def fit_time(self, configs: Sequence[Mapping[str, Any]], step_times_s: Sequence[float]) -> None:
        """Refit the time coefficients on ok ``configs`` and their step times when the data changed
        (a refit on the same data drifts by ~1e-7, which changed the GPs' inputs and made them refit too)."""
        if not configs or self.prior is None:
            return
        y = np.array([math.log(t) for t in step_times_s])
        key = repr(([self.space.key(c) for c in configs], y.tolist()))
        if key != self.fit_keys["time"]:
            T, _ = self.terms(configs)
            s = self.settings
            centre = None
            if self.transfer is not None:  # the weight first: it scales the centre and the residual
                X = self.encoder.encode(configs)
                self.transfer.update_weight(
                    X, T, log_prior_sum(T, self._coef("time", T.shape[1])), y
                )
                y = y - self.transfer.offset(X).numpy()
                centre = self.transfer.centre("time")
            self.coefficients["time"] = fit_log_coefficients(
                T,
                y,
                noise_sd=s.prior_time_noise_sd,
                warm=self.coefficients["time"],
                prior_sd=s.prior_time_coef_sd,
                max_iter=s.prior_fit_iters,
                centre=centre,
            )
            self.fit_keys["time"] = key

    def fit_memory(
        self,
        configs: Sequence[Mapping[str, Any]],
        log_rel_peaks: Sequence[float],
        censored: Sequence[bool],
    ) -> None:
        """Refit the memory coefficients on log(peak / capacity) when the data changed (OOMs as
        censored rows: the value is a lower bound)."""
        if not configs or self.prior is None:
            return
        key = repr(([self.space.key(c) for c in configs], log_rel_peaks, censored))
        if key != self.fit_keys["memory"]:
            _, M = self.terms(configs)
            s = self.settings
            self.coefficients["memory"] = fit_log_coefficients(
                M,
                np.array(log_rel_peaks),
                np.array(censored),
                noise_sd=s.prior_memory_noise_sd,
                scale=self.memory_capacity,
                warm=self.coefficients["memory"],
                prior_sd=s.prior_memory_coef_sd,
                max_iter=s.prior_fit_iters,
                centre=None if self.transfer is None else self.transfer.centre("memory"),
            )
            self.fit_keys["memory"] = key

    def state_dict(self) -> dict[str, Any]:
        """JSON-able fitted coefficients and their data fingerprints."""
        return {
            "coefficients": {
                k: None if v is None else [float(x) for x in v]
                for k, v in self.coefficients.items()
            },
            "fit_keys": dict(self.fit_keys),
        }

    def load_state_dict(
        self, coefficients: Mapping[str, Any] | None, fit_keys: Mapping[str, Any] | None
    ) -> None:
        """Restore ``state_dict()``'s parts. Coefficients saved for another set of terms (an older
        prior) are dropped, so they are refitted from the trials."""
        if self.prior is None:
            return
        coef = coefficients or {}
        keys = fit_keys or {}
        n_terms = {"time": len(self.prior.time_names), "memory": len(self.prior.memory_names)}
        self.coefficients = {
            k: None
            if coef.get(k) is None or len(coef[k]) != n_terms[k]
            else np.asarray(coef[k], dtype=float)
            for k in KINDS
        }
        self.fit_keys = {
            k: keys.get(k) if self.coefficients[k] is not None else None for k in KINDS
        }
