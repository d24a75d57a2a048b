"""Verify statistics: paired speedup, bootstrap CI, noise margin and acceptance."""

from __future__ import annotations

import numpy as np
import pytest

from infrarsi.stats import accept, coefficient_of_variation, noise_margin, paired_ratios, speedup_ci


def noisy(rng: np.random.Generator, mean: float, cv: float, n: int) -> list[float]:
    return list(mean * (1 + cv * rng.standard_normal(n)))


def test_identical_configs_noisy_measurements_are_not_accepted() -> None:
    # Two identical configs measured with 5.3% noise (the CV measured on 2 CPU cores).
    margin = noise_margin(0.053)
    accepted = 0
    for trial in range(200):
        rng = np.random.default_rng(trial)
        est = speedup_ci(noisy(rng, 1.0, 0.053, 6), noisy(rng, 1.0, 0.053, 6), seed=trial)
        accepted += accept(est.ci_low, margin)
    assert accepted == 0


def test_identical_configs_with_drift_are_not_accepted() -> None:
    # Interleaving cancels a slow drift that hits both arms.
    rng = np.random.default_rng(7)
    drift = np.linspace(1.0, 1.3, 8)
    base = drift * (1 + 0.03 * rng.standard_normal(8))
    cand = drift * (1 + 0.03 * rng.standard_normal(8))
    est = speedup_ci(base, cand)
    assert not accept(est.ci_low, noise_margin(0.03))
    assert est.ci_low < 1.0 < est.ci_high


def test_real_speedup_is_accepted_with_a_ci_around_it() -> None:
    rng = np.random.default_rng(1)
    base, cand = noisy(rng, 2.0, 0.05, 6), noisy(rng, 0.66, 0.05, 6)
    est = speedup_ci(base, cand, seed=0)
    assert 2.7 < est.speedup < 3.4
    assert est.ci_low <= est.speedup <= est.ci_high
    assert accept(est.ci_low, noise_margin(0.053))
    assert est.n_pairs == 6 and len(est.ratios) == 6


def test_bootstrap_is_seeded() -> None:
    a, b = [1.0, 1.1, 0.9, 1.05, 1.2], [0.5, 0.55, 0.52, 0.6, 0.49]
    assert speedup_ci(a, b, seed=3) == speedup_ci(a, b, seed=3)


def test_paired_ratios_and_errors() -> None:
    assert paired_ratios([2.0, 3.0], [1.0, 1.5]).tolist() == [2.0, 2.0]
    with pytest.raises(ValueError, match="equal-length"):
        paired_ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="> 0"):
        paired_ratios([1.0], [0.0])
    one = speedup_ci([2.0], [1.0])
    assert one.ci_low == one.ci_high == one.speedup == 2.0


def test_margin_and_cv() -> None:
    assert noise_margin(0.0) == 0.01
    assert noise_margin(0.053) == pytest.approx(0.053)
    assert noise_margin(None) == 0.05
    assert coefficient_of_variation([1.0, 1.0, 1.0]) == 0.0
    assert coefficient_of_variation([1.0, 2.0]) == pytest.approx(np.std([1, 2], ddof=1) / 1.5)
    assert not accept(1.05, 0.05) and accept(1.06, 0.05) and not accept(float("nan"), 0.0)


def test_the_median_interval_says_what_it_covers() -> None:
    from infrarsi.stats import median_interval, order_statistic_coverage, pairs_for_confidence

    assert (
        order_statistic_coverage(3, 1) == 0.75
        and abs(order_statistic_coverage(6, 1) - 0.96875) < 1e-12
    )
    assert pairs_for_confidence(0.95) == 6
    three = median_interval([1.3, 1.1, 1.2])
    assert (three.ci_low, three.ci_high, three.k) == (1.1, 1.3, 1) and not three.reaches_confidence
    assert "75.0%" in three.label()
    twenty = median_interval(list(np.linspace(1.0, 2.0, 20)))
    assert twenty.k == 6 and twenty.coverage >= 0.95 and twenty.reaches_confidence
    # The stated coverage is the real one, on a skewed distribution with a known median.
    rng = np.random.default_rng(0)
    true_median = float(np.exp(0.0))  # lognormal(0, 0.5)
    for n in (3, 6, 11):
        hits = 0
        for _ in range(4000):
            iv = median_interval(rng.lognormal(0.0, 0.5, n))
            hits += iv.ci_low <= true_median <= iv.ci_high
        assert abs(hits / 4000 - iv.coverage) < 0.02, (n, hits / 4000, iv.coverage)
    with pytest.raises(ValueError, match="non-empty"):
        median_interval([])
