"""One study inside one device window: init, a short doctor, run, verify, report, under a deadline.

``scripts/gpu_check.sh`` runs it twice over: S5 on ``workloads/dense_1gpu.yaml`` (the
conservative baseline, ZeRO-3 micro-batch 1 with full checkpointing) and S7 on
``workloads/dense_1gpu_fast.yaml`` (the baseline takes the plain-PyTorch reference's micro-batch
8, no checkpointing and fused AdamW, on ZeRO-1 in bf16: a job already configured well, which knobs
alone only tie, so a verified win there has to come from the patches). The run stage gets what is left before
``--deadline-s`` after the doctor and a verify reserve sized from the doctor's own baseline wall
time (with room for compilation), so the study aims to end inside the window: when the run
stage leaves too little for verify, verify is skipped and the summary says so. The summary is
rewritten after every stage, so a window cut short still leaves one. Each stage's wall seconds
are measured here. It starts a new study (an existing one is refused: ``infrarsi tune`` goes on
with it).

It writes ``STUDY/gpu_study.json`` (a ``StudySummary``) and prints it: the seconds of each stage,
every trial's status, setup, compile (the warm-up steps' time above the measured steps') and
end-check seconds, verify's verdict (the winner's speed-up over the study's baseline measured
interleaved with it, with its interval), and, given ``--ref`` (``benchmarks/gpu_reference.py``'s
JSON from the same device call), the winner's step time against the plain loop's. That last ratio
is two separate measurements, one of each, not a paired statistic; verify's interval is the
paired one.

    python -m benchmarks.gpu_study workloads/dense_1gpu_fast.yaml /tmp/study --deadline-s 480 \\
        --trials 12 --ref run/ref.json

It runs on the CPU too (any workload; ``tests/benchmarks/test_gpu_study.py`` checks the summary).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

COMPILE_ALLOWANCE = 1.5
"""Verify's reserve counts each trial as this many baseline trials: a compiled candidate pays
its compilation in every fresh trial."""
MIN_RUN_S = 30.0
"""The run stage gets at least this long, even when verify's reserve leaves less."""
REPORT_S = 15.0
"""Seconds kept for the report."""
MIN_PAIRS_TO_ACCEPT = 6
"""Verify's interval reaches 95% coverage from 6 pairs on (``infrarsi.stats``); fewer measure
but can never accept."""


@dataclass
class TrialLine:
    """One trial of the study as the summary lists it."""

    trial_id: str
    """The trial log's id."""
    stage: str
    """doctor | run | verify."""
    status: str
    """ok | oom | failed | nan | invalid | timeout."""
    config: dict[str, Any]
    """The knob config (code patches under ``code_patch``)."""
    step_time_s: float | None
    """Median of the measured steps."""
    mfu: float | None
    """Model FLOPs utilisation by infrarsi's formula against the device's peak."""
    setup_time_s: float | None
    """Seconds from the rank's start to the first step (build, engine)."""
    compile_time_s: float | None
    """The warm-up steps' seconds above as many measured steps (torch.compile lands there)."""
    end_checks_time_s: float | None
    """Seconds of the end-of-trial checks (eval loss, checksums)."""
    reasons: list[str]
    """Why the invariants refused it, when they did."""


@dataclass
class StudySummary:
    """What one windowed study did and measured (``STUDY/gpu_study.json``)."""

    workload: str
    """The workload YAML the study tuned."""
    stage_wall_s: dict[str, float] = field(default_factory=dict)
    """Wall seconds of each stage (init, doctor, run, verify, report), measured by this driver."""
    run_budget_s: float = 0.0
    """Seconds the run stage was given."""
    trials: list[TrialLine] = field(default_factory=list)
    """Every trial, in log order."""
    statuses: dict[str, int] = field(default_factory=dict)
    """Trials per status (all stages)."""
    baseline_step_time_s: float | None = None
    """Median step time of the doctor's baseline trials."""
    winner_config: dict[str, Any] | None = None
    """Verify's accepted candidate (None when it accepted none)."""
    winner_speedup: float | None = None
    """Verify's speed-up of the winner over the study's baseline (median of paired ratios)."""
    winner_ci: tuple[float | None, float | None] = (None, None)
    """Verify's interval of that speed-up."""
    winner_step_time_s: float | None = None
    """Median step time of the winner's verify trials."""
    winner_mfu: float | None = None
    """MFU of the winner's verify trials (median)."""
    verify_reason: str = ""
    """Verify's reason for its verdict."""
    reference_step_time_s: float | None = None
    """The plain-PyTorch loop's step time from ``--ref`` (same device call), when given."""
    winner_vs_reference: float | None = None
    """Reference step time over the winner's: one measurement each, not a paired ratio."""


