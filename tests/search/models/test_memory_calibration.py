"""The memory model's prequential checks (``models/memory_calibration.py``): the extra sd they
call for, the window, the saved state, and the optimizer recording them before it refits."""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import norm

from infrarsi.search import Optimizer, OptimizerSettings, Outcome, SearchSpace
from infrarsi.search.models.memory_calibration import MAX_EXTRA_SD, MemoryCalibration


def _cal(window: int = 12) -> MemoryCalibration:
    return MemoryCalibration(window=window, prior_sd=0.5)


def test_no_checks_no_extra_sd() -> None:
    assert _cal().extra_sd() == 0.0


def test_predictions_within_their_sd_keep_the_extra_sd_near_zero() -> None:
    cal = _cal()
    rng = np.random.default_rng(0)
    means = rng.uniform(-1.0, -0.2, 12)
    ys = means + 0.05 * rng.standard_normal(12)  # errors as the model's own sd says
    cal.record(ys.tolist(), [False] * 12, means.tolist(), [0.05] * 12)
    assert cal.extra_sd() <= 0.03


def test_confident_predictions_that_ran_out_of_memory_widen_the_spread() -> None:
    cal = _cal()
    # six configs predicted at 40-70% of the capacity with sd 0.01; two ran out of memory and the
    # others landed 0.2-0.5 log away from the prediction
    means = [-0.4, -0.5, -0.9, -0.3, -0.6, -0.7]
    ys = [0.0, -0.2, -0.4, 0.0, -0.1, -1.2]
    cens = [True, False, False, True, False, False]
    cal.record(ys, cens, means, [0.01] * 6)
    c = cal.extra_sd()
    assert 0.2 <= c <= MAX_EXTRA_SD
    # a config the model calls 0.4 log under the capacity with sd 0.01 is no longer "P(fit) 1.0"
    p_fit = norm.cdf(0.4 / math.hypot(0.01, c))
    assert p_fit < 0.95


def test_only_the_last_window_checks_count() -> None:
    cal = _cal(window=4)
    cal.record([0.0] * 4, [True] * 4, [-0.5] * 4, [0.01] * 4)  # four bad misses, long ago
    assert cal.extra_sd() > 0.2
    cal.record([-0.5] * 4, [False] * 4, [-0.5] * 4, [0.01] * 4)  # four exact predictions since
    assert cal.extra_sd() <= 0.01
    assert _cal(window=0).extra_sd() == 0.0


def test_only_configs_new_to_the_rows_are_checked_once_each() -> None:
    cal = MemoryCalibration(12, 0.5)
    assert cal.take_new(["a", "b"]) == [0, 1] and cal.checked_rows == 2
    # a replicate of a checked config, a new one twice, another new one
    assert cal.take_new(["a", "b", "a", "c", "c", "d"]) == [3, 5]
    assert cal.checked_rows == 6 and cal.take_new(["a", "b", "a", "c", "c", "d"]) == []


def test_non_finite_predictions_are_not_checks_and_the_state_round_trips() -> None:
    cal = _cal()
    cal.record([0.0, -0.3], [True, False], [float("nan"), -0.4], [0.1, 0.0])
    assert cal.checks == []  # a NaN mean and a zero sd say nothing
    cal.record([0.0, -0.3], [True, False], [-0.2, -0.4], [0.05, 0.05])
    cal.checked_rows = 7
    other = _cal()
    other.load_dict(cal.to_dict())
    assert other.checks == cal.checks and other.checked_rows == 7
    assert other.extra_sd() == cal.extra_sd()
    fresh = _cal()
    fresh.load_dict(None)  # a state saved before the checks existed
    assert fresh.checks == [] and fresh.checked_rows == 0


SPACE = """
name: toy-memory
knobs:
  - {name: mbs, type: int, values: [1, 2, 4, 8, 16, 32], memory: hungry}
  - {name: ckpt, type: bool, memory: saver}
  - {name: shard, type: int, values: [1, 2, 4, 8], memory: saver}
"""
CAP = 100.0


