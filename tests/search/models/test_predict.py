"""The fast marginal predictors (``models/predict.py``) agree with BoTorch's posteriors and find
the training rows among candidates."""

from __future__ import annotations

import numpy as np
import torch

from infrarsi.search.models import time_gp
from infrarsi.search.models.predict import ExactMarginal, VariationalMarginal
from infrarsi.search.models.time_gp import fit_time_gp
from infrarsi.search.models.tobit import fit_tobit_gp


def _data(
    n: int = 24, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Censored synthetic log(peak / capacity) over 3 features (as in ``test_tobit``), in float64."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 3, generator=g, dtype=torch.float64)
    truth = 2.5 * X[:, 0] - 1.0 * X[:, 1] - 0.6 + 0.2 * torch.sin(4 * X[:, 2])
    censored = truth > 0
    y = torch.where(censored, torch.zeros_like(truth), truth)
    return X, y, censored, truth


def test_fast_predictors_match_botorch_posteriors() -> None:
    X, y, censored, truth = _data(25)
    Xt = torch.rand(40, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    tobit, _ = fit_tobit_gp(X, y, censored, mean_indices=[0], mean_signs=[1.0], maxiter=50)
    m, v = VariationalMarginal(tobit)(Xt)
    with torch.no_grad():
        post = tobit.posterior(Xt)
    assert torch.allclose(m, post.mean.reshape(-1), atol=1e-5)
    assert torch.allclose(v, post.variance.reshape(-1), atol=1e-5)
    gp, _ = fit_time_gp(X, truth, maxiter=50)
    m, v = ExactMarginal(gp)(Xt)
    with torch.no_grad():
        post = gp.posterior(Xt)
    assert torch.allclose(m, post.mean.reshape(-1), atol=1e-5)
    assert np.allclose(v.numpy(), post.variance.reshape(-1).numpy(), atol=1e-5, rtol=1e-4)


def test_untried_finds_every_training_row_in_a_large_pool() -> None:
    """Encoded features in many dimensions (cdist's matmul form leaves ~1e-8 on identical rows)."""
    g = torch.Generator().manual_seed(1)
    X = torch.rand(40, 13, generator=g, dtype=torch.float64)
    y = X[:, :12].sum(-1) + 0.01 * torch.randn(40, generator=g, dtype=torch.float64)
    model, _state = time_gp.fit_time_gp(X, y, maxiter=5, offset=(12, 12))
    pool = torch.cat([torch.rand(500, 13, generator=g, dtype=torch.float64), X])
    assert torch.nonzero(~ExactMarginal(model).untried(pool)).reshape(-1).tolist() == list(
        range(500, 540)
    )


def test_the_joint_posterior_matches_botorch_and_its_diagonal_the_marginals() -> None:
    X, _y, _censored, truth = _data(25)
    Xt = torch.cat([X[:3], torch.rand(4, 3, generator=torch.Generator().manual_seed(2)).double()])
    gp, _ = fit_time_gp(X, truth, maxiter=50)
    pred = ExactMarginal(gp)
    mean, cov = pred.joint(Xt)
    with torch.no_grad():
        post = gp.posterior(Xt)
    assert torch.allclose(mean, post.mean.reshape(-1), atol=1e-5)
    assert np.allclose(cov.numpy(), post.mvn.covariance_matrix.numpy(), atol=1e-5, rtol=1e-4)
    assert np.allclose(torch.diagonal(cov).numpy(), pred(Xt)[1].numpy(), atol=1e-8)
