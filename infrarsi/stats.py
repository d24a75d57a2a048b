"""Verify statistics: paired-ratio speedup with a seeded bootstrap CI, and the noise margin.

Verify measures baseline and candidate interleaved (A B A B ...), so drift in the machine hits
both alike. Each pair gives a ratio ``baseline_step_time / candidate_step_time`` (> 1: the
candidate is faster); the speedup is the median of those ratios and its confidence interval a
percentile bootstrap over pairs. A candidate is accepted only when the CI's lower bound clears
``1 + noise_margin``, where the margin comes from the doctor's run-to-run coefficient of variation::

    est = speedup_ci(base_times, cand_times, seed=0)
    margin = noise_margin(doctor["step_time_cv"])
    accepted = accept(est.ci_low, margin)
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
        return {"speedup": self.speedup, "ci_low": self.ci_low, "ci_high": self.ci_high,
                "n_pairs": self.n_pairs, "confidence": self.confidence, "ratios": self.ratios}


def paired_ratios(baseline_s: Sequence[float], candidate_s: Sequence[float]) -> np.ndarray:
    """``baseline_s[i] / candidate_s[i]`` for each pair. Shapes: both ``(n,)``, n >= 1, all > 0."""
    b = np.asarray(baseline_s, dtype=float)
    c = np.asarray(candidate_s, dtype=float)
    if b.shape != c.shape or b.ndim != 1 or b.size == 0:
        raise ValueError(f"paired step times must be two equal-length non-empty 1-D sequences, "
                         f"but got shapes {b.shape} and {c.shape}.")
    if not (np.all(np.isfinite(b)) and np.all(np.isfinite(c)) and np.all(b > 0) and np.all(c > 0)):
        raise ValueError(f"step times must be finite and > 0, but got baseline={b.tolist()} "
                         f"candidate={c.tolist()}.")
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


__all__ = ["SpeedupEstimate", "accept", "coefficient_of_variation", "noise_margin",
           "paired_ratios", "speedup_ci"]
