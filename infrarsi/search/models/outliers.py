"""Slow outliers among step-time measurements (stragglers), by leave-one-out residuals of the GP.

A straggler (one slow rank or node for a whole trial) makes a measurement 15-60% slower than the
config really is, far outside the run-to-run noise of a few percent. One such point inflates the
step-time GP's noise estimate and bends its mean (and the prior's fitted coefficients) around
itself, so ``best()`` and the acquisition trust the wrong configs. A Gaussian likelihood cannot
discount it, so the optimizer trims such points:

1. fit on every ok measurement;
2. screen: compute each point's leave-one-out residual in closed form (Rasmussen & Williams 2006,
   eq. 5.12), ``y_i - mu_{-i} = alpha_i / [K^-1]_ii`` with ``alpha = K^-1 (y - m)``, and its
   z-score ``alpha_i / sqrt([K^-1]_ii)``; candidates are the points with z above
   ``outlier_screen_z`` and a residual above ``outlier_min_log`` (these z-scores are deflated: an
   outlier inflates the fitted noise and bends the mean towards itself);
3. test: refit without the candidate (up to ``outlier_max_tests`` candidates, largest z first; the
   refit is warm-started and light, as after a new trial) and predict it (observation noise
   included); if it is slower than predicted by both ``outlier_z`` sds and ``outlier_min_log`` log
   seconds, it is dropped and the search goes on from 2 (at most ``outlier_max_fraction`` of the
   points, and only from ``outlier_min_points`` on); if not, the model is refitted on every point
   and trimming stops.

The thresholds are ``OptimizerSettings.outlier_*``.

Known limit: two stragglers in similar configs can hide each other (each inflates the noise the
other is judged against), and a warm-started refit can keep a short lengthscale that an outlier
created. Benchmarks (``benchmarks/search_variants.py``, variant ``outliers: off``) found testing
up to three candidates with cold refits no better on the surrogate, and 60% slower.

Only slow outliers are trimmed: noise that makes a trial *faster* than the config is rare and
small (nothing speeds one rank up by 15%). A trimmed config is not lost: the optimizer may propose
it again, and a second slow measurement of it is no longer an outlier (the two agree).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from infrarsi.search.settings import DEFAULT_SETTINGS, OptimizerSettings


def loo_residuals(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Leave-one-out residuals ``y_i - mu_{-i}`` (in the model's outcome units, log seconds) and
    their z-scores, for an exact ``SingleTaskGP`` with a ``Standardize`` outcome transform (or none).

    The hyperparameters stay those fitted on all points (the usual closed form)."""
    m = model
    X = m.train_inputs[0]
    y = m.train_targets
    with torch.no_grad():
        K = m.covar_module(X).to_dense()
        noise = m.likelihood.noise.reshape(-1)
        K = K + torch.diag_embed(noise.expand(K.shape[-1]))
        mean = m.mean_module(X)
        L = torch.linalg.cholesky(K)
        Kinv = torch.cholesky_inverse(L)
        alpha = Kinv @ (y - mean)
        d = torch.diagonal(Kinv)
        resid = alpha / d
        z = alpha / d.sqrt()
    tf = getattr(m, "outcome_transform", None)
    scale = float(tf.stdvs.reshape(())) if tf is not None and hasattr(tf, "stdvs") else 1.0
    return resid * scale, z


def _predict(model: Any, X: torch.Tensor) -> tuple[float, float]:
    """Posterior mean and sd (observation noise included) of one point, in outcome units."""
    with torch.no_grad():
        post = model.posterior(X, observation_noise=True)
        return float(post.mean.reshape(())), float(
            post.variance.reshape(()).clamp_min(1e-12).sqrt()
        )


def trim_slow_outliers(
    y: torch.Tensor,
    fit: Callable[[list[int]], Any],
    inputs: Callable[[list[int]], torch.Tensor],
    settings: OptimizerSettings = DEFAULT_SETTINGS,
) -> set[int]:
    """Indices into ``y`` (log step times) to leave out of the step-time fit.

    ``fit(indices)`` fits the model (and anything else that learns from the same points, like the
    prior's coefficients) on those points and returns it (None if there is none); ``inputs(indices)``
    gives those points' model inputs under the latest fit; ``settings`` holds the thresholds
    (``outlier_*``). On return, the last ``fit`` call was on the complement of the returned set.
    """
    n = int(y.shape[0])
    dropped: set[int] = set()
    cap = max(1, int(settings.outlier_max_fraction * n))
    keep = list(range(n))
    model = fit(keep)
    while model is not None and len(keep) >= settings.outlier_min_points and len(dropped) < cap:
        try:
            resid, z = loo_residuals(model)
        except (RuntimeError, AttributeError):  # not positive definite, or not an exact GP
            break
        eligible = [
            int(j)
            for j in torch.argsort(z, descending=True)
            if float(z[j]) > settings.outlier_screen_z
            and float(resid[j]) > settings.outlier_min_log
        ][: settings.outlier_max_tests]
        found = None
        for j in eligible:
            c = keep[j]
            rest = [i for i in keep if i != c]
            trimmed = fit(rest)
            mean, sd = _predict(trimmed, inputs([c]))
            r = float(y[c]) - mean
            if r > settings.outlier_z * sd and r > settings.outlier_min_log:
                found = c, rest, trimmed
                break
        if found is None:
            if eligible:
                fit(keep)
            break
        c, keep, model = found
        dropped.add(c)
    return dropped
