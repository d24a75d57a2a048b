"""Stage 4b, ``long-check``: the accepted candidate past the trial's horizon, before promotion.

A change can equal the baseline for a trial's few steps and drift after (a counter in the model,
a schedule, a numeric instability that grows), and a promoted config must still restart cleanly
from a mid-run checkpoint. So, for the candidate verify accepted, before ``apply``:

1. **Horizon.** ``horizon_factor`` x the trial's optimizer steps (default
   ``DEFAULT_HORIZON_FACTOR``), capped so that the estimated cost fits the contract's budget
   (``budgets.long_check_s``; ``long_check_analysis.plan_horizon``, from the doctor's baseline
   step time and set-up, the candidate's verified speed and the calibration run's step time). A
   budget that buys no step past the trial's horizon skips the check (``skipped``: not passed).
2. **Baseline** for the horizon (stage ``long``, role ``long_baseline``): the reference curve.
3. **Calibration** for the horizon (role ``long_calibration``): the doctor's fastest honest
   change of the baseline (another micro-batch split or ZeRO stage, which trains the same job by
   another route), run for the same horizon. Its largest loss difference from the baseline
   widens the contract's tolerance by the doctor's own rule (``HONEST_CHANGE_FACTOR`` x, never
   narrower than the contract's: ``long_check_analysis.horizon_tolerance``), because honest
   differences grow with steps (NOTES: "gaps grow with more steps") and the contract's tolerance
   was measured over a trial's. What it costs: one more run of the horizon, at the honest
   change's speed (the fastest one is picked); it is the price of not guessing how honest noise
   grows. None in scope: the contract's tolerance holds unwidened.
   Steps 2 and 3 do not depend on the candidate: a run logged by an earlier long check of the
   same study with the same config and horizon is reused (``_reusable``).
4. **Candidate** for the horizon (role ``long_candidate``), with the candidate's patch if any,
   and a DeepSpeed checkpoint round trip at mid-horizon (``checkpoint_trip``: save, train on,
   rebuild the engine from scratch, load, continue). Its row is checked by the executor against
   the long baseline under the horizon's tolerances (``check_invariants``: loss per step, eval
   loss, tokens, steps, replicas).

Passed = every step's |candidate - baseline| loss within the horizon's tolerance, every other
invariant kept, and the continued losses after the restart equal the uninterrupted run's within
the dtype's tolerance (``long_check_analysis.checkpoint_tolerance``). The verdict
(``LongCheckResult``) names the first step that left the tolerance, the largest difference and the
checkpoint verdict with its reason, and is written to ``DIR/long_check.json``.

Why one module: it is the stage's run order (baseline, calibration, candidate past the horizon) and
its verdict; the pure planning and comparisons are in ``long_check_analysis``.
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from infrarsi.errors import ConfigError, StudyError
from infrarsi.result import Stage, TrialExtra, TrialResult
from infrarsi.stages.doctor_analysis import HONEST_CHANGE_FACTOR
from infrarsi.stages.long_check_analysis import (
    DEFAULT_HORIZON_FACTOR,
    MIN_CALIBRATED_FACTOR,
    HorizonPlan,
    checkpoint_tolerance,
    checkpoint_verdict,
    choose_plan,
    first_step_out,
    horizon_tolerance,
    max_abs_diff,
)
from infrarsi.study.candidate import Candidate, PatchRef, file_sha256
from infrarsi.study.doctor_report import DoctorReport
from infrarsi.study.long_check_report import (
    Calibration,
    CheckpointVerdict,
    LongCheckResult,
    Verdict,
)
from infrarsi.study.paths import StudyPaths
from infrarsi.study.verify_report import VerifyReport

if TYPE_CHECKING:
    from infrarsi.orchestration.executor import StudyExecutor

log = structlog.get_logger(__name__)

STAGE: Stage = "long"
"""The trial log's ``stage`` of the long check's rows (ids ``long-NNNN``)."""
START_S = 10.0
"""Estimated seconds a check with its own executor spends before its first step: connecting to
(or starting) Ray and starting the first worker group (measured 6-10 s on dense_debug)."""
TIMEOUT_FACTOR = 3.0
"""A long run is cut at this many times its estimated seconds (plus ``TIMEOUT_SLACK_S``)."""
TIMEOUT_SLACK_S = 120.0
"""Seconds added to every long run's deadline."""


