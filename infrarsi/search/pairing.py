"""Memory-saver pairing: repair a fast candidate that the memory model says will not fit.

A repair is reached by the smallest moves toward saving memory: a ``saver`` knob one value further
down its list (values are listed from least to most saving, ``true`` saves), or a ``hungry`` knob one
value back (values are listed from least to most hungry). Moves are combined breadth-first up to
``max_steps`` in total, inactive knobs re-resolve to their defaults after each move (moving to
ZeRO-3 activates ``offload_param``, which may then move too), and constraints are respected.
Among the repairs the memory model predicts to fit, the one with the best predicted step time
wins; ties go to the smaller move.

The optimizer pairs at two points (``pickers.Pickers.bo``):

- *before the pick*, when the candidates are a sample of a space too large to score whole: the
  ``pair_sources`` candidates with the best acquisition if memory were no object
  (``fast_but_too_big``) are repaired, and a repair that is not in the sample competes with the
  sample's best under the same constrained acquisition. A sample rarely holds the fitting
  neighbour of a fast config that sits just past the memory cliff; this puts it there. When every
  config is scored, the repairs are already among them and this step changes nothing.
- *after the pick*, when the chosen candidate itself is unlikely to fit (``pairing_trigger``).

The thresholds are ``OptimizerSettings.pairing_*``, ``pair_*`` and ``repair_max_steps``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from infrarsi.search.settings import DEFAULT_SETTINGS
from infrarsi.search.space import SearchSpace


class Predictions(Protocol):
    """What ``best_repair`` reads of a batch of predictions (``acquisition.Scores`` has it)."""

    time_mean: np.ndarray
    """``(n,)`` posterior mean of log step time."""
    p_fit: np.ndarray
    """``(n,)`` P(peak <= capacity)."""
    p_ok: np.ndarray
    """``(n,)`` P(no non-OOM failure)."""


P = TypeVar("P", bound=Predictions)


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


def repairs(
    space: SearchSpace,
    config: Mapping[str, Any],
    max_steps: int = DEFAULT_SETTINGS.repair_max_steps,
    limit: int = 400,
) -> list[Repair]:
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
                new = Repair(
                    cand, rep.steps + 1, [*rep.moves, f"{name}: {rep.config[name]!r} -> {value!r}"]
                )
                nxt.append(new)  # keep walking through constraint-breaking intermediates
                if not space.violated(cand):
                    out.append(new)
                if len(out) >= limit:
                    return out
        frontier = nxt
    return out


def fast_but_too_big(
    log_score: np.ndarray,
    p_fit: np.ndarray,
    sources: int = DEFAULT_SETTINGS.pair_sources,
    scan: int = DEFAULT_SETTINGS.pair_source_scan,
    trigger: float = DEFAULT_SETTINGS.pairing_trigger,
) -> list[int]:
    """Indices of up to ``sources`` candidates, best first by ``log_score - log p_fit`` (the
    acquisition if memory were no object) among the ``scan`` best by it, whose P(fit) is below
    ``trigger``."""
    free = np.asarray(log_score, dtype=float) - np.log(
        np.clip(np.asarray(p_fit, dtype=float), 1e-300, None)
    )
    top = np.argsort(-free, kind="stable")[:scan]
    return [int(i) for i in top if p_fit[i] < trigger][:sources]


def best_repair(
    space: SearchSpace,
    config: Mapping[str, Any],
    predict: Callable[[Sequence[Mapping[str, Any]]], P],
    excluded: set[str],
    max_steps: int = DEFAULT_SETTINGS.repair_max_steps,
    target: float = DEFAULT_SETTINGS.pairing_target,
) -> tuple[Repair, P, int] | None:
    """The fitting repair with the best predicted step time, or None.

    ``predict(configs)`` scores the repairs (``time_mean``, ``p_fit`` and ``p_ok``, see
    ``Predictions``). Returns the repair, the predictions of every repair scored and its index in them.
    """
    reps = [r for r in repairs(space, config, max_steps) if space.key(r.config) not in excluded]
    if not reps:
        return None
    pred = predict([r.config for r in reps])
    ok = (pred.p_fit >= target) & (pred.p_ok >= 0.5)
    if not ok.any():
        return None
    idx = np.flatnonzero(ok)
    order = sorted(idx.tolist(), key=lambda i: (float(pred.time_mean[i]), reps[i].steps))
    i = order[0]
    return reps[i], pred, i
