"""The step-time GP's per-config deviation term (``models/time_gp``), used with the analytic prior
(inputs: the features, then the prior's log-time column; here a zero prior)."""

from __future__ import annotations

import pytest
import torch

from infrarsi.search.models import time_gp
from infrarsi.search.models.predict import ExactMarginal


def _data() -> tuple[torch.Tensor, torch.Tensor, int]:
    """A smooth log time over a 1-knob grid (64 values), one point per config, except config 20:
    four replicates, all 5% faster than the smooth curve (that config is really faster)."""
    g = torch.Generator().manual_seed(0)
    grid = torch.linspace(0, 1, 64, dtype=torch.float64)
    xs = grid[::3]
    y = 0.5 * torch.sin(3 * xs) + 0.01 * torch.randn(xs.shape[0], generator=g, dtype=torch.float64)
    j = 20
    xr = grid[j].repeat(4)
    yr = 0.5 * torch.sin(3 * xr) - 0.05 + 0.01 * torch.randn(4, generator=g, dtype=torch.float64)
    x = torch.cat([xs, xr]).reshape(-1, 1)
    return torch.cat([x, torch.zeros_like(x)], dim=-1), torch.cat([y, yr]), j


def _at(x: torch.Tensor) -> torch.Tensor:
    return torch.stack([x, torch.zeros_like(x)]).reshape(1, 2)


def _posterior(sd: float, x: torch.Tensor) -> tuple[float, time_gp.SingleTaskGP]:
    X, y, _ = _data()
    model, _state = time_gp.fit_time_gp(X, y, maxiter=80, offset=(1, 1), config_sd=sd)
    mean, _var = ExactMarginal(model)(_at(x))
    return float(mean), model


def test_the_config_term_is_an_identity_kernel_with_a_fixed_scale() -> None:
    grid = torch.linspace(0, 1, 64, dtype=torch.float64).reshape(-1, 1)
    _, model = _posterior(0.04, grid[20])
    _smooth, config = model.covar_module.kernels
    K = config(torch.cat([grid[18:23], torch.zeros(5, 1, dtype=torch.float64)], dim=-1)).to_dense()
    sd = float(model.outcome_transform.stdvs.reshape(()))
    assert torch.allclose(
        torch.diagonal(K), torch.full((5,), (0.04 / sd) ** 2, dtype=torch.float64)
    )
    assert (
        float((K - torch.diag(torch.diagonal(K))).abs().max()) < 1e-12
    )  # neighbours one step apart: 0
    assert (
        not config.raw_outputscale.requires_grad
        and not config.base_kernel.raw_lengthscale.requires_grad
    )


def test_replicates_of_a_config_move_its_prediction_towards_their_mean() -> None:
    _X, y, j = _data()
    x = torch.linspace(0, 1, 64, dtype=torch.float64)[j]
    replicate_mean = float(y[-4:].mean())
    without, _ = _posterior(0.0, x)
    with_term, _ = _posterior(0.04, x)
    assert abs(with_term - replicate_mean) < abs(without - replicate_mean)
    # a config next to it, never measured, is not pulled along as much
    nxt = torch.linspace(0, 1, 64, dtype=torch.float64)[
        j + 2
    ]  # 22: not on the measured grid (every 3rd)
    n0, _ = _posterior(0.0, nxt)
    n1, _ = _posterior(0.04, nxt)
    assert (without - with_term) > (n0 - n1)


def test_without_the_term_or_without_a_prior_the_kernel_is_the_plain_smooth_one() -> None:
    _, model = _posterior(0.0, torch.tensor(0.5, dtype=torch.float64))
    assert not hasattr(model.covar_module, "kernels")
    X, y, _ = _data()
    no_prior, _state = time_gp.fit_time_gp(X[:, :1], y, maxiter=5, config_sd=0.08)
    assert not hasattr(no_prior.covar_module, "kernels")


