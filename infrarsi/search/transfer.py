"""Transfer from earlier studies inside the models: prior coefficients and a stacked residual, weighted by rank.

The experience bank's rows of similar studies (``infrarsi.bank.store``; the stage layer reads them
and hands the core a ``TransferPrior``, no pyarrow here) enter the step-time and memory models in
two ways, on top of the analytic prior mean (``priors.mean``):

1. **Prior coefficients.** Each source study's own analytic prior (its hardware, its model size)
   is fitted to its measured step times and peaks exactly as a study fits its own
   (``fit_log_coefficients``, OOMs censored). Those log coefficients are the formulas' error
   on that family and code (the achieved fraction of peak FLOP/s, of link bandwidth, the
   activation overhead), which carries over to other hardware and sizes far better than raw
   seconds do. Their similarity-weighted mean becomes the centre of the target's MAP prior on
   its coefficients, instead of 0 (the nominal figures); the target's own trials still move
   them (same prior sd).
2. **A stacked residual** (Vizier-style: a source model's prediction is the prior mean of the
   target GP, which learns what differs). A GP fitted on the source rows, encoded in the target
   space, learns each source's residual: log step time minus its own fitted analytic prior,
   i.e. what the formulas miss per config. The target's prior column (the time GP's mean
   offset, ``models.offset_mean``) becomes ``log prior(x) + w * residual(x)``.

**Negative transfer.** Each part has a weight in ``[0, 1]``, chosen RGPE-style by ranking: over
the target's own ok trials, each candidate weight's prediction is scored by its discordant pairs
against the measured step times (pairs closer than ``transfer_rank_tie_log`` do not count), and
the weight with the fewest wins (ties go to the larger weight: the bank is trusted until the
study's own trials rank it worse). The centre's prediction is the source-only model, the
analytic prior with log coefficients ``w * centre`` (the centre used is ``w * centre``); the
residual's is the fitted prior plus ``w * residual(x)``. A bank that ranks this study's configs
badly (another regime, scrambled
outcomes) loses its weight after a few trials and the search is the cold one again; a faithful
one keeps it. While a weight is above 0 the space-filling design can be shortened to
``transfer_n_init`` distinct configs (off by default: measured, it made the search re-run a
mediocre warm-start incumbent early; ``docs/BENCHMARKS.md``, transfer).

Rank-based weighting was chosen over a multi-task GP: it needs no joint hyperparameter fit
(cheap, deterministic, the same asks after save/restore), it is invariant to the scale
differences between hardware, and it degrades to the cold optimizer, not to a worse one, when the
source is unrelated. Memory transfers by the coefficient centre only (bytes per config depend on
the model and code, not on the hardware's speed); its weight is not tied to the time ranking.

**A bank that cannot rank its own trials is not used for step time.** Before this study has
trials, the centre is checked on the bank itself (``transfer_checks.TimeRankCheck``): each source's step times
are predicted by the other sources' centre (with one source, by a fit on the other half of its
trials) and Kendall's tau between prediction and measurement is tested against chance, the
sources' p-values combined (Stouffer). A bank whose formulas rank its own trials no better than
chance (scrambled outcomes, a noise-dominated or mislabelled study) has nothing to say about this
study's times: both weights stay 0 for the whole study (under the ``mapped`` and ``alternate``
warm-start rules, no warm starts either), since on a study's first few trials a random
prediction can out-rank the cold one by chance. Memory is not affected.
Its error on the sources' own peaks, out of sample (``memory_sd``), replaces the wide prior-only
sd until this study has a memory model, so the first asks can trust a config near capacity
that the bank's formulas place well inside it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from infrarsi.search.encoding import Encoder
from infrarsi.search.priors.mean import PriorMean, fit_log_coefficients, log_prior_sum
from infrarsi.search.settings import OptimizerSettings
from infrarsi.search.transfer_checks import (
    fit_time_coefficients,
    memory_sd,
    time_rank_check,
    weighted_centre,
)

WEIGHT_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)
"""Candidate transfer weights scored by ranking (``TransferModel.update_weight``)."""


@dataclass(frozen=True)
class SourceStudy:
    """One earlier study's trials, as the stage layer read them from the bank."""

    name: str
    """The source study (its name, or its bank key)."""
    similarity: float
    """Workload similarity to the target, in (0, 1] (``Bank.warm_start_rows``); weights the average."""
    configs: tuple[dict[str, Any], ...]
    """Each trial's config re-validated in the TARGET space (the residual model's inputs)."""
    source_configs: tuple[dict[str, Any], ...]
    """Each trial's config as measured (the source prior's terms are computed on it)."""
    step_times_s: tuple[float | None, ...]
    """Measured seconds per step (None unless the trial was ok)."""
    peak_memory_bytes: tuple[float | None, ...]
    """Measured peak per device, bytes; for an OOM a lower bound (None: unknown)."""
    memory_censored: tuple[bool, ...]
    """True where the peak is only a lower bound (the trial ran out of memory)."""
    memory_capacity_bytes: float | None
    """The source study's capacity per device, bytes (None: memory is not transferred)."""
    prior: PriorMean | None = None
    """The source study's own analytic prior (its hardware and size); None: the target's prior
    stands in (the stage layer could not rebuild the source's)."""
    trial_ids: tuple[str, ...] = ()
    """The source trials' ids (for the audit)."""

    def __post_init__(self) -> None:
        n = len(self.configs)
        for name in ("source_configs", "step_times_s", "peak_memory_bytes", "memory_censored"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"SourceStudy {self.name!r}: `len({name}) == len(configs)` must hold, "
                    f"but got ({len(getattr(self, name))}, {n})."
                )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (``from_dict`` inverts it; the prior as its ``spec()``)."""
        return {
            "name": self.name,
            "similarity": self.similarity,
            "configs": [dict(c) for c in self.configs],
            "source_configs": [dict(c) for c in self.source_configs],
            "step_times_s": list(self.step_times_s),
            "peak_memory_bytes": list(self.peak_memory_bytes),
            "memory_censored": list(self.memory_censored),
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "prior": None if self.prior is None else self.prior.spec(),
            "trial_ids": list(self.trial_ids),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SourceStudy:
        """Inverse of ``to_dict``."""
        from infrarsi.search.priors.registry import prior_from_spec

        return cls(
            name=str(raw["name"]),
            similarity=float(raw["similarity"]),
            configs=tuple(dict(c) for c in raw["configs"]),
            source_configs=tuple(dict(c) for c in raw["source_configs"]),
            step_times_s=tuple(raw["step_times_s"]),
            peak_memory_bytes=tuple(raw["peak_memory_bytes"]),
            memory_censored=tuple(bool(c) for c in raw["memory_censored"]),
            memory_capacity_bytes=raw.get("memory_capacity_bytes"),
            prior=None if raw.get("prior") is None else prior_from_spec(raw["prior"]),
            trial_ids=tuple(str(t) for t in raw.get("trial_ids") or ()),
        )


@dataclass(frozen=True)
class TransferPrior:
    """What the bank hands the search core: the similar studies' trials."""

    sources: tuple[SourceStudy, ...] = field(default_factory=tuple)
    """The source studies, most similar first."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (``from_dict`` inverts it)."""
        return {"sources": [s.to_dict() for s in self.sources]}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> TransferPrior:
        """Inverse of ``to_dict``."""
        return cls(sources=tuple(SourceStudy.from_dict(s) for s in raw.get("sources") or ()))

    @property
    def n_rows(self) -> int:
        """Trials over all sources."""
        return sum(len(s.configs) for s in self.sources)


