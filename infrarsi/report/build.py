"""The report's sections, built from a ``StudyData``.

Why one module: every section is a small function of ``StudyData`` sharing its helpers; the plots,
the memory verdicts and the bank's audit live apart.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from infrarsi.report import plots
from infrarsi.report.data import StudyData
from infrarsi.report.document import Code, Figure, Note, Para, Section, Table
from infrarsi.report.dsconfig import deepspeed_config, json_diff, knob_diff
from infrarsi.study.contract import Contract
from infrarsi.study.verify_report import VerifiedCandidate

GIB = float(1 << 30)


def fmt(v: Any, unit: str = "", digits: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        if abs(v) >= 10**digits:
            return f"{v:,.0f}{unit}"
        return f"{v:.{digits}g}{unit}"
    return f"{v}{unit}"


def gib(b: float | int | None) -> str:
    return "-" if b is None else f"{float(b) / GIB:.3g} GiB"


def build_sections(data: StudyData) -> list[Section]:
    """Every section of the report, in order."""
    secs = [
        _summary(data),
        _long_check(data),
        _config_diff(data),
        _figures(data),
        _proposals(data),
        _trials(data),
        _device_seconds(data),
        _doctor(data),
        _audit(data),
        _methods(data),
    ]
    return [s for s in secs if s.blocks]


def _summary(data: StudyData) -> Section:
    s = Section("Baseline vs verified best")
    for n in data.notes:
        s.blocks.append(Note(n))
    verdict = _all_oom(data)
    if verdict:
        s.blocks.append(Note(verdict))
    c = data.contract
    s.blocks.append(
        Para(
            f"Study {c.study!r}: workload {c.workload.get('name')!r} "
            f"({c.workload_path or 'embedded'}), {c.invariants.tokens_per_step} tokens "
            f"per optimizer step, {len(data.trials)} trials logged. Request: "
            f"{c.request!r}."
            if c.request
            else f"Study {c.study!r}: workload {c.workload.get('name')!r}, "
            f"{c.invariants.tokens_per_step} tokens per optimizer step, "
            f"{len(data.trials)} trials logged."
        )
    )
    b, w = data.baseline, data.best
    best = data.verify.best if data.verify is not None else None
    rows = []
    for label, attr, unit in (
        ("step time (s)", "step_time_s", ""),
        ("tokens/s", "tokens_per_s", ""),
        ("MFU", "mfu", ""),
    ):
        bv = getattr(b, attr) if b else None
        wv = getattr(w, attr) if w else None
        rows.append([label, fmt(bv, unit), fmt(wv, unit)])
    rows.append(
        [
            "peak memory per device",
            gib(b.peak_memory_bytes if b else None),
            gib(w.peak_memory_bytes if w else None),
        ]
    )
    rows.append(
        [
            "rows measured (stage)",
            f"{len(b.rows) if b else 0} ({b.source if b else '-'})",
            f"{len(w.rows) if w else 0} ({w.source if w else '-'})",
        ]
    )
    s.blocks.append(Table(["", "baseline", "best"], rows))
    if data.verify is not None and best is not None and best.speedup is not None:
        ci = f"[{fmt(best.ci_low)}, {fmt(best.ci_high)}]" if best.ci_low is not None else "-"
        margin = data.verify.noise_margin
        s.blocks.append(
            Para(
                f"Speedup (median of interleaved baseline/candidate paired ratios): "
                f"{fmt(best.speedup)}x, interval {ci} ({_coverage(best)}); accepted: "
                f"{'yes' if best.accepted else 'NO'} (rule: the interval's lower bound > 1 + noise "
                f"margin {fmt(margin)} with at least 95% coverage, every round's median above it too, every "
                f"loss and eval invariant held). Candidate code patches: {_patch_list(best)}."
            )
        )
        cands = data.verify.candidates
        if cands:
            base_cfg = b.config if b else {}
            s.blocks.append(
                Table(
                    [
                        "verify candidate (vs baseline)",
                        "patches",
                        "accepted",
                        "speedup",
                        "interval (coverage)",
                        "rounds passed",
                        "reason",
                    ],
                    [
                        [
                            ", ".join(
                                f"{k}={v}"
                                for k, v in sorted(c.config.items())
                                if base_cfg.get(k) != v
                            )
                            or "(baseline knobs)",
                            _patch_list(c),
                            "yes" if c.accepted else "no",
                            fmt(c.speedup),
                            f"[{fmt(c.ci_low)}, {fmt(c.ci_high)}]"
                            + (f" ({c.ci_coverage:.1%})" if c.ci_coverage is not None else ""),
                            f"{sum(1 for r in c.rounds if r.passed)}/{len(c.rounds)}"
                            if c.rounds
                            else "-",
                            str(c.reason or "; ".join(r.reason for r in c.rounds if r.reason))[
                                :200
                            ],
                        ]
                        for c in cands
                    ],
                )
            )
    elif b and w and b.step_time_s and w.step_time_s:
        s.blocks.append(
            Para(
                f"Observed speedup (unverified, not paired): {b.step_time_s / w.step_time_s:.3g}x."
            )
        )
    return s


def _coverage(c: VerifiedCandidate) -> str:
    """What an interval covers, as verify recorded it (older studies: a bootstrap, unlabelled)."""
    if c.ci_coverage is None:
        return "a percentile bootstrap over pairs; its coverage was not recorded"
    return f"{c.ci_method}: it covers the true median {c.ci_coverage:.1%} of the time"


def _patch_list(c: VerifiedCandidate) -> str:
    """A verify record's patches with their digests (``none``: the knobs alone)."""
    return (
        ", ".join(f"{p.get('path')} (sha256 {str(p.get('sha256'))[:12]})" for p in c.patch_dicts())
        or "none"
    )