def accepted_candidate(study_dir: str | Path) -> Candidate:
    """The candidate verify accepted (its knobs and its patches with their digests), from
    ``DIR/verify.json``'s ``best``. ``ConfigError`` (exit code 2) when verify has not run, accepted
    nothing, or wrote a best without its patches (an older verify)."""
    paths = StudyPaths(Path(study_dir))
    if not paths.verify.exists():
        raise ConfigError(
            f"{paths.verify}: missing; the long check needs the candidate verify accepted. "
            f"Fix: run `infrarsi verify {paths.root}` first."
        )
    try:
        best = VerifyReport.read(paths.verify).best
    except StudyError as e:
        raise ConfigError(str(e)) from None
    if best is None or best.accepted is not True:
        raise ConfigError(
            f"{paths.verify}: field 'best': rule: an accepted candidate; value: "
            f"{'null' if best is None else best.model_dump_json()[:200]}. No candidate to check past "
            f"the trial's horizon: verify accepted none (nothing to promote)."
        )
    if not best.config:
        raise ConfigError(
            f"{paths.verify}: field 'best.config': rule: a knob config (a JSON object); value: "
            f"{best.config!r}. Fix: re-run `infrarsi verify {paths.root}`."
        )
    if best.patches is None:
        raise ConfigError(
            f"{paths.verify}: field 'best.patches': rule: a list of the candidate's patches with "
            f"their sha256 (written by verify); value: None. Fix: re-run `infrarsi verify "
            f"{paths.root}`."
        )
    cand = best.candidate
    own = [p.path for p in cand.patches if p.source == "proposal"]
    if len(own) > 1:
        raise ConfigError(
            f"{paths.verify}: field 'best.patches': rule: at most one proposal patch (a file in the "
            f"study directory); value: {own}."
        )
    return cand


def long_check_stage(
    study_dir: str | Path,
    *,
    candidate: Candidate | None = None,
    config: dict[str, Any] | None = None,
    patch_file: str | None = None,
    horizon_factor: float = DEFAULT_HORIZON_FACTOR,
    budget_s: float | None = None,
    address: str | None = None,
    executor: StudyExecutor | None = None,
    checkpoint: bool = True,
    wait_s: float | None = None,
) -> LongCheckResult:
    """``_long_check_stage`` holding the study lock (``wait_s``: how long to wait for another
    writer). The candidate is ``candidate`` (its patches checked against their digests), else
    ``config`` with ``patch_file`` (a proposal's patch, relative to the study directory)."""
    from infrarsi.study.lock import hold_study

    if candidate is None:
        if config is None:
            raise ConfigError("long_check_stage: rule: pass `candidate` (a Candidate) or `config`.")
        patches = (
            (PatchRef(patch_file, file_sha256(Path(study_dir) / patch_file), "proposal"),)
            if patch_file
            else ()
        )
        candidate = Candidate(config=dict(config), patches=patches)
    with hold_study(study_dir, "long_check", wait_s=wait_s):
        return _long_check_stage(
            study_dir,
            candidate=candidate,
            horizon_factor=horizon_factor,
            budget_s=budget_s,
            address=address,
            executor=executor,
            checkpoint=checkpoint,
        )


