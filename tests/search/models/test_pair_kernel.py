"""The knob-value pair term (``models.pair_kernel``): its values, and what it does to the step-time
model where an interaction the analytic prior lacks hides in a pair of knob values."""

from __future__ import annotations

import itertools

import torch

from infrarsi.search.models import time_gp
from infrarsi.search.models.pair_kernel import PairKernel
from infrarsi.search.models.predict import ExactMarginal

GROUPS = ((0, 1), (1, 1), (2, 3), (5, 1))
"""Four knobs; the third one-hot over three columns."""


def _row(a: float, b: float, c: int, d: float) -> list[float]:
    onehot = [0.0, 0.0, 0.0]
    onehot[c] = 1.0
    return [a, b, *onehot, d]


def test_the_kernel_averages_shared_value_pairs_over_knob_pairs() -> None:
    k = PairKernel(GROUPS)
    x = torch.tensor(
        [
            _row(0, 0, 0, 0),
            _row(0, 0, 0, 0),  # the same config: every pair shared
            _row(1, 0, 0, 0),  # one knob differs: 3 of the 6 pairs shared
            _row(0, 0, 1, 0),  # the one-hot knob differs (two columns): 3 of 6
            _row(1, 1, 2, 1),  # every knob differs: none
        ],
        dtype=torch.float64,
    )
    K = k(x).to_dense()
    assert torch.allclose(K[0], torch.tensor([1.0, 1.0, 0.5, 0.5, 0.0], dtype=torch.float64))
    assert torch.allclose(torch.diagonal(K), k(x, diag=True))


def test_the_kernel_is_positive_semidefinite() -> None:
    values = [0.0, 0.5, 1.0]
    rows = [
        [a, b, *_row(0, 0, c, 0)[2:5], d]
        for a, b, c, d in itertools.product(values, values, range(3), [0.0, 1.0])
    ]
    K = PairKernel(GROUPS)(torch.tensor(rows, dtype=torch.float64)).to_dense()
    assert float(torch.linalg.eigvalsh(K).min()) > -1e-9


def _toy() -> tuple[list[tuple[int, int, int]], dict[tuple[int, int, int], float]]:
    """Three binary knobs; the (zero) prior is right except where knobs 0 and 1 are both 1: 30%
    faster (an interaction it lacks)."""
    configs = list(itertools.product((0, 1), repeat=3))
    truth = {c: (-0.36 if c[0] == 1 and c[1] == 1 else 0.0) + 0.02 * c[2] for c in configs}
    return configs, truth


def _fit(
    told: list[tuple[int, int, int]], truth: dict[tuple[int, int, int], float], sd: float
) -> ExactMarginal:
    X = torch.tensor([[*c, 0.0] for c in told], dtype=torch.float64)
    y = torch.tensor([truth[c] for c in told], dtype=torch.float64)
    model, _ = time_gp.fit_time_gp(
        X,
        y,
        maxiter=60,
        offset=(3, 3),
        pairs=((0, 1), (1, 1), (2, 1)),
        interaction_sd=sd,
    )
    return ExactMarginal(model, time_gp.acquisition_variance_cut(model, 0.08, 0.04))


def test_an_untried_value_pair_keeps_its_doubt_and_one_measurement_moves_its_region() -> None:
    configs, truth = _toy()
    hidden = (1, 1, 1)
    told = [c for c in configs if not (c[0] == 1 and c[1] == 1)]
    x = torch.tensor([[*hidden, 0.0]], dtype=torch.float64)
    # the prior is right on every config told: without the term the model is sure of the hidden one
    _, var_without = _fit(told, truth, 0.0)(x)
    _, var_with = _fit(told, truth, 0.2)(x)
    assert float(var_with.sqrt()) > float(var_without.sqrt()) + 0.05
    # one config holding the pair, measured 30% fast: its untried neighbour is predicted fast too,
    # and a config without the pair stays where the prior put it
    pred = _fit([*told, (1, 1, 0)], truth, 0.2)
    mean, _ = pred(torch.tensor([[*hidden, 0.0], [0, 1, 1, 0.0]], dtype=torch.float64))
    assert float(mean[0]) < -0.15
    assert abs(float(mean[1]) - truth[(0, 1, 1)]) < 0.05


def test_without_the_setting_the_model_has_no_pair_term() -> None:
    configs, truth = _toy()
    pred = _fit(configs, truth, 0.0)
    kernels = pred.model.covar_module.kernels
    assert not any(isinstance(getattr(k, "base_kernel", None), PairKernel) for k in kernels)