def _long_check(data: StudyData) -> Section:
    """The check past the trial's horizon of verify's candidate, and what apply did with it."""
    s = Section("Past the trial's horizon (long check)")
    lc = data.long_check
    if not lc:
        if data.verify is not None and data.verify.best is not None:
            s.blocks.append(
                Note(
                    "No long check ran on the verified candidate: `apply` refuses to promote it "
                    "without one unless told --skip-long-check."
                )
            )
    else:
        ck = lc.get("checkpoint") or {}
        diff = lc.get("max_abs_diff")
        s.blocks.append(
            Para(
                f"Verdict: {str(lc.get('status')).upper()} over {lc.get('horizon_steps')} optimizer steps (a trial: "
                f"{lc.get('trial_steps')}; asked {fmt(lc.get('horizon_factor'))}x, "
                f"budget {fmt(lc.get('budget_s'), ' s')}, "
                f"took {fmt(lc.get('wall_s'), ' s')}). Max |candidate - baseline| loss "
                f"{'-' if diff is None else f'{diff:.3g}'} against a tolerance of "
                f"{fmt(lc.get('loss_atol'))}; first step "
                f"out: {lc.get('first_step_out') if lc.get('first_step_out') is not None else 'none'}. Checkpoint "
                f"round trip at step {ck.get('step')}: {ck.get('status')}"
                + (f" ({ck.get('reason')})" if ck.get("reason") else "")
                + "."
                + (f" Reason: {lc.get('reason')}" if lc.get("reason") else "")
            )
        )
        for n in lc.get("notes") or []:
            s.blocks.append(Note(str(n)))
        out = plots.long_check_curves(data)
        if out is not None:
            s.blocks.append(Figure("long_check_curves", out[0], out[1]))
    for a in data.applied:
        s.blocks.append(
            Para(
                f"apply: branch {a.get('branch')} at {str(a.get('commit_sha'))[:12]}; "
                + (
                    "long check SKIPPED (--skip-long-check)"
                    if a.get("skip_long_check")
                    else str(a.get("long_check") or "")
                )
            )
        )
    return s


def _all_oom(data: StudyData) -> str | None:
    """The note when every trial ran out of memory (``infrarsi.report.memory``)."""
    from infrarsi.errors import InfrarsiError
    from infrarsi.report.memory import all_oom_verdict

    try:
        space = data.contract.search_space(data.study_dir)
    except InfrarsiError:
        space = None
    return all_oom_verdict(
        data.trials, data.contract, space, data.contract.workload_path or "WORKLOAD"
    )


