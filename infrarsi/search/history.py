"""``History``: what an optimizer knows of its trials (told, pending, why each was asked, warm starts queued).

The history is the optimizer's record of the study so far, kept apart from the models fitted on it
(``modelset``) and the schedule that reads it (``schedule``). It is saved through its own
``to_dict`` / ``from_dict`` as part of ``Optimizer.state_dict()``, under the keys saved states have
always used (``observations``, ``pending``, ``ask_infos``, ``initial_queue``, ``n_asks``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infrarsi.errors import SearchSpaceError, UserInputError
from infrarsi.search.ask_info import AskInfo, Phase, WarmStartOrigin
from infrarsi.search.outcome import Observation, Outcome
from infrarsi.search.space import SearchSpace


@dataclass
class History:
    """The told and pending trials of one optimizer, with the provenance of every ask."""

    space: SearchSpace
    """The search space the configs belong to (``space.key`` identifies a config)."""
    observations: list[Observation] = field(default_factory=list)
    """Every told trial, in the order told (replicates included)."""
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Configs asked (or proposed) and not yet told, by ``space.key``."""
    ask_infos: dict[str, AskInfo] = field(default_factory=dict)
    """Provenance of every config asked so far, by ``space.key``."""
    warm_queue: list[tuple[dict[str, Any], WarmStartOrigin | None]] = field(default_factory=list)
    """Warm-start configs not yet asked, first first, with where each was measured before."""
    n_asks: int = 0
    """Number of ``ask()`` calls so far (the next ask's ``AskInfo.ask_index``)."""

    def add(self, config: dict[str, Any], outcome: Outcome) -> Observation:
        """Record a told trial of a validated ``config``; it is no longer pending."""
        self.pending.pop(self.space.key(config), None)
        obs = Observation(config, outcome)
        self.observations.append(obs)
        return obs

    def queue_warm_starts(
        self, configs: Sequence[Mapping[str, Any]], origins: Sequence[WarmStartOrigin | None]
    ) -> None:
        """Queue warm-start configs after those already queued: a config not valid in the space
        (another version of it) or already queued is skipped."""
        if len(origins) > len(configs):
            raise UserInputError(
                f"Optimizer: initial_origins: rule: at most one per initial config "
                f"({len(configs)}); got {len(origins)}."
            )
        queued = {self.space.key(c) for c, _ in self.warm_queue}
        for i, raw in enumerate(configs):
            try:
                cfg = self.space.validate(raw, where=f"initial_configs[{i}]")
            except SearchSpaceError:
                continue  # a config of another version of the space: skipped
            key = self.space.key(cfg)
            if key not in queued:
                queued.add(key)
                self.warm_queue.append((cfg, origins[i] if i < len(origins) else None))

    def add_pending(self, config: dict[str, Any], phase: Phase) -> dict[str, Any]:
        """Record a validated ``config`` asked from outside the optimizer (a proposal) as pending,
        with its ask info; returns it."""
        full = dict(config)
        key = self.space.key(full)
        self.pending[key] = full
        self.ask_infos[key] = AskInfo(config=full, phase=phase, ask_index=self.n_asks)
        return full

    def failed_keys(self) -> set[str]:
        """Keys of configs told with a failure status at least once (never proposed again)."""
        return {self.space.key(o.config) for o in self.observations if o.outcome.status != "ok"}

    def ok(self, left_out: Iterable[int] = ()) -> list[Observation]:
        """The ok observations, without those whose index is in ``left_out`` (trimmed stragglers)."""
        drop = set(left_out)
        return [
            o for i, o in enumerate(self.observations) if o.outcome.status == "ok" and i not in drop
        ]

    def seen_keys(self) -> set[str]:
        """Keys of every config told at least once."""
        return {self.space.key(o.config) for o in self.observations}

    def config_of(self, key: str) -> dict[str, Any]:
        """The config of a pending (or taken) key: the pending config, else the inverse of ``space.key``."""
        return self.pending.get(key) or self.space.as_config(json.loads(key))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (``from_dict`` inverts it)."""
        return {
            "observations": [
                {"config": o.config, "outcome": o.outcome.to_dict()} for o in self.observations
            ],
            "pending": list(self.pending.values()),
            "ask_infos": [i.to_dict() for i in self.ask_infos.values()],
            "initial_queue": [
                {"config": c, "origin": None if o is None else o.to_dict()}
                for c, o in self.warm_queue
            ],
            "n_asks": self.n_asks,
        }

    @classmethod
    def from_dict(
        cls,
        space: SearchSpace,
        raw: Mapping[str, Any],
        warm_queue: Sequence[tuple[dict[str, Any], WarmStartOrigin | None]] = (),
    ) -> History:
        """Inverse of ``to_dict`` (also of a version-1 state's keys). A state without
        ``initial_queue`` keeps ``warm_queue`` (the queue the optimizer was built with)."""
        out = cls(space, n_asks=int(raw["n_asks"]))
        for o in raw["observations"]:
            out.add(
                space.validate(o["config"], where="tell(config)"), Outcome.from_dict(o["outcome"])
            )
        out.pending = {space.key(c): space.validate(c) for c in raw.get("pending", [])}
        infos = [AskInfo.from_dict(i) for i in raw.get("ask_infos", [])]
        out.ask_infos = {space.key(i.config): i for i in infos}
        if "initial_queue" in raw:
            entries = list(raw["initial_queue"] or [])
            out.queue_warm_starts(
                [e["config"] for e in entries],
                [
                    None if e.get("origin") is None else WarmStartOrigin.from_dict(e["origin"])
                    for e in entries
                ],
            )
        else:
            out.warm_queue = list(warm_queue)
        return out
