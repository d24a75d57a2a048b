"""The initial design: the baseline first, then space-filling over valid configs.

Each design point maximises its smallest distance (in the unit-cube features) to every config
already told or pending (greedy maximin), with random tie-breaks. It never climbs greedily from
the baseline. Once a memory model exists, candidates it predicts will not fit are left out, so the
design spends few trials on OOMs while it still spreads over the space.
"""

from __future__ import annotations

import numpy as np
import torch

DESIGN_POOL = 4000
"""Candidates considered per design pick (a random subset of the allowed configs)."""


def default_n_init(n_features: int) -> int:
    """Design size before the models take over: baseline + a few spread points."""
    return int(min(8, max(4, 2 + n_features // 4)))


def maximin_pick(candidates: torch.Tensor, existing: torch.Tensor, rng: np.random.Generator,
                 weights: np.ndarray | None = None) -> int:
    """Index of the candidate (``(k, d)``) farthest from ``existing`` (``(m, d)``).

    ``weights`` (``(k,)``, in [0, 1]) multiply the distances (e.g. P(fit)), so unlikely candidates lose.
    """
    k = candidates.shape[0]
    if existing.shape[0] == 0:
        dist = np.ones(k)
    else:
        dist = torch.cdist(candidates, existing).min(dim=1).values.numpy()
    if weights is not None:
        dist = dist * weights
    jitter = rng.random(k) * 1e-6
    return int(np.argmax(dist + jitter))
