"""The audit's experience-bank tables: the bank entries used to warm-start the search, and their effect.

Read from ``DIR/bank_warm_start.json`` (the warm-start choice ``stages.optimizer_factory`` made:
entries used, with their repairs, and entries dropped as invalid here) and from the trials whose
``AskInfo`` phase is ``warm_start`` (``extra["ask_info"]``, with the ``WarmStartOrigin``). A used
entry is "tried" when a run trial measured its config; its effect is that trial's step time
against this study's baseline, next to the step time it had relative to its own baseline.
"""

from __future__ import annotations

import json
from typing import Any

from infrarsi.report.data import StudyData
from infrarsi.report.document import Block, Para, Table
from infrarsi.study.paths import StudyPaths


def _key(cfg: Any) -> str:
    return json.dumps(cfg or {}, sort_keys=True, default=str)


def _f(v: Any, digits: int = 3) -> str:
    return "-" if v is None else f"{float(v):.{digits}g}"


def bank_blocks(data: StudyData) -> list[Block]:
    """The audit's bank blocks (empty when the study used no bank entry and dropped none)."""
    record: dict[str, Any] = {}
    path = StudyPaths(data.study_dir).bank_warm_start
    if path.exists():
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            record = {}
    used = list(record.get("used") or [])
    dropped = list(record.get("dropped") or [])
    runs = [r for r in data.trials if r.stage == "run"]
    known = {_key(u.get("config")) for u in used}
    for r in runs:  # warm starts a record does not hold (a study from before the record, a changed bank)
        raw = r.extra.get("ask_info")
        info: dict[str, Any] = raw if isinstance(raw, dict) else {}
        origin = info.get("warm_start_origin") if info.get("phase") == "warm_start" else None
        if isinstance(origin, dict) and _key(r.config) not in known:
            used.append({**origin, "config": r.config})
            known.add(_key(r.config))
    if not used and not dropped:
        return []
    base_s = data.doctor.baseline_step_time_s if data.doctor else None
    rows = []
    for u in used:
        tried = [r for r in runs if _key(r.config) == _key(u.get("config"))]
        if tried:
            first = tried[0]
            ok = [r.step_time_s for r in tried if r.status == "ok" and r.step_time_s]
            effect = (f"{base_s / min(ok):.2f}x vs baseline" if ok and base_s else
                      f"{min(ok):.4g} s" if ok else first.status)
            outcome = f"tried: {', '.join(r.trial_id for r in tried)} ({first.status}); {effect}"
        else:
            outcome = "not tried (budget spent before it, or queued after this run)"
        rows.append([str(u.get("source_study")), str(u.get("trial_id")), _f(u.get("relative_step_time")),
                     _f(u.get("similarity")), "; ".join(u.get("repairs") or []) or "valid as measured", outcome])
    blocks: list[Block] = [Para(f"Experience bank {record.get('bank') or ''}: {len(used)} entries from other "
                                f"hardware warm-started the search (tried first, after the baseline; measured here "
                                f"like any trial, never told to the models as measurements)."
                                if used else f"Experience bank {record.get('bank') or ''}: no entry was used.")]
    if rows:
        blocks.append(Table(["source study", "source trial", "step time / its baseline", "similarity",
                             "re-validation", "here"], rows))
    if dropped:
        blocks.append(Table(["dropped bank entry (source study, trial)", "config as measured", "why invalid here"],
                            [[f"{d.get('source_study')}, {d.get('trial_id')}", _key(d.get("bank_config")),
                              str(d.get("reason") or "")[:240]] for d in dropped]))
    return blocks


__all__ = ["bank_blocks"]