def _long_check_stage(
    study_dir: str | Path,
    *,
    candidate: Candidate,
    horizon_factor: float,
    budget_s: float | None,
    address: str | None,
    executor: StudyExecutor | None,
    checkpoint: bool,
) -> LongCheckResult:
    """Run the long check of ``candidate`` (its knobs, and exactly its patches: a patch whose
    bytes changed since verify is refused) and write ``DIR/long_check.json`` (module docstring).
    ``budget_s`` overrides the contract's
    ``budgets.long_check_s``; ``checkpoint=False`` skips the round trip (the verdict says so and
    does not require it). ``executor``: an open ``StudyExecutor`` to use and leave open."""
    from infrarsi.orchestration.executor import StudyExecutor
    from infrarsi.study.contract import Contract

    t0 = time.perf_counter()
    config, patch_file = dict(candidate.config), candidate.proposal_patch
    paths = StudyPaths(Path(study_dir).resolve())
    if (
        isinstance(horizon_factor, bool)
        or not isinstance(horizon_factor, (int, float))
        or not math.isfinite(horizon_factor)
        or horizon_factor <= 1
    ):
        raise ConfigError(
            f"--horizon-factor: rule: a finite number > 1 (the horizon in trials' steps); "
            f"got {horizon_factor!r}. Fix: e.g. --horizon-factor 10."
        )
    contract = Contract.load(paths.root)
    budget = contract.budgets.long_check_budget_s if budget_s is None else float(budget_s)
    if not math.isfinite(budget) or budget <= 0:
        raise ConfigError(
            f"--budget: rule: a finite number of seconds > 0; got {budget_s!r}. Fix: e.g. --budget 90s."
        )
    doctor = DoctorReport.load(paths.root)
    trial_steps = int(contract.invariants.optimizer_steps)
    loss_atol, loss_rtol = contract.invariants.loss_tolerance(config)
    base = _Result(
        config=dict(config),
        trial_steps=trial_steps,
        horizon_factor=float(horizon_factor),
        budget=budget,
        contract_atol=loss_atol,
        rtol=loss_rtol,
        eval_atol=contract.invariants.eval_tolerance(config)[0],
    )
    if contract.workload_model().backend == "surrogate":
        return base.skipped(
            paths, "the surrogate backend answers from a model; nothing trains past any horizon", t0
        )

    from infrarsi.study.trial_log import read_trials, rows

    ex = executor if executor is not None else StudyExecutor(paths.root, address=address)
    try:
        baseline_cfg = ex.full_config(dict(ex.workload.baseline))
        cand_cfg = ex.full_config(dict(config))
        base.config = cand_cfg
        base.candidate_key = Candidate(config=cand_cfg, patches=candidate.patches).key
        base.patches = [p.path for p in candidate.patches]
        logged = rows(read_trials(paths.root))
        base_step = float(doctor.baseline_step_time_s or 0.0)
        calib = _calibration_choice(doctor, logged, base_step)
        overhead = _overhead_s(doctor, trial_steps)
        plan, calibrate = choose_plan(
            trial_steps=trial_steps,
            factor=float(horizon_factor),
            budget_s=budget,
            baseline_step_s=base_step,
            candidate_step_s=_candidate_step_s(paths.root, cand_cfg, patch_file, logged, base_step),
            calibration_step_s=calib[2] if calib else None,
            overhead_s=overhead,
            checkpoint=checkpoint,
            start_s=START_S if executor is None else 0.0,
        )
        if calib is not None and not calibrate:
            base.notes.append(
                f"no calibration run: with one, the budget of {budget:.0f} s bought less than "
                f"{MIN_CALIBRATED_FACTOR:g}x the trial's steps, so the horizon got the time and the "
                f"contract's tolerance holds unwidened"
            )
            calib = None
        base.plan = plan
        if plan.horizon_steps <= trial_steps:
            need = plan.fixed_s + 2 * trial_steps * plan.per_step_s
            return base.skipped(
                paths,
                (
                    f"the budget of {budget:.0f} s buys {max(plan.horizon_steps, 0)} steps, not more than a trial's "
                    f"{trial_steps}: nothing would be checked past the trial's horizon (about {need:.0f} s buys 2x). "
                    f"Fix: a larger budgets.long_check_s (init --long-check-budget) or `long-check --budget`"
                ),
                t0,
            )
        h = plan.horizon_steps

        def timeout(step_s: float, steps: float) -> float:
            return TIMEOUT_FACTOR * (overhead + steps * step_s) + TIMEOUT_SLACK_S

        log.info(
            "long_check.start",
            horizon_steps=h,
            trial_steps=trial_steps,
            budget_s=budget,
            estimated_cost_s=round(plan.estimated_cost_s, 1),
        )
        b_row = _reusable(logged, "long_baseline", baseline_cfg, h) or TrialResult.from_dict(
            ex.run_trial(
                baseline_cfg,
                STAGE,
                steps=h,
                timeout_s=timeout(base_step, h),
                extra=TrialExtra(role="long_baseline"),
            )
        )
        base.trial_ids["baseline"] = b_row.trial_id
        base.baseline_loss = list(b_row.loss)
        if b_row.status != "ok":
            return base.failed(
                paths,
                f"the baseline's {h}-step run ended {b_row.status} ({b_row.error[:300]}), so "
                f"there is no reference past the trial's horizon",
                t0,
            )
        calibration = None
        if calib is not None:
            knob, cfg, step_s = calib
            c_row = _reusable(logged, "long_calibration", cfg, h) or TrialResult.from_dict(
                ex.run_trial(
                    cfg,
                    STAGE,
                    steps=h,
                    timeout_s=timeout(step_s, h),
                    extra=TrialExtra(role="long_calibration", changed=knob),
                )
            )
            base.trial_ids["calibration"] = c_row.trial_id
            base.calibration_loss = list(c_row.loss)
            ok = c_row.status == "ok"
            ev = (
                abs(c_row.eval_loss - b_row.eval_loss)
                if ok and c_row.eval_loss is not None and b_row.eval_loss is not None
                else None
            )
            calibration = Calibration(
                changed=knob,
                config=cfg,
                status=c_row.status,
                trial_id=c_row.trial_id,
                loss_max_abs_diff=max_abs_diff(c_row.loss, b_row.loss)[0] if ok else None,
                eval_loss_abs_diff=ev,
            )
        base.calibration = calibration
        base.loss_atol = horizon_tolerance(
            base.contract_atol, calibration.loss_max_abs_diff if calibration else None
        )
        base.eval_atol = max(
            base.eval_atol,
            HONEST_CHANGE_FACTOR
            * float(
                calibration.eval_loss_abs_diff
                if calibration and calibration.eval_loss_abs_diff is not None
                else 0.0
            ),
        )
        from infrarsi.orchestration.trial_request import Horizon
        from infrarsi.study.invariants import Reference

        inv = contract.invariants.model_copy(
            update={"optimizer_steps": h, "loss_atol": base.loss_atol, "eval_atol": base.eval_atol}
        )
        horizon_contract = contract.model_copy(update={"invariants": inv})
        horizon_ref = Reference.of(b_row)
        if horizon_ref is not None and not (ex.reference and ex.reference.reference_data_digests):
            horizon_ref.data_digests = []  # the doctor found the data check does not apply
        cand_step = plan.per_step_s - base_step - (calib[2] if calib else 0.0)
        r_row = TrialResult.from_dict(
            ex.run_candidate(
                Candidate(config=cand_cfg, patches=candidate.patches),
                STAGE,
                timeout_s=timeout(cand_step, h) + overhead,
                horizon=Horizon(
                    steps=h,
                    checkpoint_step=plan.checkpoint_step if checkpoint else None,
                    reference=horizon_ref,
                    contract=horizon_contract,
                ),
                extra=TrialExtra(role="long_candidate"),
            )
        )
    finally:
        if executor is None:
            ex.close()
    base.trial_ids["candidate"] = r_row.trial_id
    base.candidate_loss = list(r_row.loss)
    base.patches = list(r_row.patches)
    dtype = str(cand_cfg.get("dtype", "fp32"))
    ck_atol = checkpoint_tolerance(dtype, doctor.loss_run_to_run_max_abs_diff)
    if checkpoint:
        base.checkpoint = checkpoint_verdict(r_row.extra.checkpoint_round_trip, r_row.loss, ck_atol)
    else:
        base.checkpoint = _no_checkpoint(ck_atol, "not asked for (--skip-checkpoint)")
    return base.judge(paths, r_row, checkpoint_required=checkpoint, t0=t0)


