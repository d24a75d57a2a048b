"""The analytic prior mean: coefficient fits, the offset column in both GPs, and the optimizer with a prior."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from search_synthetic import BASELINE, CAPACITY, DENSE, GB, memory_bytes, run

from infrarsi.search import Optimizer, SearchSpace
from infrarsi.search.models.predict import ExactMarginal, VariationalMarginal
from infrarsi.search.models.time_gp import fit_time_gp
from infrarsi.search.models.tobit import fit_tobit_gp
from infrarsi.search.priors.mean import fit_log_coefficients, log_prior_sum
from infrarsi.search.priors.registry import PRIORS, prior_from_spec


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
    tobit, _ = fit_tobit_gp(Xa, off_m, censored, mean_indices=[1], mean_signs=[1.0], maxiter=50, offset=(2, 3))
    mm, vv = VariationalMarginal(tobit)(Xt)
    with torch.no_grad():
        post = tobit.posterior(Xt)
    assert torch.allclose(mm, post.mean.reshape(-1), atol=1e-5)
    assert torch.allclose(vv, post.variance.reshape(-1), atol=1e-5)
    assert float((mm - Xt[:, 3]).abs().max()) < 0.2


class SyntheticPrior:
    """A rough prior of ``search_synthetic``: model states and activations, without its buckets,
    with activation sizes off by a factor (so the fitted coefficients have work to do)."""

    kind = "synthetic_test"
    time_names = ("compute", "comm", "offload")
    memory_names = ("states", "activations", "fixed")

    def terms(self, configs: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        T, M = [], []
        for c in configs:
            p = 1.5e9
            pb = 2 if c["dtype"] == "bf16" else 4
            z = c["zero_stage"]
            states = p * pb * (1 / 8 if z >= 3 else 1) + p * pb * (1 / 8 if z >= 2 else 1)
            states += 0 if c["offload_optimizer"] else p * 12 / (8 if z >= 1 else 1)
            act = 1.0 * GB * c["micro_batch_size"] * {"none": 1.0, "selective": 0.5, "full": 0.1}[c["activation_checkpointing"]]
            M.append([states, act, 1.0 * GB])
            T.append([10.0 * (1 + 1 / c["micro_batch_size"]), 1.0 * (z > 0), 4.0 * c["offload_optimizer"]])
        return np.array(T), np.array(M)

    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind}


PRIORS["synthetic_test"] = lambda raw: SyntheticPrior()


def test_prior_gives_p_fit_before_any_memory_model() -> None:
    space = SearchSpace.from_yaml(DENSE)
    huge = space.validate({"zero_stage": 0, "micro_batch_size": 8, "activation_checkpointing": "none", "dtype": "fp32"})
    assert memory_bytes(huge) > 2 * CAPACITY
    for prior, expect_low in ((SyntheticPrior(), True), (None, False)):
        opt = Optimizer(space, memory_capacity=CAPACITY, seed=0, baseline=BASELINE, prior=prior)
        opt.tell(BASELINE, run(space.validate(BASELINE)))
        p = float(opt.predict([huge])["p_fit"][0])
        assert (p < 0.05) if expect_low else (p == 1.0)


def test_prior_search_runs_saves_restores_and_batches(tmp_path) -> None:
    space = SearchSpace.from_yaml(DENSE)
    opt = Optimizer(space, memory_capacity=CAPACITY, seed=2, baseline=BASELINE, prior=SyntheticPrior())
    for _ in range(8):
        c = opt.ask()
        opt.tell(c, run(c))
    assert opt.prior_features.coefficients["time"] is not None and opt.prior_features.coefficients["memory"] is not None
    path = tmp_path / "opt.json"
    opt.save(path)
    restored = Optimizer.load(path)
    assert isinstance(restored.prior, SyntheticPrior)
    assert opt.ask() == restored.ask()
    batch = opt.ask(3)  # qLogNEI on the ModelListGP with the offset columns
    assert len({space.key(c) for c in batch}) == 3


def _told(seed: int, n: int) -> Optimizer:
    """An optimizer with ``SyntheticPrior`` after ``n`` asks and tells."""
    opt = Optimizer(SearchSpace.from_yaml(DENSE), memory_capacity=CAPACITY, seed=seed, baseline=BASELINE,
                    prior=SyntheticPrior())
    for _ in range(n):
        c = opt.ask()
        opt.tell(c, run(c))
    return opt


def test_state_with_coefficients_of_another_term_set_refits_them() -> None:
    opt = _told(seed=2, n=5)
    space = opt.space
    state = opt.state_dict()
    state["prior_coefficients"]["time"] = [0.0, 0.0]  # saved by a prior with two time terms
    restored = Optimizer.from_state(state)
    assert restored.prior_features.coefficients["time"] is None and restored.prior_features.fit_keys["time"] is None
    assert restored.prior_features.coefficients["memory"] is not None
    c = restored.ask()
    assert restored.prior_features.coefficients["time"] is not None and len(restored.prior_features.coefficients["time"]) == 3
    assert space.validate(c) == c


def test_unknown_prior_kind_is_a_clear_error() -> None:
    from infrarsi.errors import SearchSpaceError

    with pytest.raises(SearchSpaceError, match=r"prior\.kind.*known kinds"):
        prior_from_spec({"kind": "nope"})


def test_no_refit_when_the_data_did_not_change() -> None:
    opt = _told(seed=1, n=5)
    opt.best()
    coef = {k: v.copy() for k, v in opt.prior_features.coefficients.items() if v is not None}
    models = (opt.models.time.model, opt.models.memory.model)
    opt.best()
    opt.predict([BASELINE])
    assert all(np.array_equal(coef[k], opt.prior_features.coefficients[k]) for k in coef)
    assert (opt.models.time.model, opt.models.memory.model) == models  # the same fitted objects
