"""The initial design: the baseline first, then space-filling over valid configs.

Each design point maximises a coverage score over the configs already told or pending: the
*novelty* of its values (per knob, ``1 / (1 + times the value was seen)``, averaged over knobs;
this balances every knob's values the way a Latin hypercube does) plus half its smallest distance
to them in the unit-cube features (normalised by the cube's diagonal; the half is
``OptimizerSettings.design_distance_weight``), with random tie-breaks.
Pure maximin would send every design point to a corner of the cube (the largest micro-batch, every
bool flipped from the baseline), so the models would never see the middle values where the
memory cliff usually lies; measured on the surrogate problems, that design left ``flash_attention``
off and ``micro_batch_size`` at 32 in every design point of a traced run; balancing them
made no measurable difference to best-found at 12 or 24 trials over 16 seeds, but it keeps the
design away from an all-corner sample. The design never climbs greedily from
the baseline. Once a memory model exists, the scores are weighted by P(fit) x P(no failure), so
the design spends few trials on OOMs while it still spreads over the space.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from infrarsi.search.settings import DEFAULT_SETTINGS

if TYPE_CHECKING:
    from infrarsi.search.settings import OptimizerSettings
    from infrarsi.search.transfer import TransferModel


def default_n_init(n_features: int) -> int:
    """Design size before the models take over: baseline + a few spread points."""
    return int(min(8, max(4, 2 + n_features // 4)))


def size_now(n_init: int, transfer: TransferModel | None, settings: OptimizerSettings) -> int:
    """The design's size now: ``settings.transfer_n_init`` (at most ``n_init``) while a bank
    transfer holds weight, else ``n_init``."""
    if transfer is not None and transfer.active and settings.transfer_n_init is not None:
        return min(n_init, settings.transfer_n_init)
    return n_init


def value_novelty(
    candidates: Sequence[Mapping[str, Any]], seen: Sequence[Mapping[str, Any]], names: Sequence[str]
) -> np.ndarray:
    """``(k,)``: mean over knobs of ``1 / (1 + count of the candidate's value among seen configs)``."""
    counts = Counter((n, _hashable(c.get(n))) for c in seen for n in names)
    if not names:
        return np.ones(len(candidates))
    return np.array(
        [
            sum(1.0 / (1 + counts[(n, _hashable(c.get(n)))]) for n in names) / len(names)
            for c in candidates
        ]
    )


def coverage_pick(
    configs: Sequence[Mapping[str, Any]],
    candidates: torch.Tensor,
    seen: Sequence[Mapping[str, Any]],
    existing: torch.Tensor,
    names: Sequence[str],
    rng: np.random.Generator,
    weights: np.ndarray | None = None,
    distance_weight: float = DEFAULT_SETTINGS.design_distance_weight,
) -> int:
    """Index of the config (of ``configs``, features ``candidates`` ``(k, d)``) with the best
    coverage score against ``seen`` (features ``existing`` ``(m, d)``), see the module docstring;
    ``distance_weight`` weighs the normalised maximin distance next to the value novelty."""
    k, d = candidates.shape
    if existing.shape[0] == 0:
        dist = np.ones(k)
    else:
        dist = torch.cdist(candidates, existing).min(dim=1).values.numpy() / max(d, 1) ** 0.5
    score = value_novelty(configs, seen, names) + distance_weight * dist
    if weights is not None:
        score = score * weights
    return int(np.argmax(score + rng.random(k) * 1e-6))


def _hashable(v: Any) -> Any:
    return (type(v).__name__, v)


def maximin_pick(
    candidates: torch.Tensor,
    existing: torch.Tensor,
    rng: np.random.Generator,
    weights: np.ndarray | None = None,
) -> int:
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
