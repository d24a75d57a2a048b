"""Feasibility against non-OOM failures (failed, timeout, nan, invariant_violation).

A Bayesian logistic regression on one-hot (knob, value) indicators, fitted by MAP (Newton steps):
``logit P(fail) = b + sum_k w[k, value_k]`` with priors ``b ~ N(logit 0.05, 1.5^2)`` and
``w ~ N(0, 2^2)`` (``OptimizerSettings.feasibility_*``). Because all values of a config share the
blame, a culprit value (``dtype=bf16`` breaking the loss tolerance) takes it, and the values it
shares with successful configs are explained away. OOMs count as runs that did not fail this way
(the memory model owns them).
Invariant violations and NaNs weigh more than crashes and timeouts, which are often transient.
Exact failed configs are excluded by the optimizer regardless of this model.

The logistic model spreads the blame of a first failure over every value of the config (after one
``bf16`` invariant violation it still gave other ``bf16`` configs P(ok) = 0.95 on the demo). So
``p_ok`` is also capped by a *culprit* model, the deterministic-culprit reading of the same data:
a value seen in a run that completed is exonerated; each failure's weight is shared by its values that
were never seen succeeding (a failure whose values were all seen succeeding is taken as transient
and blames nothing); a value's blame is ``shares / (shares + culprit_prior)`` and
``P(ok) = prod(1 - blame)`` over the config's values. As successes exonerate the bystanders, the
blame concentrates on the culprit. Failure weights per status and the culprit pseudo-count are
``OptimizerSettings.failure_weight`` and ``culprit_prior``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from infrarsi.search.settings import DEFAULT_SETTINGS, OptimizerSettings


@dataclass
class FeasibilityModel:
    """Weighted runs and failures, and the fitted logistic model."""

    settings: OptimizerSettings = DEFAULT_SETTINGS
    """Priors of the logistic model and the culprit pseudo-count (``feasibility_*``, ``culprit_prior``)."""
    rows: list[tuple[dict[str, str], float, float]] = field(default_factory=list)
    """(knob -> repr(value), failure weight, success weight) per told trial."""
    exonerated: set[str] = field(default_factory=set)
    """``"knob=repr(value)"`` of every value seen in a run that completed (status ok)."""
    _coef: dict[str, float] | None = field(default=None, repr=False)
    _bias: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        self._bias = self._prior_bias_mean()

    def _prior_bias_mean(self) -> float:
        """The intercept's prior mean: the logit of the base failure rate."""
        rate = self.settings.feasibility_base_failure_rate
        return math.log(rate / (1.0 - rate))

    @property
    def n_fail(self) -> float:
        """Total failure weight recorded."""
        return sum(r[1] for r in self.rows)

    def clear(self) -> None:
        """Forget everything."""
        self.rows.clear()
        self.exonerated.clear()
        self._coef = None

    def add(
        self,
        config: Mapping[str, Any],
        failed: bool,
        weight: float = 1.0,
        completed: bool | None = None,
    ) -> None:
        """Record one trial of ``config`` (``weight``: how many failures one counts for;
        ``completed``: it ran to the end, default ``not failed``; an OOM did not fail this way but
        did not complete, so it exonerates no value in the culprit model)."""
        row = {k: repr(v) for k, v in config.items()}
        self.rows.append((row, weight if failed else 0.0, 0.0 if failed else 1.0))
        if (not failed) if completed is None else completed:
            self.exonerated.update(f"{k}={v}" for k, v in row.items())
        self._coef = None

    def _fit(self) -> None:
        names = sorted({f"{k}={v}" for r in self.rows for k, v in r[0].items()})
        col = {n: i for i, n in enumerate(names)}
        d = len(names) + 1
        X = np.zeros((len(self.rows), d))
        X[:, 0] = 1.0
        for i, (cfg, _, _) in enumerate(self.rows):
            for k, v in cfg.items():
                X[i, 1 + col[f"{k}={v}"]] = 1.0
        fail = np.array([r[1] for r in self.rows])
        ok = np.array([r[2] for r in self.rows])
        prec = np.full(d, 1.0 / self.settings.feasibility_weight_sd**2)
        prec[0] = 1.0 / self.settings.feasibility_bias_sd**2
        mu0 = np.zeros(d)
        mu0[0] = self._prior_bias_mean()
        beta = mu0.copy()

        def log_post(b: np.ndarray) -> float:
            z = X @ b
            return float(
                -(fail * np.logaddexp(0, -z)).sum()
                - (ok * np.logaddexp(0, z)).sum()
                - 0.5 * (prec * (b - mu0) ** 2).sum()
            )

        current = log_post(beta)
        for _ in range(50):  # damped Newton on the weighted binomial log posterior
            p = 1.0 / (1.0 + np.exp(-(X @ beta)))
            grad = X.T @ (fail * (1 - p) - ok * p) - prec * (beta - mu0)
            H = (X * ((fail + ok) * p * (1 - p))[:, None]).T @ X + np.diag(prec)
            step = np.linalg.solve(H, grad)
            t = 1.0
            while t > 1e-4:
                cand = log_post(beta + t * step)
                if cand >= current:
                    break
                t *= 0.5
            beta, current = beta + t * step, max(cand, current)
            if np.abs(t * step).max() < 1e-7:
                break
        self._bias = float(beta[0])
        self._coef = {n: float(beta[1 + i]) for i, n in enumerate(names)}

    def p_ok(self, configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """``(n,)`` probability that each config runs without a non-OOM failure."""
        if self.n_fail == 0:
            return np.ones(len(configs))
        if self._coef is None:
            self._fit()
        coef = self._coef or {}
        base = 1.0 / (
            1.0 + math.exp(-self._prior_bias_mean())
        )  # an untouched config is not penalised
        blame = self.blame()
        n = len(configs)
        names = list(configs[0]) if n else []
        if any(list(c) != names for c in configs):  # mixed key orders: one config at a time
            return np.array([float(self.p_ok([c])[0]) for c in configs])
        # logit = bias + sum of the values' weights, cap = product of (1 - blame) over the values:
        # a knob at a time over every config (tens of thousands per ask)
        z_sum, cap = np.zeros(n), np.ones(n)
        for k in names:
            codes, reprs = _value_codes(configs, k)
            z_sum += np.array([coef.get(f"{k}={r}", 0.0) for r in reprs])[codes]
            cap *= np.array([1.0 - blame.get(f"{k}={r}", 0.0) for r in reprs])[codes]
        p_logistic = np.minimum(
            1.0, (1.0 - 1.0 / (1.0 + np.exp(-(self._bias + z_sum)))) / (1.0 - base)
        )
        return np.minimum(p_logistic, cap)

    def blame(self) -> dict[str, float]:
        """Culprit model (module docstring): ``"knob=repr(value)"`` -> blame in [0, 1)."""
        seen_ok = self.exonerated
        shares: dict[str, float] = {}
        for cfg, fail, _ in self.rows:
            if fail <= 0:
                continue
            suspects = [f"{k}={v}" for k, v in cfg.items() if f"{k}={v}" not in seen_ok]
            for name in suspects:
                shares[name] = shares.get(name, 0.0) + fail / len(suspects)
        prior = self.settings.culprit_prior
        return {n: s / (s + prior) for n, s in shares.items()}


def _value_codes(configs: Sequence[Mapping[str, Any]], knob: str) -> tuple[np.ndarray, list[str]]:
    """``(n,)`` index of each config's ``knob`` value into the returned list of distinct value
    ``repr``s (values keyed with their type: ``True`` and ``1`` stay apart)."""
    table: dict[tuple[type, Any], int] = {}
    reprs: list[str] = []
    codes = np.empty(len(configs), dtype=np.int64)
    for i, c in enumerate(configs):
        v = c[knob]
        j = table.get((type(v), v))
        if j is None:
            j = table[(type(v), v)] = len(reprs)
            reprs.append(repr(v))
        codes[i] = j
    return codes, reprs
