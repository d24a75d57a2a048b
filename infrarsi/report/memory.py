"""What to say when every trial of a study ran out of memory.

Nothing was measured, so there is no best config and no figure to draw; what helps is which
``memory: saver`` knobs of the search space the contract keeps fixed (a new study may allow
them) and, for the savers it allows, whether their most memory-saving value was tried.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infrarsi.result import TrialResult
from infrarsi.units import format_bytes


def counted_trials(trials: Sequence[TrialResult]) -> list[TrialResult]:
    """Trials that ran: not interrupted by a killed harness, not refused as out of scope."""
    return [r for r in trials if not r.extra.interrupted and not r.extra.out_of_scope]


def all_oom_verdict(
    trials: Sequence[TrialResult], contract: Any, space: Any, workload_path: str = "WORKLOAD"
) -> str | None:
    """The report's note when every trial that ran ended ``oom`` (None otherwise, or with no trial).

    ``contract`` is the study's ``Contract`` (its capacity and ``editable.knobs``), ``space`` its
    ``SearchSpace`` (None when unreadable: the knobs are then not named)."""
    ran = counted_trials(trials)
    if not ran or any(r.status != "oom" for r in ran):
        return None
    cap = contract.memory_capacity
    peaks = [r.peak_memory_bytes for r in ran if r.peak_memory_bytes]
    text = (
        f"Every trial ran out of memory: all {len(ran)} trials that ran ended 'oom' under the "
        f"memory capacity of {cap.describe()}"
        + (
            f" (the smallest lower bound seen on a peak: {format_bytes(min(peaks))})"
            if peaks
            else ""
        )
        + ". Nothing could be measured, so there is no best config."
    )
    if space is None:
        return (
            text
            + " Raise the memory capacity, or allow more of the search space's memory-saver knobs."
        )
    savers = [k for k in space.knobs if k.memory == "saver"]
    editable = list(contract.editable.knobs)
    fixed = [k.name for k in savers if k.name not in editable]
    allowed = [k for k in savers if k.name in editable]
    if fixed:
        knobs = " ".join(f"--knob {k}" for k in [*editable, *fixed])
        text += (
            f" Memory-saver knobs (`memory: saver` in the search space) the contract does not "
            f"allow yet: {', '.join(fixed)}. Allow them in a new study: `infrarsi init "
            f"{workload_path} --study NEW_DIR {knobs}` (without --knob every knob is allowed)."
        )
    else:
        text += " The contract already allows every memory-saver knob of the search space."
    if allowed:
        parts = []
        for k in allowed:
            most = k.values[-1]  # saver values go from the least to the most saving (true saves)
            tried = any(r.config.get(k.name) == most for r in ran)
            parts.append(f"{k.name}={most} ({'tried' if tried else 'not tried'})")
        text += f" Allowed savers at their most saving value: {', '.join(parts)}."
    return text + " Or raise --memory-capacity if the devices hold more."


__all__ = ["all_oom_verdict", "counted_trials"]
