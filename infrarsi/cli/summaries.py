"""What the stage commands print: one table per stage, and ``tune``'s closing summary.

Each takes the stage's own record or summary (``infrarsi.cli.stages`` calls them); with ``--json``
the commands print that record instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from infrarsi.cli.app import console
from infrarsi.units import format_bytes

if TYPE_CHECKING:
    from infrarsi.study.doctor_report import DoctorReport
    from infrarsi.study.long_check_report import LongCheckResult


def table(title: str, rows: list[tuple[str, str]]) -> Table:
    """A two-column (measure, value) table."""
    t = Table(title=title, header_style="bold")
    t.add_column("measure")
    t.add_column("value")
    for k, v in rows:
        t.add_row(k, v)
    return t


def print_doctor(d: DoctorReport) -> None:
    """``doctor``'s table."""
    rows: list[tuple[str, str]] = []
    st, tol = d.step_time_s, d.loss_tolerance_in_force
    if st is not None:
        rows.append(("step_time_s (median of trial medians)", f"{st.median:.4f} s"))
        rows.append(
            (
                "run-to-run CV / within-trial CV",
                f"{st.run_to_run_cv:.2%} / {st.within_trial_cv:.2%}",
            )
        )
    rows += [
        (
            "noise margin verify must clear",
            f"{d.noise_margin:.2%}" if d.noise_margin is not None else "-",
        ),
        ("straggler", str(d.stragglers.flag) if d.stragglers else "-"),
        ("phases (s per step)", ", ".join(f"{k}={v:.3f}" for k, v in d.phase_times_s.items())),
        ("peak memory per device", format_bytes(d.peak_memory_bytes)),
        ("device memory (as reported)", format_bytes(d.device_memory_capacity_bytes)),
        (
            "peak FLOP/s per device (measured)",
            f"{d.peak_flops_per_s:.3g}" if d.peak_flops_per_s else "-",
        ),
        ("baseline MFU", f"{d.mfu:.2%}" if d.mfu is not None else "-"),
    ]
    for c in d.honest_changes:
        rows.append(
            (
                f"honest change ({c.changed} {c.config.get(c.changed)})",
                f"max loss diff {c.loss_max_abs_diff:.3g}"
                if c.loss_max_abs_diff is not None
                else f"ended {c.status}, not used",
            )
        )
    rows.append(("data order (token digests)", _data_order_text(d)))
    rows.append(
        ("loss tolerance (abs, per step)", f"{tol.atol:.3g} ({tol.source})" if tol else "-")
    )
    console.print(table("doctor: baseline", rows))


def _data_order_text(d: DoctorReport) -> str:
    """The doctor's data-order check in words (the failing case is the doctor's error)."""
    order = d.data_order
    if order is None:
        return "not recorded"
    if order.same_under_honest_changes is False:
        return "same each run; differs under the batch split, so not checked for candidates"
    return "same each run; every candidate must feed the baseline's data"


def print_run(s: dict[str, Any]) -> None:
    """``run``'s table (``run_stage``'s summary)."""
    best, base, raw = s.get("best_step_time_s"), s.get("baseline_step_time_s"), s.get("raw_speedup")
    console.print(
        table(
            "run",
            [
                (
                    "trials",
                    f"{s['trials']} ({', '.join(f'{k} {v}' for k, v in s['statuses'].items()) or '-'})",
                ),
                ("baseline step_time_s", f"{base:.4f} s" if base else "-"),
                (
                    "fastest clean trial",
                    f"{best:.4f} s ({raw:.2f}x, unverified)" if best and raw else "-",
                ),
                ("its config", json.dumps(s.get("best_config")) if s.get("best_config") else "-"),
                *_choice_rows(s.get("choice")),
                ("concurrency", str(s.get("concurrency"))),
            ],
        )
    )


def _choice_rows(choice: dict[str, Any] | None) -> list[tuple[str, str]]:
    """``run``'s table rows for the knob config to verify (``BestChoice.to_dict()``) and why."""
    if not choice:
        return [("to verify", "-")]
    return [
        ("to verify", json.dumps(choice["config"])),
        ("why", f"{choice['reason']}: {choice['why']}"),
    ]


def print_verify(v: dict) -> None:
    t = Table(title="verify", header_style="bold")
    for col in (
        "#",
        "accepted",
        "speedup",
        "interval (coverage)",
        "changes vs baseline",
        "why not",
    ):
        t.add_column(col)
    for i, c in enumerate(v.get("candidates", [])):
        sp = f"{c['speedup']:.2f}x" if c.get("speedup") is not None else "-"
        t.add_row(
            str(i),
            "yes" if c["accepted"] else "no",
            sp,
            _interval(c),
            changes_text(c),
            (c.get("reason") or "")[:120],
        )
    console.print(t)