def _peak(c: dict[str, object]) -> float:
    """Memory that a log-linear model misjudges: states shrink with sharding, activations grow
    with the micro-batch and shrink 8x with checkpointing (a sum, not a product)."""
    acts = 6.0 * float(c["mbs"]) / (8.0 if c["ckpt"] else 1.0)  # type: ignore[arg-type]
    return 40.0 / float(c["shard"]) + acts  # type: ignore[arg-type]


def _outcome(c: dict[str, object]) -> Outcome:
    peak = _peak(c)
    if peak > CAP:
        return Outcome("oom", peak_memory=CAP)
    return Outcome("ok", step_time=1.0 + 1.0 / float(c["mbs"]), peak_memory=peak)  # type: ignore[arg-type]


def test_the_optimizer_checks_new_configs_before_it_refits_and_saves_the_checks() -> None:
    space = SearchSpace.from_yaml(SPACE)
    opt = Optimizer(space, memory_capacity=CAP, seed=0)
    told = [
        {"mbs": 1, "ckpt": True, "shard": 1},
        {"mbs": 4, "ckpt": True, "shard": 2},
        {"mbs": 2, "ckpt": False, "shard": 4},
    ]
    for c in told:
        opt.tell(c, _outcome(c))
    opt.models.fit(opt.history)  # the first fit: nothing to check yet
    assert opt.models.memory_calibration.checks == []
    assert opt.models.memory_calibration.checked_rows == 3
    new = [
        {"mbs": 32, "ckpt": False, "shard": 1},  # 232: out of memory
        {"mbs": 4, "ckpt": True, "shard": 2},  # a replicate: not a check
        {"mbs": 16, "ckpt": False, "shard": 8},  # 101: out of memory
    ]
    for c in new:
        opt.tell(c, _outcome(c))
    opt.models.fit(opt.history)
    checks = opt.models.memory_calibration.checks
    assert [ch.censored for ch in checks] == [True, True]
    assert [ch.log_rel_peak for ch in checks] == [0.0, 0.0]
    assert opt.models.memory_calibration.checked_rows == 6
    # the saved state carries the checks; a restored optimizer scores P(fit) the same
    other = Optimizer(space, memory_capacity=CAP, seed=0)
    for c in told + new:
        other.tell(c, _outcome(c))
    other.load_state_dict(opt.state_dict())
    probe = [space.validate({"mbs": 8, "ckpt": False, "shard": 2})]
    a, b = opt.predict(probe), other.predict(probe)
    assert other.models.memory_calibration.checks == checks
    assert np.allclose(a["p_fit"], b["p_fit"])


def test_a_window_of_zero_is_the_models_own_spread() -> None:
    space = SearchSpace.from_yaml(SPACE)
    told = [
        {"mbs": 1, "ckpt": True, "shard": 1},
        {"mbs": 4, "ckpt": True, "shard": 2},
        {"mbs": 2, "ckpt": False, "shard": 4},
    ]
    later = [{"mbs": 32, "ckpt": False, "shard": 1}, {"mbs": 16, "ckpt": False, "shard": 8}]
    probe = [space.validate({"mbs": 16, "ckpt": False, "shard": 4})]  # 106: does not fit
    p: dict[int, float] = {}
    for window in (0, 12):
        opt = Optimizer(
            space,
            memory_capacity=CAP,
            seed=0,
            settings=OptimizerSettings(memory_calibration_window=window),
        )
        for c in told:
            opt.tell(c, _outcome(c))
        opt.models.fit(opt.history)
        for c in later:
            opt.tell(c, _outcome(c))
        p[window] = float(opt.predict(probe)["p_fit"][0])
    # the same fit calls the probe "fits" with certainty (it predicts 22% of the capacity, after
    # two OOMs it had predicted at 72% and 12%); the calibrated one adds the spread those misses
    # call for
    assert p[0] > 0.99 and p[12] < p[0] - 0.05
