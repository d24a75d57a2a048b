"""Transfer from the bank inside the models: coefficient centres, the ranked weights, no change
without a bank, save/restore."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from search_synthetic import (
    BASELINE,
    CAPACITY,
    DENSE,
    SyntheticPrior,
    memory_bytes,
    run,
    step_time_s,
    synthetic_source,
)

from infrarsi.search import Optimizer, OptimizerSettings, SearchSpace
from infrarsi.search.encoding import Encoder
from infrarsi.search.pickers import Round
from infrarsi.search.priors.mean import fit_log_coefficients, log_prior_sum
from infrarsi.search.transfer import SourceStudy, TransferModel, TransferPrior, discordant_pairs
from infrarsi.search.transfer_checks import TimeRankCheck


def _configs(space: SearchSpace, n: int, seed: int) -> list[dict[str, Any]]:
    rows = space.enumerate()
    assert rows is not None
    idx = np.random.default_rng(seed).choice(len(rows), size=n, replace=False)
    return [dict(rows[int(i)]) for i in idx]


def _source(
    space: SearchSpace, *, slower: float = 2.0, reverse: bool = False, n: int = 24
) -> SourceStudy:
    """An earlier study of the synthetic problem on hardware ``slower`` times slower (``reverse``:
    its step-time ranking turned upside down, an unrelated bank)."""
    cfgs = [c for c in _configs(space, 3 * n, 7) if memory_bytes(c) <= CAPACITY][:n]
    times = [slower * step_time_s(c) for c in cfgs]
    if reverse:
        times = [slower * 400.0 / t for t in times]
    return synthetic_source(cfgs, times)


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    return SearchSpace.from_yaml(DENSE)


def test_discordant_pairs_count_only_pairs_further_apart_than_the_tie() -> None:
    y = np.array([1.0, 2.0, 3.0])
    assert discordant_pairs(y, y, 0.0) == 0
    assert discordant_pairs(-y, y, 0.0) == 3
    assert discordant_pairs(-y, y, 1.5) == 1  # only (1, 3) is more than 1.5 apart


def test_the_centre_is_the_sources_own_coefficient_fit(space: SearchSpace) -> None:
    src = _source(space)
    tm = TransferModel(TransferPrior((src,)), Encoder(space), SyntheticPrior(), OptimizerSettings())
    T, _ = SyntheticPrior().terms(list(src.source_configs))
    s = OptimizerSettings()
    direct = fit_log_coefficients(
        T,
        np.log(np.array(src.step_times_s, dtype=float)),
        noise_sd=s.prior_time_noise_sd,
        prior_sd=s.prior_time_coef_sd,
        max_iter=s.prior_fit_iters,
    )
    assert tm.centres["time"] is not None and np.allclose(tm.centres["time"], direct)
    assert tm.centres["time"][0] > math.log(
        1.5
    )  # the 2x slower machine shows in the compute coefficient
    assert tm.residual_model is not None and tm.used_rows == len(src.configs)
    tm.centre_weight = 0.5
    assert np.allclose(tm.centre("time"), 0.5 * direct)  # the weight scales the time centre
    assert tm.centre("memory") is not None  # memory's centre is not tied to the time ranking


def test_weights_follow_the_ranking_of_the_studys_own_trials(space: SearchSpace) -> None:
    enc = Encoder(space)
    good = TransferModel(
        TransferPrior((_source(space),)), enc, SyntheticPrior(), OptimizerSettings()
    )
    bad = TransferModel(
        TransferPrior((_source(space, reverse=True),)), enc, SyntheticPrior(), OptimizerSettings()
    )
    cfgs = _configs(space, 12, 3)
    X = enc.encode(cfgs)
    y = np.log([step_time_s(c) for c in cfgs])
    T, _ = SyntheticPrior().terms(cfgs)
    assert good.centres["time"] is not None
    base = log_prior_sum(
        T, good.centres["time"]
    )  # the fitted prior, which misses part of the truth
    assert discordant_pairs(base.numpy(), y, 0.03) > 0
    good.update_weight(X, T, base, y)
    bad.update_weight(X, T, base, y)
    assert (
        good.residual_weight > 0
    )  # the faithful residual ranks the trials better than the prior alone
    assert bad.residual_weight == 0.0  # the reversed one ranks them worse: dropped
    # the centre: a source-only prediction that ranks the trials right keeps weight 1, a wrong one loses it
    tm = TransferModel(TransferPrior((_source(space),)), enc, SyntheticPrior(), OptimizerSettings())
    tm.centres["time"] = np.array([math.log(4.0), 0.0, 0.0])
    T2 = np.array(
        [[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]]
    )  # nominal: 1 s vs 2 s; with the centre: 4 s vs 2 s
    X2 = enc.encode(cfgs[:2])
    tm.update_weight(X2, T2, torch.zeros(2, dtype=torch.float64), np.log([4.0, 2.0]))
    assert tm.centre_weight == 1.0
    tm.update_weight(X2, T2, torch.zeros(2, dtype=torch.float64), np.log([1.0, 2.0]))
    assert tm.centre_weight < 0.5
    assert [h[0] for h in tm.weight_history] == [2, 2]


def test_a_bank_whose_formulas_cannot_rank_its_own_trials_starts_untrusted(
    space: SearchSpace,
) -> None:
    """The centre is checked on the bank's own trials out of sample: a faithful bank (two
    sources, or one split in halves) ranks them far better than chance and starts at weight 1; a
    bank with its step times permuted among its trials does not: both weights are 0 for the whole
    study, even where its centre happens to rank this study's trials right, and a warm-start turn
    is dropped.
    ``transfer_trust_p`` 1 trusts every bank."""
    fits = [c for c in _configs(space, 120, 5) if memory_bytes(c) <= CAPACITY]
    a_cfg, b_cfg = fits[:24], fits[24:48]
    a = synthetic_source(a_cfg, [2.0 * step_time_s(c) for c in a_cfg], name="a")
    b = synthetic_source(b_cfg, [2.0 * step_time_s(c) for c in b_cfg], name="b")
    rng = np.random.default_rng(1)
    scrambled = [
        replace(src, step_times_s=tuple(rng.permutation(np.array(src.step_times_s)).tolist()))
        for src in (a, b)
    ]
    enc = Encoder(space)
    s = OptimizerSettings()

    def model(sources: tuple[SourceStudy, ...], settings: OptimizerSettings = s) -> TransferModel:
        return TransferModel(TransferPrior(sources), enc, SyntheticPrior(), settings)

    for sources in ((a, b), (a,)):
        tm = model(sources)
        check = tm.rank_check
        assert isinstance(check, TimeRankCheck) and check.trusted
        assert check.kendall_tau > 0.15 and check.p_value <= s.transfer_trust_p
        assert check.trials == sum(len(src.configs) for src in sources)
        assert (tm.centre_weight, tm.residual_weight) == (1.0, 1.0)
        assert tm.summary()["rank_check"] == check.to_dict()

    bad = model(tuple(scrambled))
    assert bad.rank_check is not None and not bad.rank_check.trusted
    assert bad.rank_check.p_value > s.transfer_trust_p
    assert (bad.centre_weight, bad.residual_weight) == (0.0, 0.0) and not bad.active
    assert bad.centres["memory"] is not None  # memory is not the time ranking: still transferred

    # this study's trials: the centre ranks them right (nominal: 1 s vs 2 s; with it: 4 s vs 2 s)
    T2, y2 = np.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]]), np.log([4.0, 2.0])
    X2 = enc.encode(fits[48:50])
    for tm, expected in ((model((a, b)), 1.0), (bad, 0.0)):
        tm.centres["time"] = np.array([math.log(4.0), 0.0, 0.0])
        tm.update_weight(X2, T2, torch.zeros(2, dtype=torch.float64), y2)
        assert tm.centre_weight == expected  # the untrusted bank cannot earn it back by chance
        assert tm.weight_history[-1] == (2, expected, tm.residual_weight)
    assert bad.residual_weight == 0.0

    assert model(tuple(scrambled), replace(s, transfer_trust_p=1.0)).centre_weight == 1.0

    opt = Optimizer(
        space,
        memory_capacity=CAPACITY,
        seed=0,
        baseline=BASELINE,
        prior=SyntheticPrior(),
        transfer=TransferPrior(tuple(scrambled)),
        initial_configs=[a_cfg[0]],
    )
    rnd = Round(taken=set(), failed=set(), warm_fitted=False)
    assert opt.pickers.warm_start(opt.history, rnd) is None  # dropped, not copied
    assert opt.history.warm_queue == []


def _asks(opt: Optimizer, n: int) -> list[dict[str, Any]]:
    out = []
    for _ in range(n):
        cfg = opt.ask()
        assert isinstance(cfg, dict)
        opt.tell(cfg, run(cfg))
        out.append(cfg)
    return out


def test_without_a_bank_the_asks_are_those_of_the_cold_optimizer(space: SearchSpace) -> None:
    kw: dict[str, Any] = {
        "memory_capacity": CAPACITY,
        "seed": 3,
        "baseline": BASELINE,
        "prior": SyntheticPrior(),
    }
    cold = _asks(Optimizer(space, **kw), 6)
    assert _asks(Optimizer(space, transfer=TransferPrior(()), **kw), 6) == cold  # an empty bank
    off = Optimizer(
        space,
        transfer=TransferPrior((_source(space),)),
        settings=replace(OptimizerSettings(), transfer=False),
        **kw,
    )
    assert off.transfer is None and _asks(off, 6) == cold  # the switch off: ignored
    assert (
        Optimizer(
            space, memory_capacity=CAPACITY, transfer=TransferPrior((_source(space),))
        ).transfer
        is None
    )


def test_the_transfer_reaches_the_models_and_survives_save_and_restore(space: SearchSpace) -> None:
    kw: dict[str, Any] = {
        "memory_capacity": CAPACITY,
        "seed": 3,
        "baseline": BASELINE,
        "prior": SyntheticPrior(),
    }
    opt = Optimizer(space, transfer=TransferPrior((_source(space),)), **kw)
    cold = Optimizer(space, **kw)
    assert opt.transfer is not None
    probe = _configs(space, 5, 11)
    assert not np.allclose(
        opt.predict(probe)["step_time_mean_s"], cold.predict(probe)["step_time_mean_s"]
    )
    _asks(opt, 4)
    info = opt.last_ask_info
    assert info is not None and not isinstance(info, list) and info.transfer_weights is not None
    restored = Optimizer.from_state(opt.state_dict())
    assert restored.transfer is not None
    assert (restored.transfer.centre_weight, restored.transfer.residual_weight) == (
        opt.transfer.centre_weight,
        opt.transfer.residual_weight,
    )
    assert restored.ask() == opt.ask()


def test_the_memory_sd_is_the_centres_error_on_the_sources_own_peaks_out_of_sample(
    space: SearchSpace,
) -> None:
    """Each source's peaks are predicted by the other source's memory centre; a bank whose peaks
    the formulas cannot carry (scaled at random) has a larger sd, and before this study has a
    memory model its prior-only sd is that, floored and capped by the settings."""
    fits = [c for c in _configs(space, 96, 5) if memory_bytes(c) <= CAPACITY]
    a = synthetic_source(fits[:20], [step_time_s(c) for c in fits[:20]], name="a")
    b = synthetic_source(fits[20:40], [step_time_s(c) for c in fits[20:40]], name="b")
    s = OptimizerSettings()
    enc = Encoder(space)
    tm = TransferModel(TransferPrior((a, b)), enc, SyntheticPrior(), s)

    def centre(src: SourceStudy) -> np.ndarray:
        return TransferModel(TransferPrior((src,)), enc, SyntheticPrior(), s).centres["memory"]  # type: ignore[return-value]

    errors = []
    for held, other in ((a, b), (b, a)):
        _, M = SyntheticPrior().terms(list(held.source_configs))
        y = np.log(np.array(held.peak_memory_bytes, dtype=float) / CAPACITY)
        errors.append(log_prior_sum(M / CAPACITY, centre(other)).numpy() - y)
    expected = float(np.sqrt(np.mean(np.concatenate(errors) ** 2)))
    assert tm.memory_sd is not None and math.isclose(tm.memory_sd, expected, rel_tol=1e-9)
    assert tm.memory_sd < s.prior_only_memory_sd

    rng = np.random.default_rng(0)
    noisy = replace(
        b,
        peak_memory_bytes=tuple(p * float(rng.uniform(0.5, 1.5)) for p in b.peak_memory_bytes),  # type: ignore[operator]
    )
    worse = TransferModel(TransferPrior((a, noisy)), enc, SyntheticPrior(), s)
    assert worse.memory_sd is not None and worse.memory_sd > 2 * tm.memory_sd

    kw: dict[str, Any] = {"memory_capacity": CAPACITY, "seed": 3, "baseline": BASELINE}
    banked = Optimizer(space, transfer=TransferPrior((a, b)), prior=SyntheticPrior(), **kw)
    cold = Optimizer(space, prior=SyntheticPrior(), **kw)
    assert cold.models.prior_only_memory_sd() == s.prior_only_memory_sd
    assert banked.models.prior_only_memory_sd() == min(
        s.prior_only_memory_sd, max(expected, s.transfer_memory_sd_floor)
    )
    loose = Optimizer(
        space,
        transfer=TransferPrior((a, noisy)),
        prior=SyntheticPrior(),
        settings=replace(s, prior_only_memory_sd=0.05),
        **kw,
    )
    assert loose.models.prior_only_memory_sd() == 0.05  # never wider than the cold optimizer's
