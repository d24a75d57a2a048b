"""``BestChoice``: the config ``Optimizer.best()`` recommends, from the posterior and the measurements, and why.

Two picks among the configs told ok (slow stragglers the step-time model trimmed are left out):

- the *posterior pick*: the lowest posterior-mean step time (what ``best()`` returned before);
- the *measured pick*: the lowest median measured step time (ties: more measurements, then the
  earlier config).

When they differ, the posterior may be right (the measured pick had one lucky draw and its
neighbours say it is slower) or wrong (its smooth part pulled a config measured once toward its
neighbours, behind one measured three times). The rule: take the measured pick unless the
posterior is confident it is slower, i.e. unless

    P(f(measured pick) > f(posterior pick)) >= confidence   (``OptimizerSettings.best_confidence``)

under the joint posterior of the two latent log step times (their correlation counted).
Replicates shrink a config's posterior sd: a config measured once keeps a wide one, so the
posterior is rarely confident that it is slower than a config measured three times, and the
measured median decides. A confidence of 0.5 or less keeps the
posterior pick whenever they differ (the older rule); without a step-time model (fewer than two
ok trials) the measured pick is the choice. ``verify`` settles a disagreement with paired runs: its
candidates include the measured pick besides the posterior's (``stages.verify.select_candidates``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

BestReason = Literal[
    "posterior_and_measured_agree",
    "measured_faster_posterior_uncertain",
    "posterior_confident_measured_slower",
    "measured_only",
]
"""Why a ``BestChoice`` named its config:

- ``posterior_and_measured_agree``: the lowest posterior mean and the lowest measured median are
  the same config;
- ``measured_faster_posterior_uncertain``: they differ, and the posterior is not confident
  (``< confidence``) that the measured-fastest config is slower: the measured one is chosen;
- ``posterior_confident_measured_slower``: they differ, and the posterior is confident that the
  measured-fastest config is slower (a lucky draw): the posterior's one is chosen;
- ``measured_only``: no step-time model yet (fewer than two ok trials): the measured one."""

BEST_REASONS: tuple[BestReason, ...] = (
    "posterior_and_measured_agree",
    "measured_faster_posterior_uncertain",
    "posterior_confident_measured_slower",
    "measured_only",
)


@dataclass(frozen=True)
class Evidence:
    """What is known of one config told ok."""

    config: dict[str, Any]
    """The full config."""
    measured_median_s: float
    """Median of its trusted ok step times, seconds per optimizer step."""
    n_measured: int
    """How many trusted ok step times it has (trimmed stragglers left out)."""
    posterior_mean_s: float | None = None
    """exp of the posterior mean of its log step time, seconds (None without a step-time model)."""
    posterior_sd_log: float | None = None
    """Posterior sd of its latent log step time (None without a step-time model)."""


@dataclass(frozen=True)
class BestChoice:
    """The config to verify, with the evidence behind it and the reason it was chosen."""

    config: dict[str, Any]
    """The chosen config (what ``Optimizer.best()`` returns)."""
    reason: BestReason
    """Why it was chosen (``BestReason``)."""
    posterior_mean_s: float | None
    """exp of the posterior mean of its log step time, seconds (None without a step-time model)."""
    posterior_sd_log: float | None
    """Posterior sd of its latent log step time (None without a step-time model)."""
    measured_median_s: float
    """Median of its trusted ok step times, seconds."""
    n_measured: int
    """How many trusted ok step times it has."""
    alternative: Evidence | None = None
    """The other pick when the posterior and the measurements disagree (None when they agree or
    there is no model): the posterior's when the measured one was chosen, and the reverse."""
    p_measured_slower: float | None = None
    """Posterior probability that the measured-fastest config is truly slower than the posterior's
    pick (None when they agree or there is no model)."""
    confidence: float = 0.9
    """The probability ``p_measured_slower`` had to reach for the posterior's pick to win."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (``explain()`` under ``why``)."""
        out = asdict(self)
        out["why"] = self.explain()
        return out

    def explain(self) -> str:
        """One sentence a person can read: what was chosen and why."""
        here = _describe(self.measured_median_s, self.n_measured, self.posterior_mean_s)
        alt = self.alternative
        other = (
            ""
            if alt is None
            else _describe(alt.measured_median_s, alt.n_measured, alt.posterior_mean_s)
        )
        p = self.p_measured_slower
        if self.reason == "posterior_and_measured_agree":
            return f"fastest both measured and by the posterior mean ({here})"
        if self.reason == "measured_only":
            return f"fastest measured ({here}); no step-time model yet"
        if self.reason == "measured_faster_posterior_uncertain":
            return (
                f"fastest measured ({here}); the posterior prefers another config ({other}) but "
                f"gives only P={p:.2f} < {self.confidence:.2f} that this one is slower"
            )
        return (
            f"fastest by the posterior mean ({here}); the fastest measured config ({other}) is "
            f"slower with P={p:.2f} >= {self.confidence:.2f}"
        )


