"""Memory-saver pairing: repair a fast candidate that the memory model says will not fit.

A repair is reached by the smallest moves toward saving memory: a ``saver`` knob one value further
down its list (values are listed from least to most saving, ``true`` saves), or a ``hungry`` knob one
value back (values are listed from least to most hungry). Moves are combined breadth-first up to
``max_steps`` in total, inactive knobs re-resolve to their defaults after each move (moving to
ZeRO-3 activates ``offload_param``, which may then move too), and constraints are respected.
Among the repairs the memory model predicts to fit, the one with the best predicted step time
wins; ties go to the smaller move.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from infrarsi.search.space import SearchSpace

PAIRING_TRIGGER = 0.5
"""Repair a chosen candidate whose P(fit) is below this."""
PAIRING_TARGET = 0.7
"""A repair must reach at least this P(fit)."""


@dataclass
class Repair:
    """One repair of a candidate."""

    config: dict[str, Any]
    """The repaired config (full and valid)."""
    steps: int
    """Number of one-value moves from the candidate."""
    moves: list[str]
    """The moves, e.g. ``["zero_stage: 1 -> 2", "micro_batch_size: 8 -> 4"]``."""


def saving_moves(space: SearchSpace, config: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(knob, new value) one value toward saving memory, for each active memory-tagged knob."""
    active = space.active(config)
    out: list[tuple[str, Any]] = []
    for k in space.knobs:
        if k.memory == "neutral" or not active[k.name]:
            continue
        i = k.index(config[k.name])
        j = i + 1 if k.memory == "saver" else i - 1
        if 0 <= j < len(k.values):
            out.append((k.name, k.values[j]))
    return out


def repairs(space: SearchSpace, config: Mapping[str, Any], max_steps: int = 3,
            limit: int = 400) -> list[Repair]:
    """Every valid config reachable by 1..``max_steps`` saving moves (breadth-first, deduplicated)."""
    start = dict(config)
    seen = {space.key(start)}
    frontier = [Repair(start, 0, [])]
    out: list[Repair] = []
    for _ in range(max_steps):
        nxt: list[Repair] = []
        for rep in frontier:
            for name, value in saving_moves(space, rep.config):
                cand = space.resolve({**rep.config, name: value})
                key = space.key(cand)
                if key in seen:
                    continue
                seen.add(key)
                new = Repair(cand, rep.steps + 1, [*rep.moves, f"{name}: {rep.config[name]!r} -> {value!r}"])
                nxt.append(new)  # keep walking through constraint-breaking intermediates
                if not space.violated(cand):
                    out.append(new)
                if len(out) >= limit:
                    return out
        frontier = nxt
    return out


def best_repair(space: SearchSpace, config: Mapping[str, Any],
                predict: Callable[[Sequence[Mapping[str, Any]]], dict[str, np.ndarray]],
                excluded: set[str], max_steps: int = 3, target: float = PAIRING_TARGET) -> tuple[Repair, dict[str, float]] | None:
    """The fitting repair with the best predicted step time, or None.

    ``predict(configs)`` returns arrays ``log_time_mean``, ``p_fit`` and ``p_ok``.
    """
    reps = [r for r in repairs(space, config, max_steps) if space.key(r.config) not in excluded]
    if not reps:
        return None
    pred = predict([r.config for r in reps])
    ok = (pred["p_fit"] >= target) & (pred["p_ok"] >= 0.5)
    if not ok.any():
        return None
    idx = np.flatnonzero(ok)
    order = sorted(idx.tolist(), key=lambda i: (float(pred["log_time_mean"][i]), reps[i].steps))
    i = order[0]
    return reps[i], {k: float(v[i]) for k, v in pred.items()}
