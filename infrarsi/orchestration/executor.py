"""The study executor: runs one trial of a study, checks it against the contract, and logs it.

Every stage that runs trials (doctor, run, verify) goes through ``StudyExecutor.run_trial``:

1. allocate a trial id that is never reused (``TrialIds``: reserved by an exclusive create in
   ``DIR/ids/``, so ids stay unique even if two writers got past the study lock),
2. write an in-flight marker (a leftover marker after a crash is logged as interrupted on resume),
3. run the trial on the warm worker pool (``TrialRunner``); a config with ``code_patch != none``
   runs with ``code_dir`` = a git worktree of the workload's repository with that patch applied
   (``infrarsi.patches.checkout``: made once per patch set's content per study, removed at
   ``close``), and its row's ``patches`` column names the patch file; the eval check's reference
   stays the runner's untouched ``code_dir``,
4. check the invariants against the doctor's baseline reference (``DoctorReport``,
   ``check_invariants``); once the doctor has a baseline, the ranks also get a loss guard that
   stops a trial at the first step whose loss leaves the contract's tolerance (such a trial can
   never pass, so the rest of its steps would only burn device time; measured on the demo: bf16
   trials ran 10 s steps), unless the contract's ``switches.loss_guard`` is off,
5. append the row to the Arrow log (flushed and fsynced) and remove the marker.

A horizon trial (``steps=``, the long check's: more optimizer steps than the contract's, and
optionally a checkpoint round trip, ``checkpoint_step=``) gets no loss guard and is not checked
against the doctor's trial-length reference; it is checked only against the reference and the
contract its caller passes (``horizon_reference``, ``horizon_contract``: the long baseline's curve
and the tolerance calibrated for that horizon).

During ``run`` the executor lives in a threaded Ray actor (``num_cpus=0``, pinned to the driver's
node, so the log is written where the study directory is): each Ray Tune trial reserves its
placement group and asks the executor to run its config there; trials in different placement
groups run at once, each on its own warm group.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from infrarsi.execution.rank_spec import LossGuard
from infrarsi.orchestration.common import load_space
from infrarsi.orchestration.trial_request import Horizon, TrialRequest
from infrarsi.result import Stage, TrialExtra, TrialResult
from infrarsi.study.doctor_report import DoctorReport
from infrarsi.study.paths import MARKER_STALE_S, InflightMarkers, StudyPaths, TrialIds

if TYPE_CHECKING:
    from infrarsi.study.candidate import Candidate
    from infrarsi.study.contract import Contract
    from infrarsi.study.invariants import Reference

log = structlog.get_logger(__name__)

TIMEOUT_FACTOR = 3.0
"""A trial is cut at this many times the baseline trial's wall time (plus the slack below)."""
TIMEOUT_SLACK_S = 60.0
"""Seconds added to every deadline (a cold worker start, a slow engine build)."""


