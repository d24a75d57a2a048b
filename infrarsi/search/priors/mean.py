"""Analytic prior means: step time and peak memory as non-negative sums of named physical terms.

A ``PriorMean`` maps configs to two matrices of terms: ``time`` (seconds per step, one column per
term: compute, communication, optimizer, ...) and ``memory`` (bytes per device: model states,
activations, ...), computed from nominal hardware figures. The models then use

    log step time        = log(sum_k a_k * time_k(x))              + GP residual
    log(peak / capacity) = log(sum_k b_k * memory_k(x) / capacity) + censored GP residual

with coefficients ``a, b >= 0`` fitted by MAP under a log-normal prior centred on 1 (the nominal
figures), so a handful of trials recalibrates the hardware and the GPs only learn what the
formulas miss. ``fit_log_coefficients`` does the fit (its noise and prior sds are
``OptimizerSettings.prior_*``); OOM trials enter the memory fit as censored points (the true peak
is at least the recorded bound), as they do in the Tobit GP.

The core stays knob-agnostic: it never reads knob names. Priors that know what ``zero_stage`` or
``micro_batch_size`` mean (``priors.transformer``) are listed in ``priors.registry.PRIORS`` by
name, and rebuilt from their ``spec()`` when an optimizer is restored.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch.special import log_ndtr

from infrarsi.search.settings import DEFAULT_SETTINGS


class PriorMean(Protocol):
    """What the optimizer needs from an analytic prior."""

    kind: str
    """Registry name (``priors.registry.PRIORS``), used to rebuild the prior from ``spec()``."""
    time_names: tuple[str, ...]
    """Names of the step-time terms (columns of ``terms()[0]``)."""
    memory_names: tuple[str, ...]
    """Names of the memory terms (columns of ``terms()[1]``)."""

    def terms(self, configs: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        """``(n, kt)`` seconds and ``(n, km)`` bytes, every entry >= 0, at least one > 0 per row."""
        ...

    def spec(self) -> dict[str, Any]:
        """JSON-able arguments that rebuild this prior through ``priors.registry.PRIORS[kind]``."""
        ...


def log_prior_sum(
    terms: np.ndarray | torch.Tensor, log_coef: np.ndarray | torch.Tensor
) -> torch.Tensor:
    """``log(sum_k exp(log_coef_k) * terms_k)`` per row, computed stably; ``(n,)`` float64."""
    F = torch.as_tensor(terms, dtype=torch.float64)
    u = torch.as_tensor(log_coef, dtype=torch.float64)
    logF = torch.where(F > 0, F.clamp_min(1e-300).log(), torch.full_like(F, -math.inf))
    return torch.logsumexp(logF + u, dim=-1)


def fit_log_coefficients(
    terms: np.ndarray,
    y: np.ndarray,
    censored: np.ndarray | None = None,
    *,
    noise_sd: float,
    scale: float = 1.0,
    warm: np.ndarray | None = None,
    prior_sd: float = DEFAULT_SETTINGS.prior_time_coef_sd,
    max_iter: int = DEFAULT_SETTINGS.prior_fit_iters,
    centre: np.ndarray | None = None,
) -> np.ndarray:
    """MAP log coefficients ``u`` of ``y ~ log(sum_k exp(u_k) * terms_k / scale)``.

    Args:
        terms: ``(n, k)`` non-negative terms.
        y: ``(n,)`` observed log values; for censored rows the log lower bound.
        censored: ``(n,)`` bool, True where the true value is only known to be >= ``y``.
        noise_sd: sd of ``y`` around the prior sum.
        scale: divides the sum (the capacity, for log(peak / capacity)).
        warm: starting point (the previous fit), or None for zeros.
        prior_sd: sd of the ``N(centre_k, prior_sd^2)`` prior on each ``u_k``.
        max_iter: L-BFGS iterations.
        centre: ``(k,)`` the prior's means (None: zeros, the nominal figures; ``search.transfer``
            centres them on coefficients fitted to similar studies).

    Returns:
        ``(k,)`` log coefficients; a column that is zero on every row stays at its prior mean.
    """
    F = torch.as_tensor(np.asarray(terms, dtype=float) / scale, dtype=torch.float64)
    Y = torch.as_tensor(np.asarray(y, dtype=float), dtype=torch.float64)
    cens = (
        torch.zeros_like(Y, dtype=torch.bool)
        if censored is None
        else torch.as_tensor(np.asarray(censored, dtype=bool))
    )
    k = F.shape[1]
    mu = np.zeros(k) if centre is None or len(centre) != k else np.asarray(centre, dtype=float)
    start = mu.copy() if warm is None or len(warm) != k else np.asarray(warm, dtype=float)
    mu_t = torch.as_tensor(mu, dtype=torch.float64)
    u = torch.tensor(start, dtype=torch.float64, requires_grad=True)
    if F.shape[0] == 0:
        return start.copy()
    logF = torch.where(F > 0, F.clamp_min(1e-300).log(), torch.full_like(F, -math.inf))
    opt = torch.optim.LBFGS([u], lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        pred = torch.logsumexp(logF + u, dim=-1)
        z = (pred - Y) / noise_sd
        obs = 0.5 * z[~cens] ** 2
        cen = -log_ndtr(z[cens])
        loss = obs.sum() + cen.sum() + 0.5 * (((u - mu_t) / prior_sd) ** 2).sum()
        loss.backward()
        return loss

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            opt.step(closure)
        except Exception:  # numerical trouble: keep the start
            return start.copy()
    out = u.detach().numpy().copy()
    return out if np.all(np.isfinite(out)) else start.copy()
