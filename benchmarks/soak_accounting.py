"""The soak's accounting: trials lost, duplicated and counted, and device time by status, from a study's log.

``account`` reads one phase's log rows (plus what the soak saw while it ran: in-flight markers,
Tune trials that reported); each field it returns is defined in ``FIELDS``, which ``soak.md``
prints. ``benchmarks/soak.py`` runs the phases.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from infrarsi.result import TrialExtra

_RUN_ID = re.compile(r"^run-(\d+)$")

FIELDS: dict[str, str] = {
    "trials_requested": "the run budget (--trials) of the phase",
    "trials_counted": "run rows that are not interrupted: what counts against the budget",
    "budget_met": "trials_counted == trials_requested",
    "trials_interrupted": "run rows logged by `run --resume` for trials in flight at a harness kill",
    "trials_started": "distinct run trial ids known to have started: every id in the log, every "
    "in-flight marker the soak saw (polled every 0.2 s) or found left over, and "
    "every id below the largest one (ids are allocated in order, never reused)",
    "trials_lost": "started trial ids with no row in the log at the end, plus Tune trials that "
    "reported a result to Tune with no row carrying their tune_trial_id, plus "
    "in-flight markers left over at the end",
    "lost_ids": "the ids counted in trials_lost",
    "trials_duplicated": "extra rows: for each trial id logged more than once, and for each "
    "tune_trial_id carried by more than one non-interrupted row, the copies "
    "beyond the first",
    "duplicated_ids": "the ids counted in trials_duplicated",
    "tune_trials_reported": "Tune trials (tune/*/*/result.json not empty) that reported a result "
    "(a retried Tune trial keeps its id; Tune's driver writes these files, "
    "so a SIGKILLed harness may leave some unwritten: a lower bound)",
    "statuses": "run rows by status (interrupted rows under 'interrupted')",
    "device_seconds": "sum of device_seconds of run rows by status; 'interrupted' is a lower "
    "bound (each counts its devices up to its in-flight marker's last heartbeat)",
    "device_seconds_total": "sum over every run row, interrupted included (a lower bound)",
    "faults_injected": "faults the soak injected, by kind (oom: oom rows produced by the capacity)",
    "faults": "every fault with its time (s since the phase began), target and what it hit",
    "harness_runs": "each `infrarsi run` process: resume or not, exit code, why it ended, seconds",
    "max_in_flight": "most in-flight markers the soak saw at once (the concurrency reached)",
    "duplicate_launches_admitted": "duplicate_launch faults whose second `infrarsi run` was not refused "
    "with exit 2 naming the run holding the study (what it then logged "
    "is in trials_duplicated)",
}


def _get(row: Any, name: str, default: Any = None) -> Any:
    if isinstance(row, dict):
        return row.get(name, default)
    return getattr(row, name, default)


def _extra(row: Any) -> TrialExtra:
    """A row's ``TrialExtra`` (a dict row's ``extra`` is its ``to_dict()``, or that as JSON)."""
    raw = _get(row, "extra")
    if isinstance(raw, TrialExtra):
        return raw
    return TrialExtra.from_dict(json.loads(raw) if isinstance(raw, str) and raw else raw or None)


def account(
    rows: Iterable[Any],
    *,
    requested: int,
    markers_seen: Iterable[str] = (),
    leftover_markers: Iterable[str] = (),
    tune_reported: Iterable[str] = (),
    stage: str = "run",
) -> dict[str, Any]:
    """The loss/duplicate/budget/device-time accounting of one phase (see ``FIELDS``).

    ``rows``: the study's log rows (``TrialResult`` or dicts; other stages are ignored);
    ``markers_seen``: trial ids of in-flight markers observed while it ran; ``leftover_markers``:
    marker ids still on disk at the end; ``tune_reported``: Tune trial ids that reported a result."""
    run = [r for r in rows if _get(r, "stage") == stage]
    extra = [_extra(r) for r in run]
    interrupted = [bool(e.interrupted) for e in extra]
    ids = [str(_get(r, "trial_id")) for r in run]
    logged = set(ids)
    started = set(logged) | set(markers_seen) | set(leftover_markers)
    numbers = [int(m.group(1)) for m in (_RUN_ID.match(t) for t in started) if m]
    if numbers:
        started |= {f"{stage}-{n:04d}" for n in range(max(numbers) + 1)}
    lost = sorted(started - logged)
    tune_ids = [e.tune_trial_id for e, i in zip(extra, interrupted, strict=True) if not i]
    lost += sorted(f"tune:{t}" for t in set(tune_reported) - {t for t in tune_ids if t})
    lost += sorted(f"marker:{t}" for t in set(leftover_markers))
    dup: list[str] = []
    for t in sorted(set(ids)):
        dup += [t] * (ids.count(t) - 1)
    present = [t for t in tune_ids if t]
    for t in sorted(set(present)):
        dup += [f"tune:{t}"] * (present.count(t) - 1)
    statuses: dict[str, int] = {}
    device: dict[str, float] = {}
    for r, i in zip(run, interrupted, strict=True):
        key = "interrupted" if i else str(_get(r, "status"))
        statuses[key] = statuses.get(key, 0) + 1
        device[key] = device.get(key, 0.0) + float(_get(r, "device_seconds") or 0.0)
    counted = sum(1 for i in interrupted if not i)
    return {
        "trials_requested": int(requested),
        "trials_counted": counted,
        "budget_met": counted == int(requested),
        "trials_interrupted": sum(interrupted),
        "trials_started": len(started),
        "trials_lost": len(lost),
        "lost_ids": lost,
        "trials_duplicated": len(dup),
        "duplicated_ids": dup,
        "tune_trials_reported": len(set(tune_reported)),
        "statuses": dict(sorted(statuses.items())),
        "device_seconds": {k: round(v, 3) for k, v in sorted(device.items())},
        "device_seconds_total": round(sum(device.values()), 3),
    }


def tune_reported_ids(study: Path) -> list[str]:
    """Tune trial ids whose trial directory under ``study/tune`` has a non-empty result.json
    (Tune writes its own trial id into each result's ``trial_id``; else the directory's name,
    ``<trainable>_<8 hex id>_<n>_...``, gives it)."""
    out = []
    for res in sorted((study / "tune").glob("*/*/result.json")):
        try:
            text = res.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            try:
                tid = json.loads(line).get("trial_id") or _tune_id_of(res.parent.name)
            except json.JSONDecodeError:
                continue
            if tid:
                out.append(str(tid))
                break
    return out


def _tune_id_of(dirname: str) -> str | None:
    m = re.search(r"_([0-9a-f]{8})_\d+_", dirname)
    return m.group(1) if m else None
