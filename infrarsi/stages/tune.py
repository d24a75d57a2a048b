"""``infrarsi tune``: every stage in order on one study directory.

Every stage in order on one study directory (init, doctor, run, verify, report). A stage whose
output already exists is skipped, so re-running ``tune`` on the same directory resumes where it
stopped (``run`` resumes from the log). Each stage adds the study to the experience bank as it
ends, and ``tune`` once more at the end (``infrarsi.bank.feed.add_to_bank``): the bank the
contract names (``switches.bank``; ``--bank`` or ``$INFRARSI_BANK`` at init, ``off``
disables it), which warm-starts later studies of similar workloads (other clusters, other sizes).
Every event goes to the study's ``logs/infrarsi.jsonl`` (``infrarsi.structlog_config.study_log``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import structlog

from infrarsi.study.paths import StudyPaths

log = structlog.get_logger(__name__)


def tune_stage(
    workload_path: str | Path,
    study_dir: str | Path,
    *,
    trials: int | None = None,
    time_budget_s: float | None = None,
    memory_capacity_bytes: int | None = None,
    address: str | None = None,
    request: str = "",
    space: str | Path | None = None,
    editable_globs: list[str] | None = None,
    editable_knobs: list[str] | None = None,
    allow: list[str] | None = None,
    device_hours: float | None = None,
    doctor_repeats: int = 3,
    honest_change: bool = True,
    top_k: int = 3,
    pairs: int = 3,
    rounds: int = 2,
    loss_tolerance: float | None = None,
    seed: int = 0,
    progress: bool = True,
    analytic_prior: bool | None = None,
    loss_guard: bool | None = None,
    bank: str | None = None,
    concurrency: int | None = None,
    wait_s: float | None = None,
    long_check: bool = True,
    long_check_budget_s: float | None = None,
    horizon_factor: float | None = None,
    checkpoint: bool = True,
    pdf: bool = False,
) -> dict[str, Any]:
    """Run every stage on ``study_dir`` (``concurrency``: the run stage's, see ``run_stage``); the
    init options (``memory_capacity_bytes``, the switches
    ``analytic_prior``, ``loss_guard``, ``bank``, ...) only apply when the study has no contract
    yet (see ``init_stage``); ``doctor_repeats`` and ``honest_change`` are the doctor's,
    ``top_k``, ``pairs`` and ``rounds`` verify's, ``horizon_factor`` and ``checkpoint`` the long
    check's, ``pdf`` the report's. It logs ``tune.stage`` as each stage starts (the CLI's progress
    bars follow it). The study lock is held once across every stage (``wait_s``: how long
    to wait for another writer; None refuses at once with ``StudyLockedError``). When verify
    accepted a candidate, ``long_check`` runs the check past the trial's horizon on it (unless
    ``long_check.json`` already holds that very candidate's), which ``apply`` requires."""
    from infrarsi.bank.feed import add_to_bank
    from infrarsi.execution.runner import init_ray as ensure_ray
    from infrarsi.stages.doctor import doctor_stage
    from infrarsi.stages.init import check_init_options, init_stage
    from infrarsi.stages.report import write_report
    from infrarsi.stages.run import run_stage
    from infrarsi.stages.verify import verify_stage
    from infrarsi.structlog_config import study_log
    from infrarsi.study.lock import hold_study
    from infrarsi.study.paths import make_private_dir
    from infrarsi.study.trial_log import read_trials, rows

    paths = StudyPaths(Path(study_dir).resolve())
    if not paths.contract.exists():  # bad input fails before Ray starts
        check_init_options(
            study_dir=paths.root,
            trials=trials,
            wall_time_s=time_budget_s,
            device_hours=device_hours,
            loss_tolerance=loss_tolerance,
            editable_globs=editable_globs,
            long_check_budget_s=long_check_budget_s,
        )
    make_private_dir(paths.root)
    with (
        hold_study(paths.root, "tune", wait_s=wait_s),
        study_log(paths.root),
    ):  # the stages re-enter the lock
        ensure_ray(address)
        if not paths.contract.exists():
            log.info("tune.stage", stage="init")
            init_stage(
                workload_path,
                paths.root,
                request=request,
                space=space,
                editable_globs=editable_globs,
                editable_knobs=editable_knobs,
                allow=allow,
                memory_capacity_bytes=memory_capacity_bytes,
                trials=trials,
                wall_time_s=time_budget_s,
                device_hours=device_hours,
                loss_tolerance=loss_tolerance,
                analytic_prior=analytic_prior,
                loss_guard=loss_guard,
                bank=bank,
                long_check_budget_s=long_check_budget_s,
            )
            log.info("tune.init_done", study=str(paths.root))
        if not paths.doctor.exists():
            log.info("tune.stage", stage="doctor")
            doctor_stage(
                paths.root, repeats=doctor_repeats, address=address, honest_change=honest_change
            )
        existing = [r for r in rows(read_trials(paths.root)) if r.stage == "run"]
        log.info("tune.stage", stage="run")
        run_summary = run_stage(
            paths.root,
            trials=trials,
            resume=bool(existing),
            time_budget_s=time_budget_s,
            address=address,
            seed=seed,
            progress=progress,
            concurrency=concurrency,
        )
        if not paths.verify.exists():
            log.info("tune.stage", stage="verify")
            verify_stage(
                paths.root, top_k=top_k, pairs=pairs, rounds=rounds, address=address, seed=seed
            )
        verify = json.loads(paths.verify.read_text())
        checked = (
            _long_check(
                paths, verify, address, horizon_factor=horizon_factor, checkpoint=checkpoint
            )
            if long_check
            else None
        )
        log.info("tune.stage", stage="report")
        write_report(paths.root, pdf=pdf)
        return {
            "run": run_summary,
            "verify": verify,
            "long_check": checked,
            "report_html": str(paths.report_html),
            "report_md": str(paths.report_md),
            "bank": add_to_bank(paths.root),
        }


def _long_check(
    paths: StudyPaths,
    verify: dict[str, Any],
    address: str | None,
    *,
    horizon_factor: float | None = None,
    checkpoint: bool = True,
) -> dict[str, Any] | None:
    """The long check of verify's accepted candidate, run unless ``long_check.json`` already
    holds that candidate's (None when verify accepted nothing); ``horizon_factor`` None: the
    long check's default."""
    from infrarsi.stages.long_check import accepted_candidate, long_check_stage
    from infrarsi.study.long_check_report import LongCheckResult

    if not (verify.get("best") or {}).get("accepted"):
        return None
    cand = accepted_candidate(paths.root)
    if paths.long_check.exists():
        done = LongCheckResult.load(paths.root)
        if done.candidate_key and done.candidate_key == _full_key(paths, cand):
            return done.to_json()
    log.info("tune.stage", stage="long-check")
    kw: dict[str, Any] = {} if horizon_factor is None else {"horizon_factor": horizon_factor}
    return long_check_stage(
        paths.root, candidate=cand, address=address, checkpoint=checkpoint, **kw
    ).to_json()


def _full_key(paths: StudyPaths, cand: Any) -> str:
    """The key of ``cand`` with every knob of the space (as the long check records it)."""
    from infrarsi.orchestration.common import load_space
    from infrarsi.study.candidate import Candidate
    from infrarsi.study.contract import Contract

    space = load_space(Contract.load(paths.root), paths.root)
    return Candidate(config=dict(space.validate(dict(cand.config))), patches=cand.patches).key
