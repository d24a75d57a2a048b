"""The candidate pool of ``Optimizer`` (mixed into it): which configs an ask scores.

A space of up to ``CANDIDATE_CAP`` valid configs is scored whole, from features built once. A
larger one scores a random sample of half the cap per ask, plus anchors every sample holds: the
baseline (the design starts from it), the neighbours of the five fastest ok configs and the
fastest one's whole ``LOCAL_RADIUS`` neighbourhood (local steps search there). While the space
can still be enumerated (``space.ENUMERATION_LIMIT``) the sample is rows of the cached features;
beyond that it is drawn with ``SearchSpace.sample`` and encoded per ask.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from infrarsi.search.encoding import Encoder
from infrarsi.search.priors.mean import PriorMean
from infrarsi.search.space import SearchSpace

if TYPE_CHECKING:
    from infrarsi.search.optimizer import Observation

CANDIDATE_CAP = 20_000
"""Above this many valid configs, score a random subset of half this size plus the baseline, the
neighbours of the five fastest ok configs and the two-change neighbourhood of the fastest."""


LOCAL_RADIUS = 2
"""A local step scores only configs within this many knob changes of the incumbent."""


class CandidatePoolMixin:
    """Candidate-pool methods of ``Optimizer``."""

    space: SearchSpace
    encoder: Encoder
    prior: PriorMean | None
    baseline: dict[str, Any] | None
    rng: np.random.Generator
    candidate_cap: int
    _all: list[tuple[Any, ...]] | None
    _all_keys: list[str] | None
    _all_X: torch.Tensor | None
    _all_configs: list[dict[str, Any]] | None
    _all_index: dict[str, int] | None
    _all_terms: tuple[np.ndarray, np.ndarray] | None

    if TYPE_CHECKING:
        def _ok(self) -> list[Observation]: ...
        def _X(self, configs: Sequence[Mapping[str, Any]]) -> torch.Tensor: ...
        def _augment(self, X: torch.Tensor, T: np.ndarray, M: np.ndarray) -> torch.Tensor: ...
        def best(self) -> dict[str, Any] | None: ...

    def _candidates(self, exclude: set[str]) -> tuple[list[dict[str, Any]], torch.Tensor]:
        """Allowed candidate configs and their features: every valid config up to
        ``candidate_cap``, else a random half-cap sample plus the anchors (``_anchors``)."""
        if self._all is None:  # too many to enumerate: sampled configs, encoded per ask
            pool: dict[str, dict[str, Any]] = {}
            for c in self.space.sample(self.rng, self.candidate_cap // 2):
                pool.setdefault(self.space.key(c), c)
            for c in self._anchors():
                pool.setdefault(self.space.key(c), c)
            configs = [c for k, c in pool.items() if k not in exclude]
            return configs, self._X(configs)
        if self._all_X is None:  # built once: callers copy a config before changing it
            self._all_X = self.encoder.encode_values(self._all)
            self._all_configs = [self.space.as_config(v) for v in self._all]
            self._all_index = {k: i for i, k in enumerate(self._all_keys or [])}
        keys, index, all_configs = self._all_keys or [], self._all_index or {}, self._all_configs or []
        if len(self._all) <= self.candidate_cap:
            keep = [i for i, k in enumerate(keys) if k not in exclude]
        else:  # enumerated but too many to score: rows of the cached features, in insertion order
            order = dict.fromkeys(self.rng.choice(len(self._all), size=self.candidate_cap // 2, replace=False).tolist())
            for c in self._anchors():
                j = index.get(self.space.key(c))
                if j is not None:
                    order.setdefault(j)
            keep = [i for i in order if keys[i] not in exclude]
        configs = [all_configs[i] for i in keep]
        if self.prior is None:
            return configs, self._all_X[keep]
        if self._all_terms is None:
            self._all_terms = self.prior.terms(all_configs)
        T, M = self._all_terms
        return configs, self._augment(self._all_X[keep], T[keep], M[keep])

    def _anchors(self) -> Iterator[dict[str, Any]]:
        """Configs every sampled pool holds: the baseline (the design starts from it), the
        neighbours of the five fastest ok configs and the fastest one's whole ``LOCAL_RADIUS``
        neighbourhood (local steps)."""
        base = self.baseline if self.baseline is not None else self.space.default_config()
        if not self.space.violated(base):
            yield base
        ok = sorted(self._ok(), key=lambda o: o.outcome.step_time or math.inf)[:5]
        for rank, o in enumerate(ok):
            ring = [o.config]
            for _ in range(LOCAL_RADIUS if rank == 0 else 1):
                ring = [nb for c in ring for nb in self.space.neighbours(c)]
                yield from ring

    def _scores_every_config(self) -> bool:
        """Whether ``_candidates`` returns every allowed config (not a sample)."""
        return self._all is not None and len(self._all) <= self.candidate_cap

    def _near_incumbent(self, configs: list[dict[str, Any]]) -> np.ndarray:
        """``(n,)`` bool: within ``LOCAL_RADIUS`` knob changes of the posterior-best ok config."""
        best = self.best()
        if best is None:
            return np.zeros(len(configs), dtype=bool)
        names = self.space.names
        ref = [best[n] for n in names]
        return np.array([sum(c[n] != r or type(c[n]) is not type(r) for n, r in zip(names, ref, strict=True)) <= LOCAL_RADIUS
                         for c in configs], dtype=bool)
