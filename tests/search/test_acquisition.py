"""The analytic acquisition (``acquisition.py``): constrained log-EI scores and the sd scale variant."""

from __future__ import annotations

import numpy as np
import torch

from infrarsi.search.acquisition import analytic_scores


def _fixed(mean: list[float], var: list[float]):  # a predictor with fixed marginals
    def pred(X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(mean, dtype=torch.float64), torch.tensor(var, dtype=torch.float64)

    return pred


def test_scores_add_log_ei_log_p_fit_and_log_p_ok() -> None:
    X = torch.zeros(3, 2, dtype=torch.float64)
    time_pred = _fixed([0.0, -0.1, 0.2], [0.01, 0.04, 0.01])
    mem_pred = _fixed([-1.0, 0.5, -2.0], [0.01, 0.01, 0.01])
    s = analytic_scores(
        time_pred, mem_pred, 0.05, X, best_log_time=0.0, p_ok=np.array([1.0, 1.0, 0.5])
    )
    assert s.p_fit[0] > 0.99 and s.p_fit[1] < 0.01  # predicted over the capacity
    assert int(np.argmax(s.log_score)) == 0  # the faster config 1 is unlikely to fit
    assert np.allclose(s.time_sd, [0.1, 0.2, 0.1])


def test_sd_scale_scales_the_step_time_sd_and_one_changes_nothing() -> None:
    X = torch.zeros(2, 2, dtype=torch.float64)
    time_pred = _fixed([0.0, 0.3], [0.04, 0.09])
    base = analytic_scores(time_pred, None, 0.0, X, best_log_time=0.0, p_ok=np.ones(2))
    same = analytic_scores(
        time_pred, None, 0.0, X, best_log_time=0.0, p_ok=np.ones(2), sd_scale=1.0
    )
    half = analytic_scores(
        time_pred, None, 0.0, X, best_log_time=0.0, p_ok=np.ones(2), sd_scale=0.5
    )
    assert np.array_equal(base.log_score, same.log_score)
    assert np.allclose(half.time_sd, base.time_sd * 0.5) and (half.log_score < base.log_score).all()
