"""The model set (``modelset.py``): fitting on the history, memory rows and censoring, stragglers left
out, the incumbent, scores under the prior alone, and its saved state."""

from __future__ import annotations

import math

import numpy as np
from search_synthetic import (
    BASELINE,
    CAPACITY,
    DENSE,
    TINY,
    TINY_CAP,
    SyntheticPrior,
    dense_optimizer,
    run,
    tiny_run,
)

from infrarsi.search import Optimizer, OptimizerSettings, Outcome, SearchSpace


def _told(settings: OptimizerSettings | None = None) -> Optimizer:
    space = SearchSpace.from_yaml(TINY)
    opt = Optimizer(space, memory_capacity=TINY_CAP, seed=0, settings=settings)
    for c in (
        {"stage": 2, "mbs": 1, "ckpt": True},
        {"stage": 0, "mbs": 8, "ckpt": False},
        {"stage": 1, "mbs": 2},
    ):
        c = space.validate(c)
        opt.tell(c, tiny_run(c))
    opt.tell(space.validate({"stage": 0, "mbs": 4}), Outcome(status="failed"))
    return opt


def test_memory_rows_hold_ok_peaks_and_ooms_as_lower_bounds_only_with_censoring() -> None:
    on, off = _told(), _told(OptimizerSettings(censoring=False))
    rows, ys, cens = on.models.memory_rows(on.history)
    assert [tiny_run(c).status for c in rows] == ["ok", "oom", "ok"] and cens == [
        False,
        True,
        False,
    ]
    assert ys[1] >= 0.0 and ys[0] == math.log(tiny_run(rows[0]).peak_memory / TINY_CAP)  # type: ignore[operator]
    rows_off, _, cens_off = off.models.memory_rows(off.history)
    assert len(rows_off) == 2 and not any(
        cens_off
    )  # the OOM is dropped; the failure never is a memory row


def test_excluded_and_the_incumbent_follow_the_history() -> None:
    opt = _told()
    failed, ok = opt.models.excluded(opt.history)
    space = opt.space
    assert {space.key(space.validate({"stage": 0, "mbs": 4}))} < failed and not ok & failed
    assert ok == {space.key(o.config) for o in opt.observations if o.outcome.status == "ok"}
    inc = opt.models.incumbent(opt.history)
    assert inc is not None and space.key(inc) in ok
    assert (
        opt.models.time.model is not None and opt.models.memory.model is not None
    )  # fitted by incumbent()


def test_the_saved_state_restores_the_fit_without_refitting() -> None:
    opt = _told()
    opt.models.fit(opt.history)
    saved = opt.models.to_dict()
    assert set(saved) == {
        "models",
        "prior_coefficients",
        "prior_fit_keys",
        "time_outliers",
        "time_trim_key",
        "memory_calibration",
    }
    other = _told()
    other.models.load_dict(saved)
    assert (
        other.models.time.model is None
        and other.models.time.fitted_key == opt.models.time.fitted_key
    )
    other.models.fit(other.history)  # the same data: rebuilt from the saved parameters
    probe = [opt.space.validate({"stage": 1, "mbs": 4})]
    a, b = opt.models.scores(opt.history, probe), other.models.scores(other.history, probe)
    assert np.allclose(a.time_mean, b.time_mean) and np.allclose(a.p_fit, b.p_fit)


def test_with_a_prior_and_no_result_the_scores_come_from_the_prior_alone() -> None:
    space = SearchSpace.from_yaml(DENSE)
    opt = Optimizer(
        space, memory_capacity=CAPACITY, seed=0, baseline=BASELINE, prior=SyntheticPrior()
    )
    every = space.enumerate() or []
    configs = every[:: max(1, len(every) // 60)]
    X = opt.models.inputs(configs)
    cols = opt.models.columns
    assert X.shape[1] == cols.n_features + 2 and (cols.prior_time, cols.prior_memory) == (
        X.shape[1] - 2,
        X.shape[1] - 1,
    )
    scores = opt.models.prior_scores(opt.history, configs, X, space.validate(BASELINE))
    assert np.isfinite(scores.log_score).all() and np.allclose(
        scores.time_mean, X[:, cols.prior_time].numpy()
    )
    fits = np.array([run(c).status != "oom" for c in configs])
    assert fits.any() and not fits.all()
    assert scores.p_fit[fits].mean() > scores.p_fit[~fits].mean()  # the prior knows memory


def test_the_interaction_setting_gives_the_step_time_model_its_pair_term() -> None:
    from infrarsi.search.models.pair_kernel import PairKernel

    space = SearchSpace.from_yaml(DENSE)
    configs = (space.enumerate() or [])[::97][:6]

    def pair_terms(sd: float) -> list[PairKernel]:
        opt = dense_optimizer(OptimizerSettings(interaction_sd=sd))
        for c in configs:
            opt.tell(c, run(c))
        opt.predict(configs[:1])
        kernels = opt.models.time.model.covar_module.kernels  # type: ignore[union-attr]
        return [b for k in kernels if isinstance(b := getattr(k, "base_kernel", None), PairKernel)]

    assert pair_terms(0.0) == []
    (term,) = pair_terms(0.25)
    assert len(term.groups) == len(space.knobs)


STRAGGLER_SPACE = """
name: toy
knobs:
  - {name: a, type: int, values: [1, 2, 3, 4, 5, 6]}
  - {name: b, type: int, values: [1, 2, 3, 4]}
"""


def _straggler_truth(c: dict[str, int]) -> float:
    return 2.0 + 0.5 * c["a"] + 0.3 * (c["b"] - 2) ** 2


def test_optimizer_leaves_a_straggler_out_and_may_measure_it_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    space = SearchSpace.from_yaml(STRAGGLER_SPACE)
    opt = Optimizer(space, memory_capacity=100.0, seed=0)
    rng = np.random.default_rng(0)
    configs = [{"a": a, "b": b} for a in (1, 3, 5, 6) for b in (1, 2, 4)]
    for i, c in enumerate(configs):
        t = _straggler_truth(c) * math.exp(0.01 * rng.standard_normal())
        if c == {"a": 1, "b": 2}:  # the fastest config, measured during a straggler
            t *= 1.5
            straggler = i
        opt.tell(c, Outcome("ok", step_time=t, peak_memory=50.0))
    # best() recommends only configs with a trusted measurement; the model ignores the slow one
    assert opt.best() == {"a": 1, "b": 1}
    assert opt.models.time_outliers == {straggler}
    pred = float(opt.predict([{"a": 1, "b": 2}])["step_time_mean_s"][0])
    assert abs(pred / _straggler_truth({"a": 1, "b": 2}) - 1) < 0.1  # not the straggler's 1.5x
    assert (
        space.key({"a": 1, "b": 2}) not in opt.models.excluded(opt.history)[1]
    )  # it may be measured again
    opt.save(tmp_path / "s.json")
    again = Optimizer.load(tmp_path / "s.json")
    assert (
        again.models.time_outliers == {straggler}
        and again.models.time_trim_key == opt.models.time_trim_key
    )
    # a second slow measurement agrees with the first: neither is an outlier any more
    opt.tell(
        {"a": 1, "b": 2},
        Outcome("ok", step_time=_straggler_truth({"a": 1, "b": 2}) * 1.5, peak_memory=50.0),
    )
    opt.best()
    assert opt.models.time_outliers == set()
