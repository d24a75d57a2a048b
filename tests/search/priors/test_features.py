"""``PriorFeatures`` (``priors/features.py``) in the optimizer: the prior's columns give P(fit)
before any memory model, its coefficients are fitted, saved, restored (or refitted when saved for
another term set) and refitted only when their data changed."""

from __future__ import annotations

import numpy as np
from search_synthetic import BASELINE, CAPACITY, DENSE, SyntheticPrior, memory_bytes, run

from infrarsi.search import Optimizer, SearchSpace


def test_prior_gives_p_fit_before_any_memory_model() -> None:
    space = SearchSpace.from_yaml(DENSE)
    huge = space.validate(
        {
            "zero_stage": 0,
            "micro_batch_size": 8,
            "activation_checkpointing": "none",
            "dtype": "fp32",
        }
    )
    assert memory_bytes(huge) > 2 * CAPACITY
    for prior, expect_low in ((SyntheticPrior(), True), (None, False)):
        opt = Optimizer(space, memory_capacity=CAPACITY, seed=0, baseline=BASELINE, prior=prior)
        opt.tell(BASELINE, run(space.validate(BASELINE)))
        p = float(opt.predict([huge])["p_fit"][0])
        assert (p < 0.05) if expect_low else (p == 1.0)


def test_prior_search_runs_saves_restores_and_batches(tmp_path) -> None:
    space = SearchSpace.from_yaml(DENSE)
    opt = Optimizer(
        space, memory_capacity=CAPACITY, seed=2, baseline=BASELINE, prior=SyntheticPrior()
    )
    for _ in range(8):
        c = opt.ask()
        opt.tell(c, run(c))
    assert (
        opt.prior_features.coefficients["time"] is not None
        and opt.prior_features.coefficients["memory"] is not None
    )
    path = tmp_path / "opt.json"
    opt.save(path)
    restored = Optimizer.load(path)
    assert isinstance(restored.prior, SyntheticPrior)
    assert opt.ask() == restored.ask()
    batch = opt.ask(3)  # qLogNEI on the ModelListGP with the offset columns
    assert len({space.key(c) for c in batch}) == 3


def _told(seed: int, n: int) -> Optimizer:
    """An optimizer with ``SyntheticPrior`` after ``n`` asks and tells."""
    opt = Optimizer(
        SearchSpace.from_yaml(DENSE),
        memory_capacity=CAPACITY,
        seed=seed,
        baseline=BASELINE,
        prior=SyntheticPrior(),
    )
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
    assert (
        restored.prior_features.coefficients["time"] is None
        and restored.prior_features.fit_keys["time"] is None
    )
    assert restored.prior_features.coefficients["memory"] is not None
    c = restored.ask()
    assert (
        restored.prior_features.coefficients["time"] is not None
        and len(restored.prior_features.coefficients["time"]) == 3
    )
    assert space.validate(c) == c


def test_no_refit_when_the_data_did_not_change() -> None:
    opt = _told(seed=1, n=5)
    opt.best()
    coef = {k: v.copy() for k, v in opt.prior_features.coefficients.items() if v is not None}
    models = (opt.models.time.model, opt.models.memory.model)
    opt.best()
    opt.predict([BASELINE])
    assert all(np.array_equal(coef[k], opt.prior_features.coefficients[k]) for k in coef)
    assert (opt.models.time.model, opt.models.memory.model) == models  # the same fitted objects


def test_inputs_are_the_encoded_configs_plus_the_fitted_prior_columns() -> None:
    from infrarsi.search.encoding import Encoder
    from infrarsi.search.priors.features import PriorFeatures
    from infrarsi.search.settings import DEFAULT_SETTINGS

    space = SearchSpace.from_yaml(DENSE)
    enc = Encoder(space)
    configs = [space.validate(BASELINE), space.validate({"zero_stage": 1, "micro_batch_size": 4})]
    plain = PriorFeatures(space, enc, None, CAPACITY, DEFAULT_SETTINGS)
    assert np.array_equal(plain.inputs(configs).numpy(), enc.encode(configs).numpy())
    feats = PriorFeatures(space, enc, SyntheticPrior(), CAPACITY, DEFAULT_SETTINGS)
    X = feats.inputs(configs)
    assert X.shape == (2, enc.dim + 2)
    T, M = SyntheticPrior().terms(configs)
    assert np.allclose(
        X[:, enc.dim].numpy(), np.log(T.sum(1))
    )  # nominal coefficients: the plain sums
    assert np.allclose(X[:, enc.dim + 1].numpy(), np.log(M.sum(1) / CAPACITY))
    feats.fit_time(configs, [20.0, 14.0])
    coef = feats.coefficients["time"]
    assert coef is not None and feats.fit_keys["time"] is not None
    feats.fit_time(configs, [20.0, 14.0])  # same data: no refit
    assert feats.coefficients["time"] is coef
    state = feats.state_dict()
    other = PriorFeatures(space, enc, SyntheticPrior(), CAPACITY, DEFAULT_SETTINGS)
    other.load_state_dict(state["coefficients"], state["fit_keys"])
    assert np.array_equal(other.inputs(configs).numpy(), feats.inputs(configs).numpy())
