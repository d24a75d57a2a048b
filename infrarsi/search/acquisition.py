"""Acquisition: constrained log expected improvement over a discrete candidate set.

- One config (no pending trials): the analytic constrained log-EI, evaluated on every candidate
  (tens of thousands per second):
  ``log EI(log step time vs. the best posterior mean among ok trials) + log P(memory fits) + log p_ok``.
  With independent outputs this is what ``LogConstrainedExpectedImprovement`` computes; the
  incumbent is the best posterior mean (noise-aware), not the luckiest measurement. The EI of an
  untried config counts the step-time kernel's per-config term at
  ``OptimizerSettings.acquisition_config_sd``, not at the model's full sd (``exploration_sd``;
  ``models/time_gp.py``).
- A batch, or with trials pending: ``qLogNoisyExpectedImprovement`` on a ``ModelListGP`` (step time,
  memory) with the constraint ``log(peak / capacity) <= 0`` and the pending configs as
  ``X_pending``, optimised by ``optimize_acqf_discrete`` (sequential greedy) over the top
  ``OptimizerSettings.batch_choices`` candidates of the analytic score.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from botorch.acquisition.analytic import _log_ei_helper
from botorch.acquisition.logei import qLogNoisyExpectedImprovement
from botorch.acquisition.objective import GenericMCObjective
from botorch.models import ModelListGP
from botorch.models.model import Model
from botorch.optim import optimize_acqf_discrete
from botorch.sampling import SobolQMCNormalSampler


@dataclass
class Scores:
    """Per-candidate predictions and scores (numpy arrays of shape ``(n,)``)."""

    log_score: np.ndarray
    """log EI + log P(fit) + log p_ok (higher is better)."""
    time_mean: np.ndarray
    """Posterior mean of log step time (log seconds)."""
    time_sd: np.ndarray
    """Posterior sd of log step time (the model's; the EI may use less, ``exploration_sd``)."""
    mem_mean: np.ndarray
    """Posterior mean of log(peak / capacity) (0 where no memory model)."""
    p_fit: np.ndarray
    """P(peak <= capacity) (1 where no memory model)."""
    p_ok: np.ndarray
    """P(no non-OOM failure) from the feasibility model."""


def predict_time(pred: Any, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Posterior mean and sd of log step time, each ``(n,)`` (nan without a model).

    ``pred`` is a marginal predictor (``models.predict``) or None.
    """
    if pred is None or X.shape[0] == 0:
        nan = torch.full((X.shape[0],), float("nan"), dtype=torch.float64)
        return nan, nan
    mean, var = pred(X)
    return mean, var.sqrt()


def exploration_sd(pred: Any, X: torch.Tensor, sd: torch.Tensor) -> torch.Tensor:
    """The log-time sd the expected improvement uses: the posterior sd, less the predictor's
    ``untried_variance_cut`` on configs it has no measurement of (``time_gp.acquisition_variance_cut``)."""
    cut = float(getattr(pred, "untried_variance_cut", 0.0) or 0.0)
    if cut <= 0.0 or X.shape[0] == 0:
        return sd
    var = sd * sd - cut * pred.untried(X).to(sd.dtype)
    return var.clamp_min(1e-12).sqrt()


def predict_memory(
    pred: Any, noise_sd: float, X: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Posterior mean and sd of log(peak/capacity), and P(peak <= capacity), each ``(n,)``."""
    n = X.shape[0]
    if pred is None or n == 0:
        z = torch.zeros(n, dtype=torch.float64)
        return z, z.clone(), torch.ones(n, dtype=torch.float64)
    mean, var = pred(X)
    return mean, var.sqrt(), torch.special.ndtr(-mean / (var + noise_sd**2).sqrt())


def analytic_scores(
    time_pred: Any,
    mem_pred: Any,
    mem_noise_sd: float,
    X: torch.Tensor,
    best_log_time: float | None,
    p_ok: np.ndarray,
    sd_scale: float = 1.0,
) -> Scores:
    """Score ``X`` (``(n, d)``) with the analytic constrained log-EI (predictors from ``models.predict``);
    ``sd_scale`` multiplies the step-time posterior sd (``OptimizerSettings.acquisition_sd_scale``)."""
    t_mean, t_sd = predict_time(time_pred, X)
    if sd_scale != 1.0:
        t_sd = t_sd * sd_scale
    m_mean, _m_sd, pf = predict_memory(mem_pred, mem_noise_sd, X)
    if time_pred is None or best_log_time is None:
        log_ei = torch.zeros_like(pf)
    else:
        ei_sd = exploration_sd(time_pred, X, t_sd)
        u = (best_log_time - t_mean) / ei_sd
        log_ei = _log_ei_helper(u) + ei_sd.log()
    log_score = (
        log_ei + pf.clamp_min(1e-300).log() + torch.from_numpy(np.log(np.clip(p_ok, 1e-300, None)))
    )
    return Scores(
        log_score=log_score.numpy(),
        time_mean=t_mean.numpy(),
        time_sd=t_sd.numpy(),
        mem_mean=m_mean.numpy(),
        p_fit=pf.numpy(),
        p_ok=np.asarray(p_ok, dtype=float),
    )


def select_batch(
    time_model: Model,
    mem_model: Model | None,
    choices: torch.Tensor,
    q: int,
    X_baseline: torch.Tensor,
    X_pending: torch.Tensor | None,
    seed: int,
) -> list[int]:
    """Pick ``q`` rows of ``choices`` (``(k, d)``) with constrained qLogNEI; returns row indices."""
    models: list[Any] = [time_model] if mem_model is None else [time_model, mem_model]
    model = ModelListGP(*models)

    def neg_log_time(Z: torch.Tensor, X: torch.Tensor | None = None) -> torch.Tensor:
        return -Z[..., 0]

    def log_mem_over_capacity(Z: torch.Tensor) -> torch.Tensor:  # feasible where <= 0
        return Z[..., 1]

    objective = GenericMCObjective(neg_log_time)
    constraints: list[Any] | None = None if mem_model is None else [log_mem_over_capacity]
    acq = qLogNoisyExpectedImprovement(
        model,
        X_baseline=X_baseline,
        sampler=SobolQMCNormalSampler(sample_shape=torch.Size([128]), seed=seed),
        objective=objective,
        constraints=constraints,
        X_pending=X_pending,
        prune_baseline=True,
        cache_root=False,
    )
    q = min(q, choices.shape[0])
    with torch.no_grad():
        cands, _ = optimize_acqf_discrete(
            acq, q=q, choices=choices, unique=True, max_batch_size=512
        )
    picked: list[int] = []
    for row in cands:
        hits = torch.nonzero((choices == row).all(-1)).reshape(-1).tolist()
        for h in hits:
            if h not in picked:
                picked.append(h)
                break
    return picked
