"""``PairKernel``: a kernel over pairs of knob values, room for interactions the analytic prior lacks.

An analytic prior ranks a whole region last when two knobs interact in a way its formulas do not
model (``benchmarks/adversarial.py``, ``adv_zero3_overlap``: ZeRO-3 with large buckets 30% faster
than the formula). The smooth kernel's amplitude is learned from the residuals of the configs
measured so far; where the prior is right on all of them it shrinks, so the posterior stays
confident about every region, measured or not, and the search never leaves the prior's basin.

This kernel keeps a fixed amount of doubt about each pair of knob values that no measured config
has held together:

    k(x, x') = (1 / P) * sum over knob pairs (i, j) of [x_i == x'_i] * [x_j == x'_j]

with ``P`` the number of knob pairs, scaled to ``OptimizerSettings.interaction_sd`` squared (log
seconds). A config all of whose value pairs were measured together somewhere keeps little of that
variance; one that holds several never-measured pairs keeps up to ``interaction_sd``. It is also
how one measurement moves its region: a config sharing the value pair (ZeRO-3, 5e8) with a config
measured 30% under the prior shares its share of the term, and is predicted faster too. It is a
sum of products of equality kernels, so it is positive semidefinite; with ``m`` knobs equal
between two configs the sum is ``m * (m - 1) / 2``, computed from the count alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from gpytorch.kernels import Kernel


class PairKernel(Kernel):
    """Equality of knob-value pairs between two configs, averaged over the pairs of knobs.

    ``groups``: per knob, the ``(start, width)`` of its feature columns (``Encoder.groups``); two
    configs hold the same value of a knob when all its columns are equal. With one knob it is
    the equality of that knob's value."""

    has_lengthscale = False

    def __init__(self, groups: Sequence[tuple[int, int]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.groups = [(int(s), int(w)) for s, w in groups]
        n = len(self.groups)
        self.n_pairs = max(n * (n - 1) // 2, 1)

    def _matches(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        """``(..., n, m)``: how many knobs hold the same value in each pair of rows."""
        out = torch.zeros(*x1.shape[:-1], x2.shape[-2], dtype=x1.dtype, device=x1.device)
        for s, w in self.groups:
            a = x1[..., :, None, s : s + w]
            b = x2[..., None, :, s : s + w]
            out = out + ((a - b).abs() < 1e-9).all(-1).to(x1.dtype)
        return out

    def forward(
        self, x1: torch.Tensor, x2: torch.Tensor, diag: bool = False, **params: Any
    ) -> torch.Tensor:
        if diag:  # a config shares every pair with itself
            return torch.ones(x1.shape[:-1], dtype=x1.dtype, device=x1.device)
        m = self._matches(x1, x2)
        if len(self.groups) < 2:
            return m
        return m * (m - 1.0) / (2.0 * self.n_pairs)