def _config_diff(data: StudyData) -> Section:
    s = Section("The winning config, as a diff against the baseline")
    if not (data.baseline and data.best):
        s.blocks.append(Para("No best config yet (run and verify have not produced one)."))
        return s
    kd = knob_diff(data.baseline.config, data.best.config)
    s.blocks.append(
        Table(
            ["knob", "baseline", "best"],
            [[k, fmt(a), fmt(b)] for k, a, b in kd] or [["(none)", "", ""]],
        )
    )
    base_ds = deepspeed_config(data.contract, data.baseline.config, data.trials)
    best_ds = deepspeed_config(data.contract, data.best.config, data.trials)
    if base_ds is not None and best_ds is not None:
        s.blocks.append(
            Para(
                "DeepSpeed config (as built by infrarsi.execution.knobs.deepspeed), "
                "unified diff baseline -> best:"
            )
        )
        s.blocks.append(Code(json_diff(base_ds, best_ds) or "(identical)", "diff"))
    else:
        s.blocks.append(
            Para(
                "The DeepSpeed translation is unavailable here; the knob diff above "
                "is the complete change."
            )
        )
    return s


def _figures(data: StudyData) -> Section:
    s = Section("Figures")
    for name, fn in plots.FIGURES.items():
        out = fn(data)
        if out is None:
            s.blocks.append(
                Para(f"({name.replace('_', ' ')}: nothing to draw; {_why_empty(name)})")
            )
            continue
        png, caption = out
        s.blocks.append(Figure(name, png, caption))
    return s


def _why_empty(name: str) -> str:
    return {
        "best_so_far": "no run-stage trials logged",
        "time_vs_memory": "no trial with a step time and a peak memory",
        "predicted_vs_measured": "no trial recorded the optimizer's predicted peak memory (extra.ask_info)",
        "phases": "no phase timings recorded",
        "device_seconds": "no trials logged",
        "loss_curves": "no per-step loss recorded",
    }.get(name, "no data")


def _trials(data: StudyData) -> Section:
    s = Section("Every trial")
    base = data.baseline.config if data.baseline else {}
    rows = []
    for r in data.trials:
        diff = ", ".join(f"{k}={v}" for k, v in sorted(r.config.items()) if base.get(k) != v)
        rows.append(
            [
                r.trial_id,
                r.stage,
                r.status,
                diff or "(baseline)",
                fmt(r.step_time_s),
                fmt(r.tokens_per_s),
                fmt(r.mfu, digits=3),
                gib(r.peak_memory_bytes) + (" (>=, censored)" if r.memory_censored else ""),
                fmt(r.device_seconds, digits=3),
                (r.error or "")[:160],
            ]
        )
    s.blocks.append(
        Table(
            [
                "trial",
                "stage",
                "status",
                "config vs baseline",
                "step s",
                "tokens/s",
                "MFU",
                "peak memory",
                "device-s",
                "error / reason",
            ],
            rows,
        )
    )
    return s


def _proposals(data: StudyData) -> Section:
    """Each trial an agent or a person proposed (``infrarsi propose``), with the proposer's
    rationale, what it measured, and whether verify confirmed it."""
    s = Section("Proposals from agents and people")
    proposed = [r for r in data.trials if isinstance(r.extra.proposal, dict)]
    if not proposed:
        return s
    best = data.verify.best if data.verify is not None else None
    best_cfg = best.config if best is not None and best.accepted else None
    base_s = data.doctor.baseline_step_time_s if data.doctor else None
    rows = []
    for r in proposed:
        p = r.extra.proposal or {}
        speedup = (
            f"{base_s / r.step_time_s:.2f}x"
            if base_s and r.step_time_s and r.status == "ok"
            else "-"
        )
        verdict = (
            "verified best"
            if best_cfg is not None and best_cfg == r.config
            else (
                "refused: " + (r.error or "")[:120]
                if r.status != "ok"
                else "ran; not the verified best"
            )
        )
        rows.append(
            [
                str(p.get("proposal_id")),
                str(p.get("proposer")),
                str(p.get("why"))[:300],
                json.dumps(p.get("asked") or {}, sort_keys=True)
                + (f" + {p['patch']}" if p.get("patch") else ""),
                r.trial_id,
                r.status,
                fmt(r.step_time_s),
                speedup,
                verdict,
            ]
        )
    s.blocks.append(
        Table(
            [
                "proposal",
                "by",
                "why",
                "proposed",
                "trial",
                "status",
                "step s",
                "vs baseline",
                "outcome",
            ],
            rows,
        )
    )
    return s