def _reusable(
    logged: list[TrialResult], role: str, config: dict[str, Any], horizon: int
) -> TrialResult | None:
    """An earlier long check's ``ok`` run of the untouched code with this role, config and horizon
    (the last one), or None. The baseline and the calibration do not depend on the candidate, so
    a second candidate's check (or a re-run) reuses them instead of paying for them again."""
    found = [
        r
        for r in logged
        if r.stage == STAGE
        and r.ok
        and r.extra.role == role
        and not r.patches
        and r.config == config
        and int(r.extra.horizon_steps or 0) == horizon
        and len(r.loss) == horizon
    ]
    if found:
        log.info("long_check.reuse", role=role, trial_id=found[-1].trial_id)
    return found[-1] if found else None


def _no_checkpoint(atol: float, why: str) -> CheckpointVerdict:
    return CheckpointVerdict(
        status="skipped",
        reason=why,
        step=None,
        atol=atol,
        max_abs_diff=None,
        continued_steps=0,
        save_s=0.0,
        restart_s=0.0,
        checkpoint_bytes=0,
    )


def _calibration_choice(
    doctor: DoctorReport, logged: list[TrialResult], base_step: float
) -> tuple[str, dict[str, Any], float] | None:
    """(knob, config, its step time in seconds) of the doctor's honest change that ended ok and ran
    fastest (its doctor row's step time; the baseline's when unknown), or None when there is none."""
    best: tuple[str, dict[str, Any], float] | None = None
    for c in doctor.honest_changes:
        if c.status != "ok" or c.loss_max_abs_diff is None:
            continue
        times = [
            float(r.step_time_s)
            for r in logged
            if r.stage == "doctor"
            and r.ok
            and r.step_time_s
            and r.extra.role == "honest_change"
            and r.config == c.config
        ]
        step = statistics.median(times) if times else base_step
        if best is None or step < best[2]:
            best = (c.changed, dict(c.config), step)
    return best


