"""The bank's own trials as a check on the transfer (``search.transfer``), before the study has any.

Two measures of how far a bank's trials support what is transferred from them, each computed out
of sample across its source studies: ``time_rank_check``, whether the fitted time formulas rank
the bank's own step times better than chance (a bank that fails is not used for step time), and
``memory_sd``, the memory centre's error on the sources' own peaks (the prior-only memory sd
until the study has a memory model).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from infrarsi.search.priors.mean import fit_log_coefficients, log_prior_sum
from infrarsi.search.settings import OptimizerSettings


@dataclass(frozen=True)
class TimeRankCheck:
    """How well the bank's time centre ranks the bank's own trials, out of sample (module
    docstring): whether the transfer is trusted before this study has trials."""

    kendall_tau: float
    """Kendall's tau between predicted and measured log step time, the sources' mean (weighted
    by their scored trials); 0 is chance, 1 a perfect ranking."""
    p_value: float
    """One-sided p-value of the taus against chance (each source's, combined by Stouffer)."""
    trials: int
    """Bank trials scored (ok trials of sources with at least 3)."""
    trusted: bool
    """Whether ``p_value`` is at most ``OptimizerSettings.transfer_trust_p``: the weights start at
    1 (False: they stay 0 for the whole study)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return asdict(self)


def weighted_centre(items: Sequence[tuple[float, np.ndarray]]) -> np.ndarray:
    """The similarity-weighted mean of the sources' log coefficients ``(similarity, coefs)``."""
    ws = np.array([w for w, _ in items])
    return np.sum(ws[:, None] * np.stack([u for _, u in items]), axis=0) / ws.sum()


def fit_time_coefficients(T: np.ndarray, y: np.ndarray, settings: OptimizerSettings) -> np.ndarray:
    """A source's log time coefficients: the prior's terms ``T`` fitted to its log step times ``y``
    as a study fits its own (``fit_log_coefficients``)."""
    return fit_log_coefficients(
        T,
        y,
        noise_sd=settings.prior_time_noise_sd,
        prior_sd=settings.prior_time_coef_sd,
        max_iter=settings.prior_fit_iters,
    )


def time_rank_check(
    fits: Sequence[tuple[float, np.ndarray, np.ndarray, np.ndarray]], settings: OptimizerSettings
) -> TimeRankCheck | None:
    """``TimeRankCheck`` of the sources' time fits ``(similarity, terms, log step times, log
    coefficients)``: each source's times under the other sources' similarity-weighted centre, or
    with one source each half of its trials under a fit on the other half. None when no source
    has 3 ok trials to score (nothing to check: trusted as before)."""
    from scipy.stats import combine_pvalues, kendalltau

    scored: list[tuple[np.ndarray, np.ndarray]] = []  # (prediction, measured)
    if len(fits) >= 2:
        for i, (_, T, y, _) in enumerate(fits):
            u = weighted_centre([(f[0], f[3]) for j, f in enumerate(fits) if j != i])
            scored.append((log_prior_sum(T, u).numpy(), y))
    elif fits and len(fits[0][2]) >= 6:
        _, T, y, _ = fits[0]
        halves = (np.arange(len(y)) % 2 == 0, np.arange(len(y)) % 2 == 1)
        for train, test in (halves, halves[::-1]):
            u = fit_time_coefficients(T[train], y[train], settings)
            scored.append((log_prior_sum(T[test], u).numpy(), y[test]))
    taus, ps, ns = [], [], []
    for pred, y in scored:
        if len(y) < 3 or np.ptp(pred) == 0 or np.ptp(y) == 0:
            continue
        res = kendalltau(pred, y, alternative="greater")
        if not math.isfinite(float(res.statistic)):
            continue
        taus.append(float(res.statistic))
        ps.append(min(max(float(res.pvalue), 1e-300), 1.0 - 1e-12))
        ns.append(len(y))
    if not taus:
        return None
    p = float(combine_pvalues(ps, method="stouffer").pvalue) if len(ps) > 1 else ps[0]
    tau = float(np.average(taus, weights=ns))
    return TimeRankCheck(
        kendall_tau=tau, p_value=p, trials=int(sum(ns)), trusted=p <= settings.transfer_trust_p
    )


def memory_sd(
    centres: Sequence[tuple[float, np.ndarray]],
    rows: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, float]],
) -> float | None:
    """``TransferModel.memory_sd``: each source's log peaks (its terms, log(peak / capacity),
    censored flags, capacity) predicted by the similarity-weighted centre of the OTHER sources
    (all of them with one source); an OOM row counts only where the prediction is below its
    bound."""
    if not centres:
        return None
    errors: list[np.ndarray] = []
    for i, (M, y, cens, cap) in enumerate(rows):
        others = [c for j, c in enumerate(centres) if j != i] or list(centres)
        u = weighted_centre(others)
        err = log_prior_sum(M / cap, u).numpy() - y
        errors.append(np.where(cens, np.minimum(err, 0.0), err))
    e = np.concatenate(errors)
    return float(np.sqrt(np.mean(e**2))) if e.size else None


__all__ = [
    "TimeRankCheck",
    "fit_time_coefficients",
    "memory_sd",
    "time_rank_check",
    "weighted_centre",
]
