"""Verify statistics: the paired-ratio speedup, an interval that covers what it says, the margin.

Verify measures baseline and candidate interleaved (A B A B ...), so drift in the machine hits
both alike. Each pair gives a ratio ``baseline_step_time / candidate_step_time`` (> 1: the
candidate is faster); the speedup is the median of those ratios. Its interval is the
distribution-free order-statistic interval of the median (``median_interval``), whose exact
coverage is printed beside it: with 6 pairs, ``[min, max]`` covers the median 96.9% of the time,
with 3 pairs only 75%. A candidate is accepted only when the lower bound clears
``1 + noise_margin``, the margin coming from the doctor's run-to-run coefficient of variation::

    iv = median_interval(paired_ratios(base_times, cand_times), confidence=0.95)
    margin = noise_margin(doctor["step_time_cv"])
    accepted = iv.reaches_confidence and accept(iv.ci_low, margin)

``speedup_ci`` (a percentile bootstrap) is kept for callers that want it; with few pairs its
nominal level overstates its coverage (3 pairs: [min, max], 75%), so verify does not use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

DEFAULT_MARGIN_FLOOR = 0.01
"""Smallest noise margin: a claimed win must clear 1% even on a perfectly quiet machine."""


@dataclass
class SpeedupEstimate:
    """A paired-ratio speedup and its bootstrap confidence interval."""

    speedup: float
    """Median of the paired ratios baseline/candidate (> 1: candidate faster)."""
    ci_low: float
    """Lower bound of the bootstrap percentile CI of the median ratio."""
    ci_high: float
    """Upper bound of the CI."""
    n_pairs: int
    """Number of (baseline, candidate) pairs."""
    confidence: float
    """Two-sided confidence level of the CI (e.g. 0.95)."""
    ratios: list[float] = field(default_factory=list)
    """The paired ratios, in measurement order."""

    def to_dict(self) -> dict[str, object]:
        return {
            "speedup": self.speedup,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "n_pairs": self.n_pairs,
            "confidence": self.confidence,
            "ratios": self.ratios,
        }


def paired_ratios(baseline_s: Sequence[float], candidate_s: Sequence[float]) -> np.ndarray:
    """``baseline_s[i] / candidate_s[i]`` for each pair. Shapes: both ``(n,)``, n >= 1, all > 0."""
    b = np.asarray(baseline_s, dtype=float)
    c = np.asarray(candidate_s, dtype=float)
    if b.shape != c.shape or b.ndim != 1 or b.size == 0:
        raise ValueError(
            f"paired step times must be two equal-length non-empty 1-D sequences, "
            f"but got shapes {b.shape} and {c.shape}."
        )
    if not (np.all(np.isfinite(b)) and np.all(np.isfinite(c)) and np.all(b > 0) and np.all(c > 0)):
        raise ValueError(
            f"step times must be finite and > 0, but got baseline={b.tolist()} "
            f"candidate={c.tolist()}."
        )
    return b / c


def speedup_ci(
    baseline_s: Sequence[float],
    candidate_s: Sequence[float],
    *,
    confidence: float = 0.95,
    n_boot: int = 4000,
    seed: int = 0,
) -> SpeedupEstimate:
    """Median paired ratio and its percentile-bootstrap CI (pairs resampled with replacement).

    With a single pair the CI collapses to the point (no evidence of spread): such a
    candidate should not be accepted on one pair; verify runs several.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"`0 < confidence < 1` must hold, but got confidence={confidence}.")
    r = paired_ratios(baseline_s, candidate_s)
    med = float(np.median(r))
    if r.size == 1:
        return SpeedupEstimate(med, med, med, 1, confidence, r.tolist())
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, r.size, size=(n_boot, r.size))
    boot = np.median(r[idx], axis=1)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(boot, [alpha, 1 - alpha])
    return SpeedupEstimate(med, float(lo), float(hi), int(r.size), confidence, r.tolist())