def discordant_pairs(pred: np.ndarray, y: np.ndarray, tie: float) -> int:
    """Pairs ``(i, j)`` with ``|y_i - y_j| > tie`` that ``pred`` orders the other way."""
    dy = y[:, None] - y[None, :]
    dp = pred[:, None] - pred[None, :]
    counted = dy > tie
    return int(np.sum(counted & (dp <= 0)))


def _best_weight(
    preds: Sequence[np.ndarray], y: np.ndarray, tie: float, *, prefer_larger: bool
) -> float:
    """The ``WEIGHT_GRID`` entry whose prediction has the fewest discordant pairs (ties: the larger
    one if ``prefer_larger``, else the smaller)."""
    losses = [discordant_pairs(p, y, tie) for p in preds]
    best = min(losses)
    tied = [w for w, loss in zip(WEIGHT_GRID, losses, strict=True) if loss == best]
    return max(tied) if prefer_larger else min(tied)


class TransferModel:
    """The fitted transfer: coefficient centres, the residual model and its current weight."""

    def __init__(
        self,
        record: TransferPrior,
        encoder: Encoder,
        target_prior: PriorMean,
        settings: OptimizerSettings,
        residual_state: Mapping[str, Any] | None = None,
    ) -> None:
        from infrarsi.search.models.time_gp import fit_time_gp, state_from_json

        self.record = record
        """The bank's trials (saved with the optimizer)."""
        self.settings = settings
        self.weight_history: list[tuple[int, float, float]] = []
        """``(ok trials seen, centre_weight, residual_weight)`` each time the weights were re-chosen."""
        centres: dict[str, list[tuple[float, np.ndarray]]] = {"time": [], "memory": []}
        memory_rows: list[tuple[np.ndarray, np.ndarray, np.ndarray, float]] = []
        time_fits: list[tuple[float, np.ndarray, np.ndarray, np.ndarray]] = []
        X_rows: list[dict[str, Any]] = []
        res: list[float] = []
        self.used_rows = 0
        """Source trials that entered a fit."""
        for src in record.sources:
            prior = src.prior if src.prior is not None else target_prior
            if tuple(prior.time_names) != tuple(target_prior.time_names) or tuple(
                prior.memory_names
            ) != tuple(target_prior.memory_names):
                continue  # another kind of prior: its coefficients mean other things
            T, M = prior.terms(list(src.source_configs))
            ok = [i for i, t in enumerate(src.step_times_s) if t is not None and t > 0]
            w = max(float(src.similarity), 1e-6)
            if len(ok) >= 2:
                y = np.array([math.log(float(src.step_times_s[i])) for i in ok])  # type: ignore[arg-type]
                u = fit_time_coefficients(T[ok], y, settings)
                centres["time"].append((w, u))
                time_fits.append((w, T[ok], y, u))
                fitted = log_prior_sum(T[ok], u).numpy()
                for j, i in enumerate(ok):
                    X_rows.append(src.configs[i])
                    res.append(float(y[j] - fitted[j]))
            cap = src.memory_capacity_bytes
            mem = [i for i, p in enumerate(src.peak_memory_bytes) if p is not None and p > 0]
            if cap and len(mem) >= 2:
                ym = np.array([math.log(float(src.peak_memory_bytes[i]) / cap) for i in mem])  # type: ignore[arg-type]
                cens = np.array([bool(src.memory_censored[i]) for i in mem])
                um = fit_log_coefficients(
                    M[mem],
                    ym,
                    cens,
                    noise_sd=settings.prior_memory_noise_sd,
                    scale=cap,
                    prior_sd=settings.prior_memory_coef_sd,
                    max_iter=settings.prior_fit_iters,
                )
                centres["memory"].append((w, um))
                memory_rows.append((M[mem], ym, cens, cap))
            self.used_rows += len(set(ok) | set(mem))
        self.centres: dict[str, np.ndarray | None] = {}
        """Similarity-weighted mean log coefficients of the sources (None: no source had enough)."""
        for kind, items in centres.items():
            if not items:
                self.centres[kind] = None
                continue
            self.centres[kind] = weighted_centre(items)
        self.memory_sd = memory_sd(centres["memory"], memory_rows)
        """RMS error of log peak memory under the memory centre on the sources' own trials, out of
        sample (each source's peaks under the other sources' centre; in sample with one source);
        None without a memory centre. ``ModelSet`` uses it as the prior-only memory sd."""
        self.encoder = encoder
        self.residual_model: Any = None
        """A GP on the target encoding of the sources' residuals (None: fewer than 3 rows)."""
        self.residual_state: dict[str, Any] | None = None
        """The residual GP's hyperparameters (JSON-able; restoring them skips the fit)."""
        if len(res) >= 3:
            from infrarsi.search.models.time_gp import state_to_json

            X = encoder.encode(X_rows)
            Y = torch.tensor(res, dtype=torch.float64)
            warm = state_from_json(dict(residual_state)) if residual_state else None
            iters = 0 if warm is not None else settings.time_gp_iters[0]
            self.residual_model, state = fit_time_gp(
                X, Y, warm=warm, maxiter=iters, config_sd=0.0, kernel=settings.time_kernel
            )
            self.residual_state = state_to_json(state)
        self._cache: dict[bytes, float] = {}
        self.rank_check = time_rank_check(time_fits, settings)
        """How the centre ranks the bank's own trials (None: too few to check; trusted)."""
        trusted = self.trusted
        self.centre_weight = 1.0 if self.centres["time"] is not None and trusted else 0.0
        """Weight in [0, 1] of the sources' time coefficients (1 until the study's trials rank them;
        0 throughout for a bank that failed ``rank_check``)."""
        self.residual_weight = 1.0 if self.residual_model is not None and trusted else 0.0
        """Weight in [0, 1] of the transferred residual (1 until the study's trials rank it; 0
        throughout for a bank that failed ``rank_check``)."""

    @property
    def trusted(self) -> bool:
        """Whether the bank's step times count at all (``rank_check`` passed, or too few to check)."""
        return self.rank_check is None or self.rank_check.trusted

    @property
    def weight(self) -> float:
        """The larger of the two weights (``centre_weight``, ``residual_weight``)."""
        return max(self.centre_weight, self.residual_weight)

    @property
    def active(self) -> bool:
        """Whether anything transferred currently counts (a weight above 0)."""
        return self.weight > 0

    def centre(self, kind: str) -> np.ndarray | None:
        """The centre of the target's log-coefficient prior: the sources' mean (times
        ``centre_weight`` for step time), or None (nominal: 0)."""
        c = self.centres.get(kind)
        if c is None:
            return None
        return c * self.centre_weight if kind == "time" else c

    def residual(self, X: torch.Tensor) -> torch.Tensor:
        """``(n,)`` the residual model's mean at encoded configs ``X`` (``(n, d)``); zeros without one."""
        n = X.shape[0]
        if self.residual_model is None or n == 0:
            return torch.zeros(n, dtype=torch.float64)
        out = torch.empty(n, dtype=torch.float64)
        keys = [X[i].numpy().tobytes() for i in range(n)]
        todo = [i for i in range(n) if keys[i] not in self._cache]
        if todo:
            with torch.no_grad():
                mean = self.residual_model.posterior(X[torch.as_tensor(todo)]).mean.reshape(-1)
            for j, i in enumerate(todo):
                self._cache[keys[i]] = float(mean[j])
        for i in range(n):
            out[i] = self._cache[keys[i]]
        return out

    def offset(self, X: torch.Tensor) -> torch.Tensor:
        """``(n,)`` what is added to the prior's log step time column: ``residual_weight * residual``."""
        if self.residual_weight <= 0:
            return torch.zeros(X.shape[0], dtype=torch.float64)
        return self.residual_weight * self.residual(X)

    def update_weight(
        self,
        X: torch.Tensor,
        terms: np.ndarray,
        log_prior_time: torch.Tensor,
        log_step_time: Sequence[float] | np.ndarray,
    ) -> float:
        """Re-choose both weights from the study's ok trials (module docstring); returns ``weight``.

        ``centre_weight``: the weight ``w`` whose source-only prediction, the analytic prior with
        log coefficients ``w * centre``, ranks the trials best. ``residual_weight``: the weight
        ``w`` for which the fitted prior plus ``w * residual`` ranks them best.

        Args:
            X: ``(n, d)`` encoded ok configs of this study.
            terms: ``(n, kt)`` the target prior's time terms at them.
            log_prior_time: ``(n,)`` the currently fitted prior's log step time at them.
            log_step_time: ``(n,)`` their measured log step times.
        """
        y = np.asarray(log_step_time, dtype=float)
        tie = self.settings.transfer_rank_tie_log
        centre = self.centres["time"]
        if not self.trusted:  # its own trials said nothing: a few of this study's cannot either
            self.centre_weight = self.residual_weight = 0.0
        elif centre is None:
            self.centre_weight = 0.0
        elif len(y) >= 2:
            self.centre_weight = _best_weight(
                [log_prior_sum(terms, w * centre).numpy() for w in WEIGHT_GRID],
                y,
                tie,
                prefer_larger=True,
            )
        if self.residual_model is None or not self.trusted:
            self.residual_weight = 0.0
        elif len(y) >= 2:
            r = self.residual(X).numpy()
            base = log_prior_time.detach().numpy()
            self.residual_weight = _best_weight(
                [base + w * r for w in WEIGHT_GRID], y, tie, prefer_larger=False
            )
        self.weight_history.append((len(y), self.centre_weight, self.residual_weight))
        return self.weight

    def to_dict(self) -> dict[str, Any]:
        """The saved transfer: the bank's trials, the residual model's parameters and the weights
        (``from_dict`` rebuilds it without a refit, so a restored optimizer asks as before)."""
        return {
            "record": self.record.to_dict(),
            "residual_state": self.residual_state,
            "weights": [self.centre_weight, self.residual_weight],
            "weight_history": [list(h) for h in self.weight_history],
        }

    @classmethod
    def from_dict(
        cls,
        raw: Mapping[str, Any],
        encoder: Encoder,
        target_prior: PriorMean,
        settings: OptimizerSettings,
    ) -> TransferModel:
        """Inverse of ``to_dict``."""
        out = cls(
            TransferPrior.from_dict(raw["record"]),
            encoder,
            target_prior,
            settings,
            residual_state=raw.get("residual_state"),
        )
        out.centre_weight, out.residual_weight = (float(w) for w in raw["weights"])
        out.weight_history = [
            (int(n), float(c), float(r)) for n, c, r in raw.get("weight_history") or []
        ]
        return out

    def summary(self) -> dict[str, Any]:
        """What the report shows: sources, rows used, coefficient centres, the weight over the study."""
        return {
            "sources": [
                {"name": s.name, "similarity": s.similarity, "rows": len(s.configs)}
                for s in self.record.sources
            ],
            "rows_used": self.used_rows,
            "time_coefficients": None
            if self.centres["time"] is None
            else np.exp(self.centres["time"]).tolist(),
            "memory_coefficients": None
            if self.centres["memory"] is None
            else np.exp(self.centres["memory"]).tolist(),
            "memory_sd": self.memory_sd,
            "rank_check": None if self.rank_check is None else self.rank_check.to_dict(),
            "residual_model": self.residual_model is not None,
            "centre_weight": self.centre_weight,
            "residual_weight": self.residual_weight,
            "weight_history": [list(h) for h in self.weight_history],
        }


__all__ = ["WEIGHT_GRID", "SourceStudy", "TransferModel", "TransferPrior", "discordant_pairs"]
