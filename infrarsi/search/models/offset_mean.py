"""``OffsetMean``: a GP prior mean plus a known per-point offset stored in an extra input column.

With an analytic prior (``infrarsi.search.priors.mean``) the inputs carry two extra columns after the
``d`` real features: the fitted prior's log step time and its log(peak / capacity) at that config
(one input tensor serves both models, as ``ModelListGP`` needs). Kernels ignore them
(``active_dims``); this mean adds one of them to an inner mean over the real features. For a model
with a ``Standardize`` outcome transform the offset
is standardised with the transform's location and scale (``set_standardization``), so predictions
in original units are ``offset + inner + GP residual``.
"""

from __future__ import annotations

import torch
from gpytorch.means import Mean


class OffsetMean(Mean):
    """``inner(x[..., :d]) + (x[..., column] - loc) / scale``."""

    def __init__(self, inner: Mean, d: int, column: int) -> None:
        super().__init__()
        self.inner = inner
        self.d = int(d)
        self.column = int(column)
        self.register_buffer("loc", torch.zeros((), dtype=torch.float64))
        self.register_buffer("scale", torch.ones((), dtype=torch.float64))

    def set_standardization(self, loc: torch.Tensor | float, scale: torch.Tensor | float) -> None:
        """Use the outcome transform's mean and sd (call after the model is built)."""
        self.loc = torch.as_tensor(loc, dtype=torch.float64).reshape(())
        self.scale = torch.as_tensor(scale, dtype=torch.float64).reshape(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x[..., : self.d]) + (x[..., self.column] - self.loc) / self.scale