class StudyExecutor:
    """Runs, checks and logs the trials of one study directory. ``pin`` (``doctor``, ``verify``):
    every trial runs in one placement group reserved for the executor's life, so all of them are
    measured on the same node(s); the ``run`` stage passes each Tune trial's own instead."""

    def __init__(
        self,
        study_dir: str | Path,
        *,
        address: str | None = None,
        check: bool = True,
        pin: bool = True,
    ) -> None:
        from infrarsi.execution.runner import TrialRunner
        from infrarsi.study.contract import Contract
        from infrarsi.study.trial_log import TrialLogWriter, read_trials

        self.paths = StudyPaths(Path(study_dir))
        self.contract = Contract.load(self.paths.root)
        self.switches = self.contract.switches_in_force()
        """The study's switches (the contract's record; the loss guard is read here)."""
        self.workload = self.contract.workload_model()
        self.space = load_space(self.contract, self.paths.root)
        self.check = check
        self.reference = self._load_reference()
        table = read_trials(self.paths.root)
        used = [str(t) for t in table.column("trial_id").to_pylist()] if table.num_rows else []
        self.markers = InflightMarkers(self.paths)
        used += [m["trial_id"] for m in self.markers.leftovers()]
        self.ids = TrialIds(used, reserve_dir=self.paths.trial_ids)
        self.writer = TrialLogWriter(self.paths.root)
        self.runner = TrialRunner(
            self.workload,
            memory_capacity_bytes=self.contract.memory_capacity.memory_capacity_bytes,
            address=address,
            space=self.space,
            pin=pin,
        )
        from infrarsi.patches.checkout import PatchedTrees

        self._trees = PatchedTrees(globs=self.contract.editable.globs)
        """The patched worktrees of this study's trials: one per patch set's content, removed at
        ``close``."""
        self._lock = threading.Lock()
        """Guards trial ids, markers, worktrees and the log writer across concurrent trials."""
        self._attempts: dict[str, tuple[threading.Event, dict[str, Any]]] = {}
        """``attempt_key`` -> (done, {"row": the logged row}) of every keyed call (``run_trial``)."""

    def _load_reference(self) -> DoctorReport | None:
        """The doctor's report (None before the doctor ran; a malformed one raises)."""
        return DoctorReport.load_if_present(self.paths.root)

    def refresh_reference(self) -> None:
        self.reference = self._load_reference()

    def full_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config with every knob (inactive knobs at their defaults)."""
        return dict(self.space.validate(config))

    def scope_violation(self, config: dict[str, Any]) -> str | None:
        """Why ``config`` changes a knob the contract does not name as editable (None: in scope)."""
        from infrarsi.orchestration.common import baseline_config, scope_violation

        if set(self.contract.editable.knobs) >= set(self.space.names):
            return None
        return scope_violation(
            self.contract, self.space, baseline_config(self.contract, self.paths.root), config
        )

    def run_trial(
        self,
        config: dict[str, Any],
        stage: Stage,
        *,
        patches: list[str] | None = None,
        extra: TrialExtra | None = None,
        timeout_s: float | None = None,
        placement_group: Any = None,
        patch_file: str | None = None,
        attempt_key: str | None = None,
        expect_sha256: list[str] | None = None,
        steps: int | None = None,
        checkpoint_step: int | None = None,
        horizon_reference: Reference | None = None,
        horizon_contract: Contract | None = None,
    ) -> dict[str, Any]:
        """Run one trial and return its logged row as a dict (TrialResult fields).

        ``steps``/``checkpoint_step``: a horizon trial (module docstring; ``TrialRunner.run``);
        ``horizon_reference`` (``invariants.Reference``) and ``horizon_contract`` (a ``Contract``
        whose invariants hold the horizon's step count and tolerances) check it; without a
        reference it is logged unchecked.

        Safe to call from several threads at once (the ``run`` stage's concurrent Tune trials,
        each with its own ``placement_group``): ids, markers, worktrees and the log are taken
        under a lock; the trials themselves run in parallel. ``patch_file`` (relative to the
        study directory: a proposal's patch) runs the config on a worktree with that patch.

        ``attempt_key`` (the ``run`` stage passes the Ray Tune trial id): a later call with the
        same key (Tune retrying a trial whose actor died, a node lost) runs nothing and returns
        the first call's row, waiting for it while it is still running, so a retried trial is
        never run or logged twice. A first call that raised leaves the key free.

        ``expect_sha256`` (verify, the long check): the digests the candidate's patches must
        have, in order; a patch file whose bytes changed since (or a different patch list) is
        refused before any rank starts, logged ``failed`` naming the file and both digests."""
        req = TrialRequest(
            config=config,
            stage=stage,
            patches=list(patches or []),
            extra=extra,
            timeout_s=timeout_s,
            placement_group=placement_group,
            patch_file=patch_file,
            expect_sha256=expect_sha256,
            horizon=None
            if steps is None
            else Horizon(int(steps), checkpoint_step, horizon_reference, horizon_contract),
        )
        return self._attempt(req, attempt_key)

    def _attempt(self, req: TrialRequest, attempt_key: str | None) -> dict[str, Any]:
        """Run ``req`` once per ``attempt_key`` (``run_trial``'s docstring)."""
        if attempt_key is None:
            return self._run_trial(req)
        with self._lock:
            first = attempt_key not in self._attempts
            if first:
                self._attempts[attempt_key] = (threading.Event(), {})
            done, box = self._attempts[attempt_key]
        if not first:
            done.wait()
            if "row" in box:
                log.warning(
                    "trial.retry_returns_first_attempt",
                    attempt_key=attempt_key,
                    trial_id=box["row"].get("trial_id"),
                )
                return dict(box["row"])
            return self._attempt(req, attempt_key)
        try:
            box["row"] = self._run_trial(req)
            return dict(box["row"])
        finally:
            if "row" not in box:
                with self._lock:
                    self._attempts.pop(attempt_key, None)
            done.set()

    def run_candidate(
        self,
        candidate: Candidate,
        stage: Stage,
        *,
        extra: TrialExtra | None = None,
        timeout_s: float | None = None,
        horizon: Horizon | None = None,
    ) -> dict[str, Any]:
        """Run a ``Candidate`` (``infrarsi.study.candidate``): its config with exactly its patches
        (a proposal's as ``patch_file``; a knob's through the config), refused when a patch's
        bytes no longer match its recorded digest; ``horizon``: a horizon trial's terms."""
        digests = [p.sha256 for p in candidate.patches]
        return self.run_trial(  # through run_trial, the one entry every trial takes
            dict(candidate.config),
            stage,
            extra=extra,
            timeout_s=timeout_s,
            patch_file=candidate.proposal_patch,
            expect_sha256=digests if all(digests) else None,
            steps=horizon.steps if horizon is not None else None,
            checkpoint_step=horizon.checkpoint_step if horizon is not None else None,
            horizon_reference=horizon.reference if horizon is not None else None,
            horizon_contract=horizon.contract if horizon is not None else None,
        )

    def _run_trial(self, req: TrialRequest) -> dict[str, Any]:
        """Run one trial as ``req`` asks and log its row; returns the row as a dict."""
        from infrarsi.errors import PatchConflictError, PatchError
        from infrarsi.patches.checkout import digest_mismatch

        config, stage, extra, horizon = req.config, req.stage, req.extra, req.horizon
        steps = horizon.steps if horizon is not None else None
        with self._lock:
            trial_id = self.ids.new(stage)
            scope = self.scope_violation(config)
            if (
                scope is not None
            ):  # refused before running: no source may widen the contract's scope
                log.warning("trial.out_of_scope", trial_id=trial_id, stage=stage, reason=scope)
                refused = self._failed(
                    trial_id, stage, config, list(req.patches), f"out of scope: {scope}"
                )
                refused.extra.out_of_scope = True
                if extra:
                    refused.extra.update(extra)
                self.writer.write(refused)
                return refused.to_dict()
            self.markers.start(trial_id, stage, config, self.workload.world_size)
            log.info("trial.start", trial_id=trial_id, stage=stage, config=config)
            patch_list = list(req.patches)
            digests: list[str] = []
            code_dir: str | None = None
            patch_extra = TrialExtra()
            patch_error: PatchError | None = None
            try:
                code_dir, patch_extra = self._code_dir_for(
                    config, patch_list, req.patch_file, digests
                )
                patch_error = digest_mismatch(patch_list, digests, req.expect_sha256)
            except PatchError as e:
                patch_error = e
        if patch_error is not None:  # refused before any rank starts: no device time spent
            result = self._failed(trial_id, stage, config, patch_list, f"code patch: {patch_error}")
            if isinstance(patch_error, PatchConflictError):
                result.extra.patch_conflict = str(patch_error)
        else:
            timeout_s = req.timeout_s if req.timeout_s is not None else self.default_timeout_s()
            result = self.runner.run(
                config,
                trial_id=trial_id,
                stage=stage,
                patches=patch_list,
                timeout_s=timeout_s,
                code_dir=code_dir,
                loss_guard=self.loss_guard(config) if steps is None else None,
                placement_group=req.placement_group,
                steps=steps,
                checkpoint_step=horizon.checkpoint_step if horizon is not None else None,
            )
            result.extra.update(patch_extra)
        result.patch_sha256 = list(digests)
        if steps is not None:
            result.extra.horizon_steps = int(steps)
        self.markers.ended(trial_id)  # its devices are free: the heartbeat stops
        if extra:
            result.extra.update(extra)
        if horizon is not None:
            if self.check and result.status == "ok" and horizon.reference is not None:
                self._apply_invariants(result, horizon.reference, horizon.contract or self.contract)
        elif (
            self.check
            and result.status == "ok"
            and self.reference is not None
            and self.reference.reference_loss
        ):
            self._apply_invariants(result)
        with self._lock:
            self.writer.write(result)
            self.markers.done(trial_id)
        log.info(
            "trial.end",
            trial_id=trial_id,
            status=result.status,
            step_time_s=result.step_time_s,
            peak_memory_bytes=result.peak_memory_bytes,
            error=result.error[:200],
        )
        return result.to_dict()

    def _code_dir_for(
        self,
        config: dict[str, Any],
        patch_list: list[str],
        patch_file: str | None = None,
        digests: list[str] | None = None,
    ) -> tuple[str | None, TrialExtra]:
        """The code dir of a config (None: the runner's own) and the row's patch fields; appends the
        patch files (repository-relative, every one of a set, or study-relative for a proposal's)
        to ``patch_list`` and their sha256 digests, as read now, to ``digests``. The tree itself
        is ``infrarsi.patches.checkout``'s, as for every trial."""
        from infrarsi.errors import PatchError
        from infrarsi.patches.checkout import PatchSet, knob_patch_set
        from infrarsi.patches.knob import config_patch

        digests = digests if digests is not None else []
        if patch_file is not None:
            path = (self.paths.root / patch_file).resolve()
            if not path.is_relative_to(self.paths.root.resolve()):
                raise PatchError(
                    f"patch {patch_file!r}: a proposal's patch lives in the study directory."
                )
            patches: PatchSet | None = PatchSet(files=(path,), logged=(patch_file,))
        else:  # a patch or a set `a+b` named by the config (None: the untouched code)
            patches = knob_patch_set(self.runner.code_dir, config_patch(config))
        if patches is None:
            return None, TrialExtra()
        # named in the row even when refused
        patch_list.extend(r for r in patches.logged if r not in patch_list)
        digests.extend(patches.digests())
        code = self._trees.code_for(self.runner.code_dir, patches)
        return code.code_dir, dataclasses.replace(code.extra)

    def _failed(
        self, trial_id: str, stage: Stage, config: dict[str, Any], patches: list[str], error: str
    ) -> TrialResult:
        now = time.time()
        return TrialResult(
            trial_id=trial_id,
            stage=stage,
            config=self.full_config(config),
            status="failed",
            error=error,
            patches=patches,
            world_size=self.workload.world_size,
            device_seconds=0.0,
            started_at=now,
            ended_at=now,
        )

    def loss_guard(self, config: Mapping[str, Any] | None = None) -> LossGuard | None:
        """The early-stop rule handed to the ranks once the doctor has a baseline loss trace: the
        contract's own per-step loss tolerance for ``config`` (wider for a knob of another
        arithmetic the doctor calibrated), so a trial is stopped only when the loss invariant
        has already failed (it could never be accepted); None while checks are off, before the
        doctor, or when the contract's ``switches.loss_guard`` is off."""
        ref = self.reference.reference_loss if self.reference is not None else []
        if not self.check or not ref or not self.switches.loss_guard:
            return None
        atol, rtol = self.contract.invariants.loss_tolerance(config)
        return LossGuard(reference=[float(x) for x in ref], atol=float(atol), rtol=float(rtol))

    def default_timeout_s(self) -> float | None:
        """Deadline of a trial once the doctor has measured the baseline: ``TIMEOUT_FACTOR`` x the
        baseline trial's wall time plus ``TIMEOUT_SLACK_S``. The baseline is the conservative
        recipe, so a candidate that slow cannot win; cutting it early frees the devices and the
        optimizer learns a ``timeout``. Before the doctor, the runner's default applies."""
        wall = self.reference.baseline_trial_wall_s if self.reference is not None else None
        if not wall:
            return None
        return TIMEOUT_FACTOR * float(wall) + TIMEOUT_SLACK_S

    def _apply_invariants(
        self,
        result: TrialResult,
        reference: Reference | None = None,
        contract: Contract | None = None,
    ) -> None:
        """Check ``result`` against ``reference`` under ``contract`` (default: the doctor's
        reference and the study's contract) and mark it ``invariant_violation`` with the reasons."""
        from infrarsi.study.invariants import Reference, check_invariants

        if reference is None:
            if self.reference is None:
                return
            reference = Reference(
                loss=list(self.reference.reference_loss),
                eval_loss=self.reference.reference_eval_loss,
                data_digests=list(self.reference.reference_data_digests),
            )
        ok, reasons = check_invariants(
            result, reference, contract if contract is not None else self.contract
        )
        result.extra.invariants_checked = True
        if not ok:
            result.extra.invariant_reasons = reasons
            result.extra.measured_step_time_s = result.step_time_s
            result.status = "invariant_violation"
            result.error = "; ".join(reasons)

    def recover_inflight(self, wait_s: float = MARKER_STALE_S + 1.0) -> list[dict[str, Any]]:
        """Log every trial left in flight by a killed harness as interrupted (status ``failed``,
        ``extra.interrupted``), so the log says what happened and the device time is counted.
        Interrupted rows do not count against the trial budget and do not teach the optimizer.

        A marker that may belong to a trial still running in another live process
        (``InflightMarkers.live_elsewhere``: a writer that got past the study lock, or a dying
        harness's actor) is given up to ``wait_s`` to go stale, and left alone if it does not:
        that trial's own row will come from its process, never a second one from here."""
        deadline = time.monotonic() + wait_s
        left = self.markers.leftovers()
        while any(self.markers.live_elsewhere(m) for m in left) and time.monotonic() < deadline:
            time.sleep(0.5)
            left = self.markers.leftovers()
        rows = []
        for m in left:
            if self.markers.live_elsewhere(m):
                log.warning(
                    "run.inflight_marker_alive",
                    trial_id=m["trial_id"],
                    host=m.get("host"),
                    pid=m.get("pid"),
                    note="another live process runs this trial; not logged as interrupted",
                )
                continue
            now = time.time()
            started = float(m.get("started_at") or now)
            ended = max(started, float(m.get("last_alive_at") or started))  # its last heartbeat
            world = int(m.get("world_size") or 0)
            res = TrialResult(
                trial_id=m["trial_id"],
                stage=m.get("stage", "run"),
                config=m.get("config", {}),
                status="failed",
                error="interrupted: the harness was killed while this trial was in flight; "
                "its measurements were lost, it is not counted against the budget; "
                "device_seconds counts its devices up to its last heartbeat (a lower bound)",
                world_size=world,
                device_seconds=world * (ended - started),
                started_at=started,
                ended_at=ended,
                extra=TrialExtra(interrupted=True, device_seconds_lower_bound=True),
            )
            self.writer.write(res)
            self.markers.done(m["trial_id"])
            rows.append(res.to_dict())
        return rows

    def close(self) -> None:
        self.markers.stop_heartbeats()
        self.runner.close()
        self.writer.close()
        self._trees.close()

    def ping(self) -> bool:
        return True