def _interval(c: dict) -> str:
    """A candidate's interval and its real coverage, e.g. ``[1.10, 1.31] (94.5%)``."""
    if c.get("ci_low") is None or c.get("ci_coverage") is None:
        return "-"
    return f"[{c['ci_low']:.2f}, {c['ci_high']:.2f}] ({c['ci_coverage']:.1%})"


def changes_text(c: dict) -> str:
    """What a candidate changes from the baseline: its knobs, then its patches."""
    diff = [f"{k}={b}" for k, (_a, b) in c.get("diff_vs_baseline", {}).items()]
    diff += [f"patch {Path(p['path']).name} ({p['sha256'][:12]})" for p in c.get("patches") or []]
    return ", ".join(diff) or "-"


def speedup_line(best: dict | None) -> str:
    if not best:
        return (
            "no candidate was accepted: no win cleared the measured noise with every invariant kept"
        )
    cov = best.get("ci_coverage")
    return (
        f"verified speedup: {best['speedup']:.2f}x (lower bound {best['ci_low']:.2f}x of the "
        f"{best.get('ci_method') or 'interval'}"
        + (f"; it covers the median {cov:.1%} of the time" if cov is not None else "")
        + ")"
    )


def print_long_check(res: LongCheckResult) -> None:
    """``long-check``'s table, its reason and notes."""
    rows = [
        (
            "horizon (optimizer steps)",
            f"{res.horizon_steps} (trial {res.trial_steps}; factor {res.horizon_factor:g}"
            + (", capped by the budget)" if res.capped_by_budget else ")"),
        ),
        (
            "budget / estimated / wall",
            f"{res.budget_s:.0f} s / {res.estimated_cost_s:.0f} s / {res.wall_s:.0f} s",
        ),
        (
            "loss tolerance (abs, per step)",
            f"{res.loss_atol:.3g} (contract {res.contract_loss_atol:.3g})",
        ),
    ]
    if res.calibration is not None:
        d = res.calibration.loss_max_abs_diff
        rows.append(
            (
                f"calibration ({res.calibration.changed} {res.calibration.config.get(res.calibration.changed)})",
                f"max loss diff {d:.3g}"
                if d is not None
                else f"ended {res.calibration.status}, not used",
            )
        )
    rows.append(
        (
            "max |candidate - baseline|",
            "-"
            if res.max_abs_diff is None
            else f"{res.max_abs_diff:.3g} at step {res.max_abs_diff_step}",
        )
    )
    rows.append(
        (
            "first step out of tolerance",
            "none" if res.first_step_out is None else str(res.first_step_out),
        )
    )
    ck = res.checkpoint
    rows.append(
        (
            "checkpoint round trip",
            f"{ck.status} (step {ck.step}, max diff "
            f"{'-' if ck.max_abs_diff is None else f'{ck.max_abs_diff:.3g}'}, tolerance {ck.atol:.3g})",
        )
    )
    console.print(table(f"long check: {res.status}", rows))
    if res.reason:
        console.print(f"reason: {res.reason}", highlight=False)
    for note in res.notes:
        console.print(f"note: {note}", highlight=False)


def tune_summary(out: dict[str, Any], log_file: Path) -> list[tuple[str, str]]:
    """The rows of ``tune``'s closing table: the baseline, the verified best, its speed-up with
    the interval and its real coverage, the long check's verdict, and where the report and the
    full log are."""
    base = (out.get("run") or {}).get("baseline_step_time_s")
    best = (out.get("verify") or {}).get("best")
    rows = [("baseline", f"{base:.4f} s/step" if base else "-")]
    if best and best.get("accepted"):
        step = f"{base / best['speedup']:.4f} s/step, " if base and best.get("speedup") else ""
        cand = next(
            (
                c
                for c in out["verify"].get("candidates", [])
                if (c.get("config"), c.get("patches")) == (best.get("config"), best.get("patches"))
            ),
            best,
        )
        rows.append(("verified best", f"{step}{changes_text(cand)}"))
        cov = best.get("ci_coverage")
        rows.append(
            (
                "speed-up",
                f"{best['speedup']:.2f}x, interval [{best['ci_low']:.2f}, {best['ci_high']:.2f}]"
                + (f" (coverage {cov:.1%})" if cov is not None else ""),
            )
        )
    else:
        rows.append(
            (
                "verified best",
                "none: no candidate cleared the measured noise with every invariant kept",
            )
        )
    lc = out.get("long_check")
    rows.append(
        (
            "long check",
            f"{lc['status']} over {lc['horizon_steps']} steps (a trial: {lc['trial_steps']})"
            + (f": {lc['reason']}" if lc.get("reason") else "")
            if lc
            else "not run (nothing accepted, or --no-long-check)",
        )
    )
    rows.append(("report", str(out["report_html"])))
    rows.append(("full log", str(log_file)))
    return rows
