"""``OffsetMean`` (``models/offset_mean.py``): both GPs add the analytic prior's column to their mean
and their kernels ignore it; the fast predictors agree with the posteriors."""

from __future__ import annotations

import numpy as np
import torch

from infrarsi.search.models.predict import ExactMarginal, VariationalMarginal
from infrarsi.search.models.time_gp import fit_time_gp
from infrarsi.search.models.tobit import fit_tobit_gp


def _offset_data(n: int = 20, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g, dtype=torch.float64)
    off_t = 2.0 * X[:, 0] + 0.3
    off_m = X[:, 1] - 0.5
    return torch.cat([X, off_t[:, None], off_m[:, None]], dim=-1), off_t, off_m


def test_offset_models_use_the_offset_and_fast_predictors_match_posteriors() -> None:
    Xa, off_t, off_m = _offset_data()
    y_t = off_t + 0.05 * torch.sin(6 * Xa[:, 1])
    gp, _ = fit_time_gp(Xa, y_t, maxiter=50, offset=(2, 2))
    Xt, _, _ = _offset_data(15, seed=3)
    m, v = ExactMarginal(gp)(Xt)
    with torch.no_grad():
        post = gp.posterior(Xt)
    assert torch.allclose(m, post.mean.reshape(-1), atol=1e-5)
    assert np.allclose(v.numpy(), post.variance.reshape(-1).numpy(), atol=1e-5, rtol=1e-4)
    assert float((m - Xt[:, 2]).abs().max()) < 0.2  # the offset carries the prediction
    # the kernel ignores the offset columns: shifting them moves the mean one-for-one
    shifted = Xt.clone()
    shifted[:, 2] += 1.0
    assert torch.allclose(ExactMarginal(gp)(shifted)[0], m + 1.0, atol=1e-6)

    censored = torch.zeros(20, dtype=torch.bool)
    tobit, _ = fit_tobit_gp(
        Xa, off_m, censored, mean_indices=[1], mean_signs=[1.0], maxiter=50, offset=(2, 3)
    )
    mm, vv = VariationalMarginal(tobit)(Xt)
    with torch.no_grad():
        post = tobit.posterior(Xt)
    assert torch.allclose(mm, post.mean.reshape(-1), atol=1e-5)
    assert torch.allclose(vv, post.variance.reshape(-1), atol=1e-5)
    assert float((mm - Xt[:, 3]).abs().max()) < 0.2
