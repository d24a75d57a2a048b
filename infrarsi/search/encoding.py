"""Configs <-> feature tensors for the GP models (every feature in [0, 1], float64).

Per knob:
- ``bool``: one 0/1 feature;
- numeric ``int``/``float`` (and numeric ``choice``): one ordinal feature, on a log scale when the
  knob says ``log`` or its positive values span a factor of 8 or more;
- ``choice`` with a memory or speed tag (its values are ordered by memory or speed): one ordinal
  feature (the index);
- other ``choice``: one-hot (a single feature when there are two values).

An inactive knob is encoded at its default, which is the value it really holds in the trial; its
activity is already visible through the features of the knobs its ``when`` reads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from infrarsi.search.knob import Knob
from infrarsi.search.space import SearchSpace


@dataclass(frozen=True)
class _Block:
    knob: Knob
    kind: str  # "ordinal-value" | "ordinal-index" | "onehot" | "binary"
    width: int
    log: bool


def _block(k: Knob) -> _Block:
    if k.type == "bool":
        return _Block(k, "binary", 1, False)
    if k.numeric:
        positive = all(v > 0 for v in k.values)
        log = k.log or (positive and max(k.values) / min(k.values) >= 8)
        return _Block(k, "ordinal-value", 1, log)
    if k.memory != "neutral" or k.speed != "neutral":
        return _Block(k, "ordinal-index", 1, False)
    if len(k.values) == 2:
        return _Block(k, "binary", 1, False)
    return _Block(k, "onehot", len(k.values), False)


@dataclass(frozen=True)
class InputColumns:
    """Where each part of a model input row sits: the encoded features first, then, with an
    analytic prior, the prior's log step time and its log(peak / capacity) (``priors.features``)."""

    n_features: int
    """Number of encoded features ``d``: columns ``0 .. d-1``."""
    with_prior: bool
    """Whether the rows carry the prior's two columns after the features."""

    @property
    def prior_time(self) -> int:
        """Column of the prior's log step time (only with a prior)."""
        return self.n_features

    @property
    def prior_memory(self) -> int:
        """Column of the prior's log(peak / capacity) (only with a prior)."""
        return self.n_features + 1

    def time_offset(self) -> tuple[int, int] | None:
        """``(d, column)`` of the step-time model's known offset (``models.time_gp``), or None."""
        return (self.n_features, self.prior_time) if self.with_prior else None

    def memory_offset(self) -> tuple[int, int] | None:
        """``(d, column)`` of the memory model's known offset (``models.tobit``), or None."""
        return (self.n_features, self.prior_memory) if self.with_prior else None


class Encoder:
    """Maps configs of a ``SearchSpace`` to ``(n, d)`` float64 tensors in the unit cube."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self.blocks = [_block(k) for k in space.knobs]
        self.dim = sum(b.width for b in self.blocks)
        """Number of features ``d``."""
        self._cache: list[dict[str, list[float]]] = [{} for _ in self.blocks]

    def groups(self) -> tuple[tuple[int, int], ...]:
        """Per knob, in space order, the ``(start, width)`` of its feature columns."""
        out, col = [], 0
        for b in self.blocks:
            out.append((col, b.width))
            col += b.width
        return tuple(out)

    def memory_features(self) -> tuple[list[int], list[float]]:
        """Feature indices of the single-column memory-tagged knobs, and their signs (+1 hungry, -1 saver)."""
        idx, signs, col = [], [], 0
        for b in self.blocks:
            if b.knob.memory != "neutral" and b.width == 1:
                idx.append(col)
                signs.append(1.0 if b.knob.memory == "hungry" else -1.0)
            col += b.width
        return idx, signs

    def speed_features(self) -> tuple[list[int], list[float]]:
        """Feature indices of the speed-tagged knobs, and the sign of each one's effect on log step
        time (-1 ``faster``: the feature grows towards the faster values; +1 ``slower``)."""
        idx, signs, col = [], [], 0
        for b in self.blocks:
            if b.knob.speed != "neutral" and b.width == 1:
                idx.append(col)
                signs.append(-1.0 if b.knob.speed == "faster" else 1.0)
            col += b.width
        return idx, signs

    def _features(self, i: int, value: Any) -> list[float]:
        key = f"{type(value).__name__}:{value!r}"
        hit = self._cache[i].get(key)
        if hit is not None:
            return hit
        b = self.blocks[i]
        k = b.knob
        if b.kind == "binary":
            out = [float(value is True or (k.type != "bool" and k.index(value) == 1))]
        elif b.kind == "ordinal-value":
            lo, hi = float(min(k.values)), float(max(k.values))
            if k.is_range:
                lo, hi = float(k.lo), float(k.hi)  # type: ignore[arg-type]
            x = float(value)
            if b.log:
                lo, hi, x = math.log(lo), math.log(hi), math.log(max(x, 1e-300))
            out = [0.0 if hi == lo else min(1.0, max(0.0, (x - lo) / (hi - lo)))]
        elif b.kind == "ordinal-index":
            out = [k.index(value) / max(1, len(k.values) - 1)]
        else:
            out = [0.0] * b.width
            out[k.index(value)] = 1.0
        self._cache[i][key] = out
        return out

    def encode(self, configs: Sequence[Mapping[str, Any]]) -> torch.Tensor:
        """``(n, d)`` features of ``n`` full configs."""
        rows = [
            [f for i, b in enumerate(self.blocks) for f in self._features(i, c[b.knob.name])]
            for c in configs
        ]
        return torch.tensor(rows, dtype=torch.float64).reshape(len(rows), self.dim)

    def encode_values(self, rows: Sequence[Sequence[Any]]) -> torch.Tensor:
        """``(n, d)`` features of configs given as value tuples in knob order."""
        out = [[f for i, v in enumerate(row) for f in self._features(i, v)] for row in rows]
        return torch.tensor(out, dtype=torch.float64).reshape(len(out), self.dim)