@dataclass(frozen=True)
class MedianInterval:
    """A distribution-free confidence interval for the median of paired ratios.

    For n independent ratios from any continuous distribution, the interval between the k-th
    smallest and the k-th largest covers the true median with probability
    ``1 - 2 * P(Binomial(n, 1/2) <= k - 1)``, whatever the distribution: that is
    ``coverage``, exact, not a nominal label. ``k`` is the largest that still reaches the asked
    confidence; when even ``[min, max]`` (k = 1) falls short (n < 6 for 95%), the interval is
    ``[min, max]`` and ``coverage`` says how much less it covers."""

    speedup: float
    """Median of the paired ratios baseline/candidate (> 1: candidate faster)."""
    ci_low: float
    """The k-th smallest ratio."""
    ci_high: float
    """The k-th largest ratio."""
    coverage: float
    """Exact probability that ``[ci_low, ci_high]`` covers the true median ratio (e.g. 0.969
    for [min, max] of 6 pairs)."""
    confidence: float
    """The coverage that was asked for (e.g. 0.95); ``coverage >= confidence`` unless too few
    pairs were measured."""
    k: int
    """Rank of the bounds from each end (1: min and max)."""
    n_pairs: int
    """Number of (baseline, candidate) pairs."""

    @property
    def reaches_confidence(self) -> bool:
        """True when the interval covers at least the asked confidence."""
        return self.coverage >= self.confidence - 1e-12

    def label(self) -> str:
        """How to print it: ``96.9% interval (order statistics 1 and 6 of 6 pairs)``."""
        return (
            f"{self.coverage:.1%} interval (order statistics {self.k} and "
            f"{self.n_pairs - self.k + 1} of {self.n_pairs} pairs)"
        )


def order_statistic_coverage(n: int, k: int) -> float:
    """Exact coverage of ``[x_(k), x_(n-k+1)]`` for the median of n continuous samples."""
    from scipy.stats import binom

    if not 1 <= k <= (n + 1) // 2:
        raise ValueError(f"`1 <= k <= (n + 1) // 2` must hold, but got (n={n}, k={k}).")
    return float(1.0 - 2.0 * binom.cdf(k - 1, n, 0.5))


def pairs_for_confidence(confidence: float = 0.95) -> int:
    """The fewest pairs whose ``[min, max]`` covers the median with at least ``confidence``
    (6 for 0.95: 96.9%; 5 give 93.8%)."""
    n = 2
    while order_statistic_coverage(n, 1) < confidence:
        n += 1
    return n


def median_interval(ratios: Sequence[float], *, confidence: float = 0.95) -> MedianInterval:
    """The order-statistic interval of ``ratios``' median (``MedianInterval``); n >= 1."""
    if not 0 < confidence < 1:
        raise ValueError(f"`0 < confidence < 1` must hold, but got confidence={confidence}.")
    r = np.sort(np.asarray(ratios, dtype=float))
    if r.ndim != 1 or r.size == 0 or not np.all(np.isfinite(r)):
        raise ValueError(
            f"ratios must be a non-empty 1-D sequence of finite numbers, but got {list(ratios)}."
        )
    n = int(r.size)
    k = 1
    while k + 1 <= (n + 1) // 2 and order_statistic_coverage(n, k + 1) >= confidence:
        k += 1
    cov = order_statistic_coverage(n, k) if n > 1 else 0.0
    return MedianInterval(
        speedup=float(np.median(r)),
        ci_low=float(r[k - 1]),
        ci_high=float(r[n - k]),
        coverage=cov,
        confidence=confidence,
        k=k,
        n_pairs=n,
    )


def coefficient_of_variation(samples: Sequence[float]) -> float:
    """Sample standard deviation over mean (ddof=1); 0 for fewer than two samples."""
    x = np.asarray(samples, dtype=float)
    if x.size < 2 or float(np.mean(x)) == 0:
        return 0.0
    return float(np.std(x, ddof=1) / np.mean(x))


def noise_margin(cv: float | None, *, k: float = 1.0, floor: float = DEFAULT_MARGIN_FLOOR) -> float:
    """The extra a verified speedup's lower bound must clear above 1.

    ``cv`` is the doctor's run-to-run step-time coefficient of variation (between separate
    trials, e.g. 0.053 measured on 2 CPU cores). Within-run pairs miss slow drifts between
    runs, so the margin is ``max(floor, k * cv)``: a win smaller than the machine's run-to-run
    noise is not claimed. None (no doctor) gives a conservative 5%.
    """
    if cv is None or not math.isfinite(cv):
        return max(floor, 0.05)
    if cv < 0:
        raise ValueError(f"`cv >= 0` must hold, but got cv={cv}.")
    return max(floor, k * float(cv))


def accept(ci_low: float, noise_margin: float) -> bool:
    """True when the CI's lower bound clears ``1 + noise_margin``."""
    return bool(math.isfinite(ci_low) and ci_low > 1.0 + noise_margin)


__all__ = [
    "MedianInterval",
    "SpeedupEstimate",
    "accept",
    "coefficient_of_variation",
    "median_interval",
    "noise_margin",
    "order_statistic_coverage",
    "paired_ratios",
    "pairs_for_confidence",
    "speedup_ci",
]
