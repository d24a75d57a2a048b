"""The analytic prior mean (``priors/mean.py``): ``log_prior_sum`` and the coefficient fits."""

from __future__ import annotations

import math

import numpy as np

from infrarsi.search.priors.mean import fit_log_coefficients, log_prior_sum


def test_log_prior_sum_matches_numpy_and_skips_zero_terms() -> None:
    F = np.array([[1.0, 0.0, 2.0], [0.5, 3.0, 0.0]])
    u = np.array([0.3, -1.0, 0.7])
    expect = np.log(F @ np.exp(u))
    assert np.allclose(log_prior_sum(F, u).numpy(), expect)


def test_fit_recovers_known_coefficients() -> None:
    rng = np.random.default_rng(0)
    F = rng.uniform(0.1, 2.0, size=(40, 3))
    u_true = np.array([0.5, -1.0, 1.0])
    y = np.log(F @ np.exp(u_true)) + rng.normal(0, 0.01, 40)
    u = fit_log_coefficients(F, y, noise_sd=0.05)
    assert np.allclose(u, u_true, atol=0.1)


def test_a_term_absent_from_every_row_stays_at_its_prior() -> None:
    rng = np.random.default_rng(1)
    F = np.column_stack([rng.uniform(0.5, 2.0, 20), np.zeros(20)])
    y = np.log(2.0 * F[:, 0])
    u = fit_log_coefficients(F, y, noise_sd=0.05)
    assert abs(u[0] - math.log(2.0)) < 0.05
    assert abs(u[1]) < 1e-6


def test_censored_rows_raise_the_fit_above_their_bound() -> None:
    # Observed rows say coefficient 1; censored rows say the true value is at least 3x the terms.
    F = np.array([[1.0], [2.0], [4.0], [8.0]])
    y = np.log(F[:, 0])
    ignored = fit_log_coefficients(F[:2], y[:2], noise_sd=0.1)
    cens = np.array([False, False, True, True])
    y_c = y.copy()
    y_c[2:] = np.log(3.0 * F[2:, 0])
    with_cens = fit_log_coefficients(F, y_c, cens, noise_sd=0.1)
    assert with_cens[0] > ignored[0] + 0.2  # censored points pull the scale up (never down)