def test_the_acquisition_credits_an_untried_config_with_part_of_the_term() -> None:
    from infrarsi.search.acquisition import exploration_sd

    grid = torch.linspace(0, 1, 64, dtype=torch.float64)
    _, model = _posterior(0.08, grid[20])
    cut = time_gp.acquisition_variance_cut(model, 0.08, 0.03)
    assert cut == pytest.approx(0.08**2 - 0.03**2)
    pred = ExactMarginal(model, cut)
    X = torch.cat(
        [_at(grid[21]), _at(grid[20]), _at(grid[22])]
    )  # 21 is measured (every 3rd), 20 too (4x); 22 is not
    assert pred.untried(X).tolist() == [False, False, True]
    # the whole grid at once (cdist's matmul form would leave rounding on the measured rows)
    full = torch.cat([_at(x) for x in grid])
    assert torch.nonzero(~pred.untried(full)).reshape(-1).tolist() == sorted({*range(0, 64, 3), 20})
    _mean, var = pred(X)
    sd = var.sqrt()
    ei_sd = exploration_sd(pred, X, sd)
    assert torch.equal(ei_sd[:2], sd[:2])  # measured configs keep the model's posterior
    assert float(ei_sd[2] ** 2) == pytest.approx(float(var[2]) - cut)
    # the untried config's own posterior of the term is its prior: what is left is the smooth
    # model's uncertainty plus the acquisition's sd (0.03) squared, so still more than a measured config's
    assert float(ei_sd[2]) > 0.03
    # without the term, or with the cut at 0, nothing changes
    _, plain = _posterior(0.0, grid[20])
    assert time_gp.acquisition_variance_cut(plain, 0.08, 0.03) == 0.0
    assert torch.equal(exploration_sd(ExactMarginal(plain), X, sd), sd)


def test_the_matern_kernel_variant_replaces_the_smooth_kernel() -> None:
    from gpytorch.kernels import MaternKernel

    X, y, _ = _data()
    with_prior, _ = time_gp.fit_time_gp(
        X, y, maxiter=5, offset=(1, 1), config_sd=0.08, kernel="matern"
    )
    smooth, _config = with_prior.covar_module.kernels
    assert isinstance(smooth, MaternKernel) and smooth.nu == 2.5
    plain, _ = time_gp.fit_time_gp(X[:, :1], y, maxiter=5, kernel="matern")
    assert isinstance(plain.covar_module, MaternKernel)
    mean, var = ExactMarginal(plain)(_at(torch.tensor(0.3, dtype=torch.float64))[:, :1])
    assert torch.isfinite(mean).all() and bool((var > 0).all())


def test_the_speed_tilt_sets_the_tagged_weights_prior_and_the_data_overrule_it() -> None:
    tilt = time_gp.WeightTilt(indices=(0,), signs=(-1.0,), weight=1.0, sd=0.5)
    loc, sd = tilt.loc_and_sd(3)
    assert loc.flatten().tolist() == [-1.0, 0.0, 0.0] and sd.flatten().tolist() == [0.5, 1.0, 1.0]
    # two points that differ only in an untagged feature: the tagged one was never varied, so
    # the fit keeps its claim (the tagged feature's high value predicted faster) ...
    X = torch.tensor([[0.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.5, 0.0]], dtype=torch.float64)
    y = torch.tensor([0.0, 0.2, 0.1], dtype=torch.float64)
    tilted, _ = time_gp.fit_time_gp(X, y, maxiter=50, tilt=tilt)
    plain, _ = time_gp.fit_time_gp(X, y, maxiter=50)
    probe = torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.5, 0.5]], dtype=torch.float64)
    m_tilted, _ = ExactMarginal(tilted)(probe)
    m_plain, _ = ExactMarginal(plain)(probe)
    assert float(m_tilted[1] - m_tilted[0]) < -0.05
    assert abs(float(m_plain[1] - m_plain[0])) < abs(float(m_tilted[1] - m_tilted[0]))
    # ... and measurements that say the opposite win: the tagged feature's high value is slower
    X2 = torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.5, 0.5]] * 3, dtype=torch.float64)
    y2 = torch.tensor([0.0, 0.3] * 3, dtype=torch.float64)
    fitted, _ = time_gp.fit_time_gp(X2, y2, maxiter=80, tilt=tilt)
    m, _ = ExactMarginal(fitted)(probe)
    assert float(m[1] - m[0]) > 0.2
    # with an analytic prior (an offset column) the tilt is not used
    Xo = torch.cat([X, torch.zeros(3, 1, dtype=torch.float64)], dim=-1)
    with_prior, _ = time_gp.fit_time_gp(Xo, y, maxiter=0, offset=(3, 3), tilt=tilt)
    weights = with_prior.mean_module.inner.weights  # type: ignore[union-attr]
    assert float(weights.detach().abs().max()) == 0.0
