"""The audit's experience-bank tables: the bank entries used to warm-start the search, and their effect.

Read from ``DIR/bank_warm_start.json`` (a ``WarmStartRecord``: the warm-start choice
``orchestration.optimizer_factory`` made:
entries used, with their repairs, and entries dropped as invalid here) and from the trials whose
``AskInfo`` phase is ``warm_start`` (``extra.ask_info``, with the ``WarmStartOrigin``). A used
entry is "tried" when a run trial measured its config; its effect is that trial's step time
against this study's baseline, next to the step time it had relative to its own baseline.
The bank's studies used inside the models (``WarmStartRecord.transfer``, ``search.transfer``) are
listed with the rows each gave, and the transfer's weights over the study (each run trial's
``AskInfo.transfer_weights``: the coefficient centre's and the residual's, 1 = fully trusted).
"""

from __future__ import annotations

import json
from typing import Any

from infrarsi.errors import StudyError
from infrarsi.report.data import StudyData
from infrarsi.report.document import Block, Para, Table
from infrarsi.search.ask_info import Phase, WarmStartOrigin
from infrarsi.study.warm_start_record import TransferSummary, WarmStartEntry, WarmStartRecord


def _key(cfg: Any) -> str:
    return json.dumps(cfg or {}, sort_keys=True, default=str)


def _f(v: Any, digits: int = 3) -> str:
    return "-" if v is None else f"{float(v):.{digits}g}"


def _ask_info(row: Any) -> dict[str, Any]:
    """The row's ``extra.ask_info`` dict (empty when absent or malformed)."""
    raw = row.extra.ask_info
    return raw if isinstance(raw, dict) else {}


def bank_blocks(data: StudyData) -> list[Block]:
    """The audit's bank blocks (empty when the study used no bank entry and dropped none)."""
    damaged: list[Block] = []
    try:
        record = WarmStartRecord.load_if_present(data.study_dir) or WarmStartRecord()
    except StudyError as e:  # the audit says so and goes on from the trial log
        record = WarmStartRecord()
        damaged = [Para(f"The bank's warm-start record could not be read: {e}")]
    used = list(record.used)
    dropped = list(record.dropped)
    transfer = record.transfer if record.transfer is not None and record.transfer.sources else None
    runs = [r for r in data.trials if r.stage == "run"]
    known = {_key(u.config) for u in used}
    for r in (
        runs
    ):  # warm starts a record does not hold (a study from before the record, a changed bank)
        info = _ask_info(r)
        origin = info.get("warm_start_origin") if info.get("phase") == Phase.WARM_START else None
        if (
            isinstance(origin, dict)
            and origin.get("rule") != "mapped"  # not a bank entry: listed with the transfer
            and _key(r.config) not in known
            and _key(info.get("repair_of")) not in known
        ):
            entry = WarmStartOrigin.from_dict(origin).to_dict()
            used.append(WarmStartEntry.model_validate({**entry, "config": r.config}))
            known.add(_key(r.config))
    if not used and not dropped and not transfer:
        return damaged
    base_s = data.doctor.baseline_step_time_s if data.doctor else None
    mapped = [r for r in runs if _mapped(r)]
    rows = []
    for u in used:
        tried = [r for r in runs if _key(r.config) == _key(u.config)]
        # expected not to fit here, it ran as its memory-saving repair (search.pickers.Pickers.warm_start)
        repaired = (
            []
            if tried
            else [
                r
                for r in runs
                if _ask_info(r).get("phase") == Phase.WARM_START
                and _key(_ask_info(r).get("repair_of")) == _key(u.config)
            ]
        )
        if tried or repaired:
            first = (tried or repaired)[0]
            ok = [r.step_time_s for r in tried or repaired if r.status == "ok" and r.step_time_s]
            effect = (
                f"{base_s / min(ok):.2f}x vs baseline"
                if ok and base_s
                else f"{min(ok):.4g} s"
                if ok
                else first.status
            )
            how = (
                "tried"
                if tried
                else (
                    f"expected not to fit here; tried as its repair "
                    f"({', '.join(_ask_info(first).get('repair_moves') or [])})"
                )
            )
            outcome = f"{how}: {', '.join(r.trial_id for r in tried or repaired)} ({first.status}); {effect}"
        elif mapped:
            outcome = "not tried (its turn asked a mapped warm start, or the budget was spent)"
        else:
            outcome = "not tried (budget spent before it, or queued after this run)"
        source = f"{u.source_study}{' (this hardware)' if u.same_hardware else ''}"
        rows.append(
            [
                source,
                str(u.trial_id),
                _f(u.relative_step_time),
                _f(u.similarity),
                "; ".join(u.repairs) or "valid as measured",
                outcome,
            ]
        )
    blocks: list[Block] = [
        *damaged,
        Para(
            f"Experience bank {record.bank or ''}: {len(used)} entries of other "
            f"studies warm-started the search (tried first, after the baseline; measured here "
            f"like any trial, never told to the models as measurements)."
            if used
            else f"Experience bank {record.bank or ''}: no entry was used."
        ),
    ]
    if rows:
        blocks.append(
            Table(
                [
                    "source study",
                    "source trial",
                    "step time / its baseline",
                    "similarity",
                    "re-validation",
                    "here",
                ],
                rows,
            )
        )
    blocks += _transfer_blocks(transfer, runs)
    if mapped:
        blocks.append(_mapped_para(mapped, base_s))
    if dropped:
        blocks.append(
            Table(
                [
                    "dropped bank entry (source study, trial)",
                    "config as measured",
                    "why invalid here",
                ],
                [
                    [
                        f"{d.source_study}, {d.trial_id}",
                        _key(d.bank_config),
                        str(d.reason or "")[:240],
                    ]
                    for d in dropped
                ],
            )
        )
    return blocks


