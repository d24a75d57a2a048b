"""``CandidatePool``: which configs an ask scores, and their model inputs.

A space of up to ``candidate_cap`` valid configs is scored whole, from features built once. A
larger one scores a random sample of half the cap per ask, plus anchors every sample holds: the
baseline (the design starts from it), the neighbours of the five fastest ok configs and the
fastest one's whole ``local_radius`` neighbourhood (local steps search there). While the space
can still be enumerated (``OptimizerSettings.enumeration_limit``) the sample is rows of the cached
features; beyond that it is drawn with ``SearchSpace.sample`` and encoded per ask.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from infrarsi.search.outcome import Observation
from infrarsi.search.priors.features import PriorFeatures
from infrarsi.search.settings import OptimizerSettings
from infrarsi.search.space import SearchSpace


class CandidatePool:
    """The configs an ask scores (``candidates``), with the cached features of an enumerated space."""

    def __init__(
        self,
        space: SearchSpace,
        features: PriorFeatures,
        baseline: Mapping[str, Any] | None,
        settings: OptimizerSettings,
    ) -> None:
        self.space = space
        self.features = features
        """Builds the model inputs of sampled configs and the prior's columns of enumerated ones."""
        self.baseline = baseline
        """The optimizer's baseline (None: the space's default config)."""
        self.settings = settings
        """``candidate_cap``, ``local_radius`` and ``enumeration_limit``."""
        self.enumerated_values = space.enumerate_values(settings.enumeration_limit)
        """Every valid config as a value tuple in knob order (None: too many to enumerate)."""
        self.enumerated_keys = (
            None
            if self.enumerated_values is None
            else [json.dumps(list(v)) for v in self.enumerated_values]
        )
        """``SearchSpace.key`` of each enumerated config."""
        self._enumerated_features: torch.Tensor | None = None
        self._enumerated_configs: list[dict[str, Any]] = []
        self._row_of_key: dict[str, int] = {}
        self._enumerated_prior_terms: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def scores_every_config(self) -> bool:
        """Whether ``candidates`` returns every allowed config (not a sample)."""
        return (
            self.enumerated_values is not None
            and len(self.enumerated_values) <= self.settings.candidate_cap
        )

    def candidates(
        self, exclude: set[str], ok: Sequence[Observation], rng: np.random.Generator
    ) -> tuple[list[dict[str, Any]], torch.Tensor]:
        """Allowed candidate configs (keys not in ``exclude``) and their model inputs: every valid
        config up to ``candidate_cap``, else a random half-cap sample (drawn with ``rng``) plus the
        anchors of the ``ok`` observations (``anchors``)."""
        cap = self.settings.candidate_cap
        values = self.enumerated_values
        if values is None:  # too many to enumerate: sampled configs, encoded per ask
            pool: dict[str, dict[str, Any]] = {}
            for c in self.space.sample(rng, cap // 2):
                pool.setdefault(self.space.key(c), c)
            for c in self.anchors(ok):
                pool.setdefault(self.space.key(c), c)
            configs = [c for k, c in pool.items() if k not in exclude]
            return configs, self.features.inputs(configs)
        keys = self.enumerated_keys or []
        if (
            self._enumerated_features is None
        ):  # built once: callers copy a config before changing it
            self._enumerated_features = self.features.encoder.encode_values(values)
            self._enumerated_configs = [self.space.as_config(v) for v in values]
            self._row_of_key = {k: i for i, k in enumerate(keys)}
        if len(values) <= cap:
            keep = [i for i, k in enumerate(keys) if k not in exclude]
        else:  # enumerated but too many to score: rows of the cached features, in insertion order
            order = dict.fromkeys(rng.choice(len(values), size=cap // 2, replace=False).tolist())
            for c in self.anchors(ok):
                j = self._row_of_key.get(self.space.key(c))
                if j is not None:
                    order.setdefault(j)
            keep = [i for i in order if keys[i] not in exclude]
        configs = [self._enumerated_configs[i] for i in keep]
        prior = self.features.prior
        if prior is None:
            return configs, self._enumerated_features[keep]
        if self._enumerated_prior_terms is None:
            self._enumerated_prior_terms = prior.terms(self._enumerated_configs)
        T, M = self._enumerated_prior_terms
        return configs, self.features.augment(self._enumerated_features[keep], T[keep], M[keep])

    def anchors(self, ok: Sequence[Observation]) -> Iterator[dict[str, Any]]:
        """Configs every sampled pool holds: the baseline (the design starts from it), the
        neighbours of the five fastest ``ok`` configs and the fastest one's whole ``local_radius``
        neighbourhood (local steps)."""
        base = self.baseline if self.baseline is not None else self.space.default_config()
        if not self.space.violated(base):
            yield dict(base)
        fastest = sorted(ok, key=lambda o: o.outcome.step_time or math.inf)[:5]
        for rank, o in enumerate(fastest):
            ring = [o.config]
            for _ in range(self.settings.local_radius if rank == 0 else 1):
                ring = [nb for c in ring for nb in self.space.neighbours(c)]
                yield from ring

    def untried_near(
        self,
        configs: Sequence[Mapping[str, Any]],
        incumbent: Mapping[str, Any] | None,
        tried: Sequence[Mapping[str, Any]],
    ) -> np.ndarray:
        """``(n,)`` bool: within ``local_radius`` knob changes of ``incumbent`` and holding a knob
        value that none of the ``tried`` configs within that radius holds (all False without an
        incumbent). These are the incumbent's neighbours whose value's effect the study has never
        measured where the incumbent is: only the prior speaks for them there."""
        near = self.near(configs, incumbent)
        if incumbent is None or not near.any():
            return near
        names = self.space.names
        seen = {
            (n, _value_key(c[n]))
            for c, close in zip(tried, self.near(tried, incumbent), strict=True)
            if close
            for n in names
        }
        seen.update((n, _value_key(incumbent[n])) for n in names)
        novel = np.array(
            [any((n, _value_key(c[n])) not in seen for n in names) for c in configs], dtype=bool
        )
        return near & novel

    def far(
        self, configs: Sequence[Mapping[str, Any]], tried: Sequence[Mapping[str, Any]]
    ) -> np.ndarray:
        """``(n,)`` bool: more than ``local_radius`` knob changes from every ``tried`` config (all
        True when nothing was tried): a region the study has not measured."""
        if not tried:
            return np.ones(len(configs), dtype=bool)
        names = self.space.names
        codes: dict[tuple[str, tuple[str, str]], int] = {}

        def encode(cs: Sequence[Mapping[str, Any]]) -> np.ndarray:
            return np.array(
                [[codes.setdefault((n, _value_key(c[n])), len(codes)) for n in names] for c in cs],
                dtype=np.int64,
            ).reshape(len(cs), len(names))

        T, C = encode(tried), encode(configs)
        nearest = np.full(len(configs), len(names), dtype=np.int64)
        for row in T:  # one tried config at a time: memory stays (n, knobs)
            nearest = np.minimum(nearest, (row != C).sum(axis=1))
        return nearest > self.settings.local_radius

    def near(
        self, configs: Sequence[Mapping[str, Any]], incumbent: Mapping[str, Any] | None
    ) -> np.ndarray:
        """``(n,)`` bool: within ``local_radius`` knob changes of ``incumbent`` (all False without one)."""
        if incumbent is None:
            return np.zeros(len(configs), dtype=bool)
        names = self.space.names
        ref = [incumbent[n] for n in names]
        radius = self.settings.local_radius
        return np.array(
            [
                sum(c[n] != r or type(c[n]) is not type(r) for n, r in zip(names, ref, strict=True))
                <= radius
                for c in configs
            ],
            dtype=bool,
        )


def _value_key(value: Any) -> tuple[str, str]:
    """A knob value as a hashable key that tells ``1``, ``1.0`` and ``True`` apart (as ``near`` does)."""
    return type(value).__name__, repr(value)