def _device_seconds(data: StudyData) -> Section:
    s = Section("Device-seconds per status")
    acc: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for r in data.trials:
        acc[r.status][0] += 1
        acc[r.status][1] += r.device_seconds
    total = sum(v[1] for v in acc.values()) or 1.0
    s.blocks.append(
        Table(
            ["status", "trials", "device-seconds", "share"],
            [
                [k, int(v[0]), f"{v[1]:.1f}", f"{100 * v[1] / total:.1f}%"]
                for k, v in sorted(acc.items())
            ],
        )
    )
    return s


def _doctor(data: StudyData) -> Section:
    s = Section("Appendix: noise and calibration (doctor)")
    d = data.doctor
    if d is None:
        s.blocks.append(Para("doctor.json is missing: doctor has not run on this study."))
        return s
    st = d.step_time_s
    strag = d.stragglers
    rows = [
        ["baseline trials (ok / total)", f"{d.ok_trials} / {d.trials}"],
        ["median step time", fmt(st.median if st else None, " s")],
        ["run-to-run CV (between trials)", fmt(st.run_to_run_cv if st else None)],
        ["within-trial CV (between steps)", fmt(st.within_trial_cv if st else None)],
        ["noise margin verify must clear", fmt(d.noise_margin)],
        [
            "straggler",
            (
                f"{'rank ' + str(strag.rank) if strag.flag else 'none'} "
                f"(spread {fmt(strag.spread)}; {strag.rule or strag.reason})"
            )
            if strag
            else "-",
        ],
        ["loss run-to-run max |diff|", fmt(d.loss_run_to_run_max_abs_diff)],
        ["loss tolerance (floor)", f"{fmt(d.loss_tolerance)} ({fmt(d.loss_tolerance_floor)})"],
        ["eval run-to-run |diff|", fmt(d.eval_run_to_run_abs_diff)],
        ["measured peak FLOP/s per device", fmt(d.peak_flops_per_s)],
        ["device memory (as reported)", gib(d.device_memory_capacity_bytes)],
        ["baseline MFU", fmt(d.mfu)],
        ["setup / warm-up time", f"{fmt(d.setup_time_s, ' s')} / {fmt(d.warmup_time_s, ' s')}"],
    ]
    s.blocks.append(Table(["measure", "value"], rows))
    if d.phase_times_s:
        s.blocks.append(
            Table(
                ["phase", "median s per step"],
                [[k, fmt(v)] for k, v in sorted(d.phase_times_s.items())],
            )
        )
    if d.how_measured:
        s.blocks.append(Para(d.how_measured))
    return s


def _switches(c: Contract) -> str:
    sw = c.switches_in_force()
    recorded = (
        ""
        if c.switches is not None
        else " (not recorded: a contract from before switches; environment at report time)"
    )
    return (
        f"analytic prior {'on' if sw.analytic_prior else 'off'}, loss guard {'on' if sw.loss_guard else 'off'}, "
        f"experience bank {sw.bank or 'off'}{recorded}"
    )