def _candidate_step_s(
    study: Path,
    config: dict[str, Any],
    patch_file: str | None,
    logged: list[TrialResult],
    base_step: float,
) -> float:
    """The candidate's seconds per step: the baseline's over verify's speed-up when verify.json's
    best is this config, else the median step time of its ok rows, else the baseline's."""
    try:
        report = VerifyReport.load_if_present(study)
    except StudyError:
        report = None
    best = report.best if report is not None else None
    if best is not None and best.config == config and best.speedup is not None and best.speedup > 0:
        return base_step / float(best.speedup)
    times = [
        float(r.step_time_s)
        for r in logged
        if r.ok
        and r.step_time_s
        and r.config == config
        and r.stage in ("run", "verify")
        and (patch_file is None or patch_file in r.patches)
    ]
    return statistics.median(times) if times else base_step


def _overhead_s(doctor: DoctorReport, trial_steps: int) -> float:
    """Seconds of one run beyond its steps (set-up, end checks, the group's hand-off), from the
    doctor's baseline trials: their median wall time less their steps."""
    wall = float(doctor.baseline_trial_wall_s or 0.0)
    step = float(doctor.baseline_step_time_s or 0.0)
    return max(0.0, wall - trial_steps * step)


class _Result:
    """The verdict under construction (``LongCheckResult`` once judged)."""

    def __init__(
        self,
        *,
        config: dict[str, Any],
        trial_steps: int,
        horizon_factor: float,
        budget: float,
        contract_atol: float,
        rtol: float,
        eval_atol: float,
    ) -> None:
        self.config = config
        self.trial_steps = trial_steps
        self.horizon_factor = horizon_factor
        self.budget = budget
        self.contract_atol = float(contract_atol)
        self.loss_atol = float(contract_atol)
        self.rtol = float(rtol)
        self.eval_atol = float(eval_atol)
        self.plan: HorizonPlan | None = None
        self.calibration: Calibration | None = None
        self.checkpoint = _no_checkpoint(0.0, "the long check did not get that far")
        self.patches: list[str] = []
        self.candidate_key = ""
        self.baseline_loss: list[float] = []
        self.candidate_loss: list[float] = []
        self.calibration_loss: list[float] = []
        self.trial_ids: dict[str, str] = {}
        self.notes: list[str] = []

    def _record(
        self,
        status: Verdict,
        reason: str,
        t0: float,
        *,
        first: int | None = None,
        diff: tuple[float | None, int | None] = (None, None),
        reasons: list[str] | None = None,
    ) -> LongCheckResult:
        plan = self.plan
        return LongCheckResult(
            status=status,
            reason=reason,
            config=self.config,
            patches=self.patches,
            candidate_key=self.candidate_key,
            trial_steps=self.trial_steps,
            horizon_steps=plan.horizon_steps if plan else 0,
            horizon_factor=self.horizon_factor,
            budget_s=self.budget,
            estimated_cost_s=plan.estimated_cost_s if plan else 0.0,
            capped_by_budget=plan.capped_by_budget if plan else False,
            wall_s=time.perf_counter() - t0,
            loss_atol=self.loss_atol,
            loss_rtol=self.rtol,
            contract_loss_atol=self.contract_atol,
            eval_atol=self.eval_atol,
            calibration=self.calibration,
            first_step_out=first,
            max_abs_diff=diff[0],
            max_abs_diff_step=diff[1],
            invariant_reasons=list(reasons or []),
            checkpoint=self.checkpoint,
            baseline_loss=self.baseline_loss,
            candidate_loss=self.candidate_loss,
            calibration_loss=self.calibration_loss,
            trial_ids=dict(self.trial_ids),
            notes=list(self.notes),
            at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        )

    def _save(self, paths: StudyPaths, res: LongCheckResult) -> LongCheckResult:
        res.save(paths.root)
        log.info(
            "long_check.done",
            status=res.status,
            horizon_steps=res.horizon_steps,
            wall_s=round(res.wall_s, 1),
            first_step_out=res.first_step_out,
            checkpoint=res.checkpoint.status,
            reason=res.reason[:300],
        )
        return res

    def skipped(self, paths: StudyPaths, reason: str, t0: float) -> LongCheckResult:
        return self._save(paths, self._record("skipped", reason, t0))

    def failed(self, paths: StudyPaths, reason: str, t0: float) -> LongCheckResult:
        return self._save(paths, self._record("failed", reason, t0))

    def judge(
        self, paths: StudyPaths, row: TrialResult, *, checkpoint_required: bool, t0: float
    ) -> LongCheckResult:
        """The verdict on the candidate's horizon row (module docstring)."""
        h = self.plan.horizon_steps if self.plan else 0
        problems: list[str] = []
        reasons = [str(x) for x in row.extra.invariant_reasons or []]
        if row.status not in ("ok", "invariant_violation"):
            problems.append(f"the candidate's {h}-step run ended {row.status}: {row.error[:400]}")
        first = first_step_out(row.loss, self.baseline_loss, self.loss_atol, self.rtol)
        diff = max_abs_diff(row.loss, self.baseline_loss)
        if first is not None:
            x, b = row.loss[first], self.baseline_loss[first]
            where = "past" if first >= self.trial_steps else "within"
            problems.append(
                f"loss left the horizon's tolerance at step {first} ({where} the trial's {self.trial_steps} steps): "
                f"candidate {x:.6g} vs baseline {b:.6g}, |diff| {abs(x - b):.3g} > tolerance "
                f"{self.loss_atol + self.rtol * abs(b):.3g}; largest |diff| {diff[0]:.3g} at step {diff[1]}"
            )
        elif row.ok and len(row.loss) < h:
            problems.append(f"the candidate's run recorded {len(row.loss)} of {h} steps")
        problems += [r for r in reasons if not r.startswith("loss:")]
        ck = self.checkpoint
        if ck.status == "failed" or (checkpoint_required and ck.status != "passed"):
            problems.append(f"checkpoint round trip {ck.status}: {ck.reason}")
        if problems and self.notes:
            problems += self.notes
        status: Verdict = "failed" if problems else "passed"
        return self._save(
            paths,
            self._record(status, "; ".join(problems), t0, first=first, diff=diff, reasons=reasons),
        )


__all__ = ["STAGE", "accepted_candidate", "long_check_stage"]
