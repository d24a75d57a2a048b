"""``MemoryCalibration``: the memory model's misses on configs it had not seen, as an extra sd.

How far the memory model's predictions of new configs have been off sets an extra sd on its
predictions.

The censored memory GP is fitted in-sample. With few distinct configs and no analytic prior, its
monotone linear mean interpolates the measured peaks exactly, the kernel's scale collapses and the
fitted noise falls to ~0.5%: the model then calls configs a few knob changes away "fits, P 1.0"
that run out of memory. Measured on the search benchmark's saved runs (16 seeds, 24 trials,
`benchmarks/search_efficiency.py`): without the prior 20-22% of the model's picks with
P(fit) > 0.95 ran out of memory, against 0.3% predicted (with the prior: 0.1% against 0.06%).

The check is prequential: before the memory model is refitted on new trials, the model fitted
without them predicts the configs it had not seen (``ModelSet.fit``; a replicate of a measured
config is not a check). Each check keeps the measured log(peak / capacity) (an OOM: the lower bound
0, censored), the predicted mean and the predicted sd (noise included). ``extra_sd()`` is the sd
``c >= 0`` that, added in quadrature to each prediction's sd, best explains the last ``window``
checks: the maximum over a grid of ``c`` (0 to ``MAX_EXTRA_SD``) of

    sum_i log N(y_i | m_i, s_i^2 + c^2)  (measured)  +  sum_i log Phi((m_i - y_i) / sqrt(s_i^2 + c^2))  (OOM)
    - c^2 / (2 * prior_sd^2)

The optimizer adds ``c^2`` to the memory model's variance wherever it scores P(fit)
(``ModelSet._memory_predictor``). A calibrated model keeps ``c`` near 0; one whose new configs land
0.3-1.0 log away from its predictions (as above: prequential errors of 0.1-1.0 log, RMS 0.42, where
the model claimed sd 0.01-0.1) widens until P(fit) says so. The widening is additive, not a factor:
a collapsed sd of 0.005 times any sane factor stays far too small. It only widens: a model that is
too cautious stays as it is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass
from typing import Any

import numpy as np
from scipy.special import log_ndtr

MAX_EXTRA_SD = 1.5
"""The largest extra sd considered (log bytes: a factor of 4.5 in peak memory)."""
_GRID = np.concatenate([[0.0], np.exp(np.linspace(math.log(0.005), math.log(MAX_EXTRA_SD), 58))])


@dataclass(frozen=True)
class MemoryCheck:
    """One trial as the memory model predicted it before it learned from it."""

    log_rel_peak: float
    """Measured log(peak / capacity); for an OOM the lower bound (0)."""
    censored: bool
    """True for an OOM (the true peak is at least ``log_rel_peak``)."""
    mean: float
    """The model's predicted log(peak / capacity)."""
    sd: float
    """The model's predicted sd of a measurement (latent sd and noise), log bytes."""


class MemoryCalibration:
    """The memory model's prequential checks and the extra sd they call for (module docstring)."""

    def __init__(self, window: int, prior_sd: float) -> None:
        self.window = int(window)
        """Number of most recent checks ``extra_sd()`` reads (0: it is always 0)."""
        self.prior_sd = float(prior_sd)
        """Sd of the half-normal prior on the extra sd, log bytes."""
        self.checks: list[MemoryCheck] = []
        """Every check, oldest first."""
        self.checked_rows = 0
        """Memory rows (``ModelSet.memory_rows``) already checked or fitted before a check was
        possible: the next check starts after them."""

    def take_new(self, keys: Sequence[str]) -> list[int]:
        """Indices of the rows (given by their configs' keys, in ``memory_rows`` order) past
        ``checked_rows`` whose config no earlier row holds (replicates are not checks); marks every
        row as checked."""
        start, self.checked_rows = self.checked_rows, len(keys)
        seen = set(keys[:start])
        new: list[int] = []
        for i in range(start, len(keys)):
            if keys[i] not in seen:
                seen.add(keys[i])
                new.append(i)
        return new

    def record(
        self,
        ys: Sequence[float],
        censored: Sequence[bool],
        means: Sequence[float],
        sds: Sequence[float],
    ) -> None:
        """Add one check per new row."""
        for y, c, m, s in zip(ys, censored, means, sds, strict=True):
            if math.isfinite(m) and math.isfinite(s) and s > 0:
                self.checks.append(MemoryCheck(float(y), bool(c), float(m), float(s)))

    def extra_sd(self) -> float:
        """The sd ``c >= 0`` (log bytes) added in quadrature to the memory model's (module docstring)."""
        recent = self.checks[-self.window :] if self.window > 0 else []
        if not recent:
            return 0.0
        y = np.array([c.log_rel_peak for c in recent])
        cens = np.array([c.censored for c in recent])
        m = np.array([c.mean for c in recent])
        s = np.array([c.sd for c in recent])
        sd = np.sqrt(s[None, :] ** 2 + _GRID[:, None] ** 2)  # (grid, checks)
        z = (y[None, :] - m[None, :]) / sd
        ll = np.where(
            cens[None, :],
            log_ndtr(-z),  # P(true peak >= the bound)
            -0.5 * z**2 - np.log(sd),
        ).sum(axis=1)
        ll -= _GRID**2 / (2 * self.prior_sd**2)
        return float(_GRID[int(np.argmax(ll))])

    def to_dict(self) -> dict[str, Any]:
        """JSON-able state (``load_dict`` inverts it)."""
        return {
            "checks": [list(astuple(c)) for c in self.checks],
            "checked_rows": self.checked_rows,
        }

    def load_dict(self, raw: Mapping[str, Any] | None) -> None:
        """Restore ``to_dict``'s state (None or missing keys: no checks, as a fresh optimizer)."""
        raw = raw or {}
        self.checks = [
            MemoryCheck(float(y), bool(c), float(m), float(s))
            for y, c, m, s in raw.get("checks", [])
        ]
        self.checked_rows = int(raw.get("checked_rows", 0))