def _mapped(row: Any) -> bool:
    """A run trial asked as a mapped warm start (``WarmStartOrigin.rule``)."""
    info = _ask_info(row)
    origin = info.get("warm_start_origin")
    return (
        info.get("phase") == Phase.WARM_START
        and isinstance(origin, dict)
        and origin.get("rule") == "mapped"
    )


def _mapped_para(rows: list[Any], base_s: float | None) -> Para:
    """The mapped warm starts: configs no bank study measured, asked as this study's best under
    the transferred prior (``OptimizerSettings.warm_start_rule``), with what each measured."""
    each = []
    for r in rows:
        got = (
            f"{base_s / r.step_time_s:.2f}x vs baseline"
            if r.status == "ok" and r.step_time_s and base_s
            else f"{r.step_time_s:.4g} s"
            if r.status == "ok" and r.step_time_s
            else r.status
        )
        each.append(f"{r.trial_id} ({got})")
    return Para(
        f"Mapped warm starts: {len(rows)} trials asked this study's best config under the "
        f"transferred prior (the bank studies' fitted coefficients on this study's own formulas, "
        f"plus their residual), in the turns of bank entries: {', '.join(each)}."
    )


def _transfer_blocks(transfer: TransferSummary | None, runs: list[Any]) -> list[Block]:
    """The transfer inside the models: its sources, and its weights over the study's run trials."""
    sources = list(transfer.sources) if transfer is not None else []
    if not sources:
        return []
    weights = []
    for r in runs:
        raw = r.extra.ask_info
        tw = raw.get("transfer_weights") if isinstance(raw, dict) else None
        if isinstance(tw, (list, tuple)) and len(tw) == 2:
            weights.append((r.trial_id, float(tw[0]), float(tw[1])))
    if weights:
        first, last = weights[0], weights[-1]
        effect = (
            f"Weights (coefficient centre, residual) went from ({first[1]:.2f}, {first[2]:.2f}) at "
            f"{first[0]} to ({last[1]:.2f}, {last[2]:.2f}) at {last[0]}, as this study's own trials "
            f"ranked the transferred predictions (0: dropped, the cold model)."
        )
    else:
        effect = "No run trial recorded its weights yet."
    check = transfer.time_rank_check if transfer is not None else None
    if check is not None:
        how = (
            f"Checked on the bank's own {check.trials} trials out of sample, the transferred "
            f"formulas ranked their step times with Kendall's tau {check.kendall_tau:.2f} "
            f"(one-sided p {check.p_value:.2g})"
        )
        effect += (
            f" {how}: trusted from the start."
            if check.trusted
            else f" {how}, no better than chance: its step times were not used (weights 0 "
            "throughout; its peaks still were)."
        )
    blocks: list[Block] = [
        Para(
            f"Transfer inside the models: {sum(s.rows for s in sources)} bank "
            f"trials of {len(sources)} similar studies centred the analytic prior's "
            f"coefficients and gave a residual mean. {effect}"
        )
    ]
    blocks.append(
        Table(
            [
                "source study",
                "similarity",
                "trials used",
                "dropped (invalid here)",
                "its own prior",
            ],
            [
                [
                    str(s.study),
                    _f(s.similarity),
                    str(s.rows),
                    str(s.dropped),
                    "yes" if s.own_prior else "no (this study's stood in)",
                ]
                for s in sources
            ],
        )
    )
    if weights:
        blocks.append(
            Table(
                ["trial", "coefficient-centre weight", "residual weight"],
                [[t, f"{c:.2f}", f"{w:.2f}"] for t, c, w in weights],
            )
        )
    return blocks


__all__ = ["bank_blocks"]