def _describe(median: float, n: int, mean: float | None) -> str:
    post = "" if mean is None else f", posterior {mean:.4g} s"
    return f"median {median:.4g} s over {n} trial{'s' if n != 1 else ''}{post}"


def evidence_by_config(
    keyed: Sequence[tuple[str, Mapping[str, Any], float]],
) -> list[Evidence]:
    """One ``Evidence`` (no posterior) per distinct key of ``(key, config, step_time_s)`` rows, in
    the order first seen: the median and count of its step times."""
    times: dict[str, list[float]] = {}
    configs: dict[str, dict[str, Any]] = {}
    for key, config, t in keyed:
        times.setdefault(key, []).append(float(t))
        configs.setdefault(key, dict(config))
    return [
        Evidence(config=configs[k], measured_median_s=float(np.median(v)), n_measured=len(v))
        for k, v in times.items()
    ]


def measured_pick(evidence: Sequence[Evidence]) -> int:
    """Index of the lowest measured median (ties: more measurements, then the earlier)."""
    return min(
        range(len(evidence)),
        key=lambda i: (evidence[i].measured_median_s, -evidence[i].n_measured, i),
    )


def choose(
    evidence: Sequence[Evidence],
    mean_log: np.ndarray | None,
    cov_log: np.ndarray | None,
    confidence: float,
) -> BestChoice:
    """The rule of this module over ``evidence`` (distinct configs, at least one).

    ``mean_log``: ``(n,)`` posterior means of the latent log step times; ``cov_log``: their
    ``(n, n)`` posterior covariance (both None without a step-time model)."""
    if not evidence:
        raise ValueError("choose: needs at least one config told ok")
    m = measured_pick(evidence)
    if mean_log is None or cov_log is None:
        return _record(evidence[m], "measured_only", None, None, confidence)
    mean_log = np.asarray(mean_log, dtype=float)
    cov_log = np.asarray(cov_log, dtype=float)
    p = int(np.argmin(mean_log))  # the first of equal means, as the posterior-mean rule had it
    if p == m:
        return _record(evidence[m], "posterior_and_measured_agree", None, None, confidence)
    d = float(mean_log[m] - mean_log[p])
    var = float(cov_log[m, m] + cov_log[p, p] - 2.0 * cov_log[m, p])
    if var > 1e-18:
        p_slower = 0.5 * math.erfc(-d / math.sqrt(2.0 * var))
    else:
        p_slower = 1.0 if d > 0 else 0.5
    if p_slower >= confidence:
        return _record(
            evidence[p], "posterior_confident_measured_slower", evidence[m], p_slower, confidence
        )
    return _record(
        evidence[m], "measured_faster_posterior_uncertain", evidence[p], p_slower, confidence
    )


def _record(
    e: Evidence,
    reason: BestReason,
    alternative: Evidence | None,
    p_slower: float | None,
    confidence: float,
) -> BestChoice:
    return BestChoice(
        config=dict(e.config),
        reason=reason,
        posterior_mean_s=e.posterior_mean_s,
        posterior_sd_log=e.posterior_sd_log,
        measured_median_s=e.measured_median_s,
        n_measured=e.n_measured,
        alternative=alternative,
        p_measured_slower=p_slower,
        confidence=confidence,
    )
