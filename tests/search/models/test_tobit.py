"""The censored (Tobit) memory model and the fast predictors."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from gpytorch.distributions import MultivariateNormal
from scipy import integrate, stats

from infrarsi.search.models.predict import VariationalMarginal
from infrarsi.search.models.tobit import (
    TobitLikelihood,
    build_tobit_gp,
    fast_neg_elbo,
    fit_tobit_gp,
    tobit_loss,
)


@pytest.fixture(autouse=True)
def _float64_default() -> Iterator[None]:
    """These tests build tensors in float64; the process-wide default is restored after each
    (other tests run the optimizer under torch's own float32 default, as users do)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def test_expected_log_prob_matches_hand_computation() -> None:
    lik = TobitLikelihood(noise_sd=0.2).double()
    s = float(lik.noise_sd.detach())
    mean = torch.tensor([0.1, -0.5, 0.3, 1.2])
    var = torch.tensor([0.04, 0.5, 0.01, 0.2])
    y = torch.tensor([0.0, 0.2, 0.0, 0.5])
    censored = torch.tensor([False, True, True, False])
    q = MultivariateNormal(mean, torch.diag(var))
    got = lik.expected_log_prob(y, q, censored=censored).detach().numpy()
    for i in range(4):
        m, v, yi = float(mean[i]), float(var[i]), float(y[i])
        if censored[i]:  # E_q[log Phi((f - y)/s)] by adaptive quadrature

            def integrand(f: float, m: float = m, v: float = v, yi: float = yi) -> float:
                return float(stats.norm.pdf(f, m, math.sqrt(v)) * stats.norm.logcdf((f - yi) / s))

            want, _ = integrate.quad(integrand, m - 12 * math.sqrt(v), m + 12 * math.sqrt(v))
        else:  # closed form E_q[log N(y | f, s^2)]
            want = -0.5 * math.log(2 * math.pi * s * s) - ((yi - m) ** 2 + v) / (2 * s * s)
        assert got[i] == pytest.approx(want, rel=1e-4, abs=1e-8)  # 20-point Gauss-Hermite


def test_uncensored_mask_is_plain_gaussian() -> None:
    lik = TobitLikelihood(noise_sd=0.1).double()
    q = MultivariateNormal(torch.tensor([0.0, 1.0]), torch.eye(2) * 0.3)
    y = torch.tensor([0.5, 0.5])
    a = lik.expected_log_prob(y, q)
    b = lik.expected_log_prob(y, q, censored=torch.tensor([False, False]))
    assert torch.allclose(a, b)


def _data(
    n: int = 24, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 3, generator=g)
    truth = 2.5 * X[:, 0] - 1.0 * X[:, 1] - 0.6 + 0.2 * torch.sin(4 * X[:, 2])
    censored = truth > 0
    y = torch.where(censored, torch.zeros_like(truth), truth)
    return X, y, censored, truth


def test_fast_elbo_equals_gpytorch_elbo() -> None:
    X, y, censored, _ = _data()
    model = build_tobit_gp(X, y, [0, 1], [1.0, -1.0])
    g = torch.Generator().manual_seed(1)
    dist = model.model.variational_strategy._variational_distribution
    with torch.no_grad():
        m = dist.variational_mean.shape[0]
        dist.variational_mean.copy_(torch.randn(m, generator=g))
        dist.chol_variational_covar.copy_(
            0.5 * torch.eye(m) + 0.05 * torch.randn(m, m, generator=g).tril()
        )
    model.train()
    ref = float(tobit_loss(model, X, y, censored).detach())
    fast = float(fast_neg_elbo(model, X, y, censored).detach())
    assert fast == pytest.approx(ref, rel=1e-5)


def test_censored_points_push_predictions_up_versus_dropping() -> None:
    X, y, censored, _ = _data(30)
    assert 5 <= int(censored.sum()) <= 20
    tobit, _ = fit_tobit_gp(
        X, y, censored, mean_indices=[0, 1], mean_signs=[1.0, -1.0], maxiter=200
    )
    keep = ~censored
    dropped, _ = fit_tobit_gp(
        X[keep], y[keep], censored[keep], mean_indices=[0, 1], mean_signs=[1.0, -1.0], maxiter=200
    )
    Xc = X[censored]
    mean_t, _ = VariationalMarginal(tobit)(Xc)
    mean_d, _ = VariationalMarginal(dropped)(Xc)
    assert float(mean_t.mean()) > float(mean_d.mean())
    # and the censored model puts the censored points above the capacity (log ratio 0) on average
    assert float(mean_t.mean()) > 0.0
    # every censored point is predicted at or above its bound more often than when dropped
    assert int((mean_t >= 0).sum()) >= int((mean_d >= 0).sum())


def test_warm_start_extends_the_inducing_set() -> None:
    X, y, censored, _ = _data(20)
    _, state = fit_tobit_gp(
        X[:15], y[:15], censored[:15], mean_indices=[0], mean_signs=[1.0], maxiter=100
    )
    model, _ = fit_tobit_gp(
        X, y, censored, mean_indices=[0], mean_signs=[1.0], warm=state, maxiter=0
    )
    dist = model.model.variational_strategy._variational_distribution
    old = state["model.variational_strategy._variational_distribution.variational_mean"]
    assert torch.equal(dist.variational_mean.detach()[:15], old)
    assert torch.equal(dist.variational_mean.detach()[15:], torch.zeros(5))
