"""Slow-outlier trimming of step-time measurements (``infrarsi/search/models/outliers.py``)."""

from __future__ import annotations

import math

import numpy as np
import torch

from infrarsi.search.models.outliers import loo_residuals, trim_slow_outliers
from infrarsi.search.models.time_gp import fit_time_gp


def _data(n: int, seed: int, noise: float = 0.02) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    X = torch.tensor(rng.random((n, 2)), dtype=torch.float64)
    y = torch.log(2.0 + 3.0 * X[:, 0] + X[:, 1] ** 2) + noise * torch.tensor(rng.standard_normal(n))
    return X, y


def test_loo_residuals_match_refitting_without_each_point() -> None:
    X, y = _data(12, 0)
    model, _ = fit_time_gp(X, y)
    resid, z = loo_residuals(model)
    # brute force with the same hyperparameters: condition on every point but i
    tf = model.outcome_transform
    ys = (y - tf.means.reshape(())) / tf.stdvs.reshape(())
    with torch.no_grad():
        K = model.covar_module(X).to_dense() + model.likelihood.noise * torch.eye(
            12, dtype=torch.float64
        )
        m = model.mean_module(X)
    for i in range(12):
        rest = [j for j in range(12) if j != i]
        Kr = K[rest][:, rest]
        k = K[i, rest]
        mu = m[i] + k @ torch.linalg.solve(Kr, ys[rest] - m[rest])
        var = K[i, i] - k @ torch.linalg.solve(Kr, k)
        want = float((ys[i] - mu) * tf.stdvs.reshape(()))
        assert math.isclose(float(resid[i]), want, rel_tol=1e-6, abs_tol=1e-9)
        assert math.isclose(
            float(z[i]), float((ys[i] - mu) / var.sqrt()), rel_tol=1e-6, abs_tol=1e-9
        )


def _trim(X: torch.Tensor, y: torch.Tensor) -> set[int]:
    return trim_slow_outliers(y, lambda keep: fit_time_gp(X[keep], y[keep])[0], lambda js: X[js])


def test_a_straggler_is_trimmed_and_clean_data_is_kept() -> None:
    X, y = _data(16, 1)
    assert _trim(X, y) == set()
    slow = y.clone()
    slow[5] += math.log(1.4)  # one rank 40% slower for the whole trial
    assert _trim(X, slow) == {5}


def test_a_fast_outlier_is_not_trimmed() -> None:
    X, y = _data(16, 2)
    fast = y.clone()
    fast[3] -= math.log(1.4)
    assert 3 not in _trim(X, fast)


def test_too_few_points_are_never_trimmed() -> None:
    X, y = _data(5, 3)
    y = y.clone()
    y[0] += 1.0
    assert _trim(X, y) == set()