def _median(xs: list[float | None]) -> float | None:
    """The upper median of the values that are not None (None when there are none)."""
    got = sorted(x for x in xs if x is not None)
    return got[len(got) // 2] if got else None


def _first_reason(verify: Any) -> str:
    """The first candidate's reason for refusal, when verify accepted none."""
    return next((c.reason for c in verify.candidates if c.reason), "")


def summarize(
    study: str | Path,
    workload: str,
    stage_wall_s: dict[str, float],
    run_budget_s: float,
    ref: dict[str, Any] | None,
) -> StudySummary:
    """The summary of the study in ``study`` (its trial log and ``verify.json``)."""
    from infrarsi.study.contract import Contract
    from infrarsi.study.paths import StudyPaths
    from infrarsi.study.trial_log import read_trials, rows
    from infrarsi.study.verify_report import VerifyReport

    paths = StudyPaths(Path(study))
    out = StudySummary(workload=workload, stage_wall_s=stage_wall_s, run_budget_s=run_budget_s)
    trials = rows(read_trials(paths.root))
    n_warm = Contract.load(paths.root).invariants.warmup_steps
    for r in trials:
        compile_s = None
        if r.warmup_time_s is not None and r.step_time_s is not None and n_warm:
            compile_s = max(0.0, r.warmup_time_s - n_warm * r.step_time_s)
        out.trials.append(
            TrialLine(
                trial_id=r.trial_id,
                stage=r.stage,
                status=r.status,
                config={**r.config, **({"code_patch": "+".join(r.patches)} if r.patches else {})},
                step_time_s=r.step_time_s,
                mfu=r.mfu,
                setup_time_s=r.setup_time_s,
                compile_time_s=compile_s,
                end_checks_time_s=r.extra.end_checks_time_s,
                reasons=list(r.extra.invariant_reasons or []),
            )
        )
        out.statuses[r.status] = out.statuses.get(r.status, 0) + 1
    base = [r.step_time_s for r in trials if r.stage == "doctor" and r.extra.role == "baseline"]
    out.baseline_step_time_s = _median(base)
    verify = VerifyReport.load_if_present(paths.root)
    if verify is not None:
        best = verify.best
        out.verify_reason = best.reason if best else verify.reason or _first_reason(verify)
        if best is not None and best.accepted:
            cand = best.candidate
            out.winner_config = dict(cand.config)
            if cand.patches:
                out.winner_config["code_patch"] = "+".join(p.path for p in cand.patches)
            out.winner_speedup = best.speedup
            out.winner_ci = (best.ci_low, best.ci_high)
            ids = set(best.trial_ids)
            mine = [r for r in trials if r.trial_id in ids and r.status == "ok"]
            out.winner_step_time_s = _median([r.step_time_s for r in mine])
            out.winner_mfu = _median([r.mfu for r in mine])
    if ref and ref.get("step_time_s"):
        out.reference_step_time_s = float(ref["step_time_s"])
        if out.winner_step_time_s:
            out.winner_vs_reference = out.reference_step_time_s / out.winner_step_time_s
    return out


def run_study(
    workload: str,
    study: str,
    *,
    deadline_s: float,
    trials: int,
    doctor_repeats: int = 2,
    top_k: int = 1,
    pairs: int = MIN_PAIRS_TO_ACCEPT,
    verify: bool = True,
    ref: dict[str, Any] | None = None,
    allow: list[str] | None = None,
) -> StudySummary:
    """Every stage of one study on ``workload`` in ``study``, ending within ``deadline_s``."""
    from infrarsi.execution.runner import init_ray
    from infrarsi.stages.doctor import doctor_stage
    from infrarsi.stages.init import init_stage
    from infrarsi.stages.report import write_report
    from infrarsi.stages.run import run_stage
    from infrarsi.stages.verify import verify_stage
    from infrarsi.study.paths import StudyPaths

    if StudyPaths(Path(study)).contract.exists():
        raise SystemExit(
            f"gpu_study: {study} already holds a study; this driver starts a new one. Fix: pass a "
            f"new directory, or go on with `infrarsi tune {workload} --study {study}`."
        )
    end = time.monotonic() + deadline_s
    walls: dict[str, float] = {}
    budget = 0.0
    skipped = ""

    def save() -> StudySummary:
        """The summary as far as the study got (rewritten after each stage, so a window that
        runs out still leaves one)."""
        out = summarize(study, workload, walls, budget, ref)
        if skipped:
            out.verify_reason = skipped
        Path(study, "gpu_study.json").write_text(json.dumps(asdict(out), indent=1, default=str))
        return out

    def timed(name: str, fn: Any, *a: Any, **kw: Any) -> Any:
        t = time.monotonic()
        try:
            return fn(*a, **kw)
        finally:
            walls[name] = round(time.monotonic() - t, 1)
            print(f"gpu_study: {name} took {walls[name]:.1f} s", flush=True)
            with contextlib.suppress(Exception):  # before init's contract there is nothing to say
                save()

    init_ray(None)
    timed(
        "init",
        init_stage,
        workload,
        study,
        request="make this job faster, same learning",
        trials=trials,
        bank="off",
        allow=allow,
    )
    doc = timed("doctor", doctor_stage, study, repeats=doctor_repeats)
    # verify runs a baseline and a candidate trial per pair and candidate, each about a baseline
    # trial's wall time (the doctor measured it) with room for a candidate's compilation
    trial_s = float(doc.baseline_trial_wall_s or 60.0)
    need = 2 * pairs * top_k * trial_s * COMPILE_ALLOWANCE + 20.0 if verify else 0.0
    budget = max(MIN_RUN_S, end - time.monotonic() - need - REPORT_S)
    print(f"gpu_study: run stage budget {budget:.0f} s (verify reserve {need:.0f} s)", flush=True)
    timed("run", run_stage, study, trials=trials, time_budget_s=budget, progress=False)
    left = end - time.monotonic() - REPORT_S
    if verify and left < need:
        skipped = (
            f"verify skipped: {left:.0f} s left of the deadline, and {pairs} pairs x {top_k} "
            f"candidate(s) need about {need:.0f} s (from the doctor's {trial_s:.0f} s trials)"
        )
        print(f"gpu_study: {skipped}", flush=True)
    elif verify:
        timed("verify", verify_stage, study, top_k=top_k, pairs=pairs, rounds=1)
    timed("report", write_report, study)
    return save()


def main(argv: list[str] | None = None) -> StudySummary:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload")
    ap.add_argument("study")
    ap.add_argument("--deadline-s", type=float, required=True, help="wall seconds for every stage")
    ap.add_argument("--trials", type=int, default=12, help="run-stage trials at most")
    ap.add_argument("--doctor-repeats", type=int, default=2)
    ap.add_argument("--top-k", type=int, default=1, help="verify's candidates")
    ap.add_argument(
        "--pairs",
        type=int,
        default=MIN_PAIRS_TO_ACCEPT,
        help=f"verify's pairs per candidate (under {MIN_PAIRS_TO_ACCEPT} it cannot accept)",
    )
    ap.add_argument("--no-verify", action="store_true", help="give verify's time to the run stage")
    ap.add_argument("--ref", help="benchmarks/gpu_reference.py's JSON from the same device call")
    ap.add_argument(
        "--allow", action="append", default=[], help="init --allow (e.g. float8_linear)"
    )
    a = ap.parse_args(argv)
    ref = None
    if a.ref and os.path.exists(a.ref):
        try:
            ref = json.loads(Path(a.ref).read_text().strip().splitlines()[-1])
        except (ValueError, IndexError):
            ref = None
    s = run_study(
        a.workload,
        a.study,
        deadline_s=a.deadline_s,
        trials=a.trials,
        doctor_repeats=a.doctor_repeats,
        top_k=a.top_k,
        pairs=a.pairs,
        verify=not a.no_verify,
        ref=ref,
        allow=a.allow,
    )
    print("gpu_study:", json.dumps(asdict(s), default=str))
    return s


if __name__ == "__main__":
    main()