def _audit(data: StudyData) -> Section:
    c = data.contract
    s = Section("Audit")
    inv = c.invariants
    atol, rtol = inv.loss_tolerance()
    rows = [
        ["contract hash", c.contract_hash],
        ["created / infrarsi version", f"{c.created_at} / {c.infrarsi_version}"],
        ["workload hash (sha256)", c.workload_hash],
        [
            "workload code git SHA",
            (c.workload_git_sha or "not in git")
            + (" (uncommitted changes at init!)" if c.workload_git_dirty else ""),
        ],
        ["search space (sha256)", f"{c.search_space_path} ({c.search_space_hash[:16]}...)"],
        ["editable knobs", ", ".join(c.editable.knobs)],
        ["editable file globs", ", ".join(c.editable.globs)],
        [
            "invariants",
            f"tokens/step {inv.tokens_per_step}, optimizer steps {inv.optimizer_steps} "
            f"(warm-up {inv.warmup_steps}), loss |diff| <= {atol:g} + {rtol:g}x|baseline| "
            f"({'calibrated' if inv.loss_calibrated else 'default, uncalibrated'})",
        ],
        ["memory capacity per device", c.memory_capacity.describe()],
        ["switches", _switches(c)],
        [
            "budgets",
            f"trials {fmt(c.budgets.trials)}, wall {fmt(c.budgets.wall_time_s, ' s')}, "
            f"device-hours {fmt(c.budgets.device_hours)}",
        ],
        [
            "amendments",
            "; ".join(
                f"{a.at} by {a.by}: {json.dumps(a.changes)} ({a.reason})" for a in c.amendments
            )
            or "none",
        ],
    ]
    s.blocks.append(Table(["item", "value"], rows))
    patches = sorted({p for r in data.trials for p in r.patches})
    vbest = data.verify.best if data.verify is not None else None
    if vbest is not None and vbest.patches is not None:
        best_patches = [str(p.get("path")) for p in vbest.patch_dicts()]
    elif data.best and data.best.rows:
        best_patches = sorted({p for r in data.best.rows for p in r.patches})
    else:
        best_patches = []
    if patches:
        from infrarsi.patches import Patch

        prow = []
        for p in patches:
            try:
                touched = ", ".join(Patch.load(_resolve(p, c)).paths)
            except Exception as e:
                touched = f"(unreadable: {e})"
            prow.append([p, "yes" if p in best_patches else "no", touched])
        s.blocks.append(Table(["patch", "in best", "paths touched"], prow))
    else:
        s.blocks.append(Para("No code patches were used: every change is a launch knob."))
    from infrarsi.report.bank_section import bank_blocks

    s.blocks.extend(bank_blocks(data))  # bank entries used to warm-start, and their effect
    return s


def _resolve(p: str, c: Any) -> str:
    path = Path(p)
    if path.is_absolute() or path.exists() or not c.workload_path:
        return str(path)
    for base in Path(c.workload_path).parents:
        if (base / path).exists():
            return str(base / path)
    return str(path)


def _methods(data: StudyData) -> Section:
    c = data.contract
    measures = sorted({r.memory_measure for r in data.trials if r.memory_measure})
    s = Section("How every figure was measured")
    s.blocks += [
        Para("Step time: " + c.invariants.timing_rules),
        Para(
            "Speedup: baseline and candidate are re-run interleaved (A B A B ...) by verify; "
            "each pair gives baseline_step_time / candidate_step_time, the speedup is the median "
            "of these ratios, and its interval the distribution-free order-statistic interval of "
            "the median, whose exact (binomial) coverage is printed beside it: [min, max] of 6 pairs "
            "covers 96.9%, of 3 pairs only 75%. Each candidate is its knobs with exactly the code "
            "patches (sha256 digests) it was measured with."
        ),
        Para(
            "tokens/s = tokens_per_step (counted by the harness) / step time. MFU = achieved "
            "model FLOP/s / (world size x the measured peak FLOP/s of one device)."
        ),
        Para(
            "Peak memory: max over ranks of the per-device peak over the timed steps, measured "
            f"as {', '.join(measures) or 'recorded by the trial engine'}. An out-of-memory "
            "trial only gives a lower bound (censored)."
        ),
        Para(
            "Device-seconds: devices x wall seconds each trial held them, failed trials "
            "included. Loss and eval-loss checks use the same seed and data order as the "
            "baseline; tokens and optimizer steps are counted by the harness, never taken "
            "from the workload."
        ),
    ]
    if data.simulated:
        s.blocks.append(Note("Rows marked simulated come from the analytic surrogate backend."))
    return s


__all__ = ["build_sections"]
