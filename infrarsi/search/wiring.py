"""The parts an ``Optimizer`` wires together, built in one place (``wire``).

The bank transfer inside the models (when a bank and a prior are given), the model inputs
(``PriorFeatures``), the candidate pool each ask scores, the models fitted on the history
(``ModelSet``) and the picker of each phase (``Pickers``), in the order they depend on each
other. The optimizer holds them; this module only builds them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from infrarsi.errors import UserInputError
from infrarsi.search.candidates import CandidatePool
from infrarsi.search.encoding import Encoder, InputColumns
from infrarsi.search.modelset import ModelSet
from infrarsi.search.pickers import Pickers
from infrarsi.search.priors.features import PriorFeatures
from infrarsi.search.priors.mean import PriorMean
from infrarsi.search.settings import OptimizerSettings
from infrarsi.search.space import SearchSpace
from infrarsi.search.transfer import TransferModel, TransferPrior


@dataclass
class Parts:
    """The collaborators of one optimizer."""

    transfer: TransferModel | None
    """The bank transfer inside the models, or None (no bank, no prior, or switched off)."""
    pool: CandidatePool
    """The configs each ask scores."""
    models: ModelSet
    """The models fitted on the history."""
    pickers: Pickers
    """The picker of each phase of the schedule."""


def check_capacity(memory_capacity: Any) -> float:
    """``memory_capacity`` as float bytes per device; ``UserInputError`` unless finite and > 0."""
    if not (
        isinstance(memory_capacity, (int, float))
        and math.isfinite(memory_capacity)
        and memory_capacity > 0
    ):
        raise UserInputError(
            f"Optimizer: memory_capacity: rule: must be bytes per device > 0; got {memory_capacity!r}."
        )
    return float(memory_capacity)


def wire(
    space: SearchSpace,
    encoder: Encoder,
    settings: OptimizerSettings,
    *,
    prior: PriorMean | None,
    transfer: TransferPrior | None,
    memory_capacity: float,
    baseline: Mapping[str, Any] | None,
    rng: np.random.Generator,
    seed: int,
) -> Parts:
    """Build the parts of an optimizer (see the module docstring)."""
    model: TransferModel | None = None
    if transfer is not None and transfer.sources and prior is not None and settings.transfer:
        model = TransferModel(transfer, encoder, prior, settings)
    features = PriorFeatures(space, encoder, prior, memory_capacity, settings, transfer=model)
    pool = CandidatePool(space, features, baseline, settings)
    models = ModelSet(
        features,
        InputColumns(encoder.dim, prior is not None),
        memory_capacity,
        settings,
        *encoder.memory_features(),
        speed=encoder.speed_features(),
        pairs=encoder.groups(),
    )
    pickers = Pickers(space, settings, encoder, models, pool, rng, seed, memory_capacity, baseline)
    return Parts(transfer=model, pool=pool, models=models, pickers=pickers)
