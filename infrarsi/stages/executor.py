"""The study executor: runs one trial of a study, checks it against the contract, and logs it.

Every stage that runs trials (doctor, run, verify) goes through ``StudyExecutor.run_trial``:

1. allocate a trial id that is never reused (``TrialIds``),
2. write an in-flight marker (a leftover marker after a crash is logged as interrupted on resume),
3. run the trial on the warm worker pool (``TrialRunner``),
4. check the invariants against the doctor's baseline reference (``check_invariants``),
5. append the row to the Arrow log (flushed and fsynced) and remove the marker.

During ``run`` the executor lives in a Ray actor (``num_cpus=0``) so that Ray Tune's trainables
share one warm worker pool across trials.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import structlog

from infrarsi.result import TrialResult
from infrarsi.stages.common import load_space
from infrarsi.study import InflightMarkers, StudyPaths, TrialIds

log = structlog.get_logger(__name__)


class StudyExecutor:
    """Runs, checks and logs the trials of one study directory."""

    def __init__(self, study_dir: str | Path, *, address: str | None = None,
                 check: bool = True) -> None:
        from infrarsi.contract import Contract
        from infrarsi.execution.runner import TrialRunner
        from infrarsi.log import TrialLogWriter, read_trials

        self.paths = StudyPaths(Path(study_dir))
        self.contract = Contract.load(self.paths.root)
        self.workload = self.contract.workload_model()
        self.space = load_space(self.contract, self.paths.root)
        self.check = check
        self.reference = self._load_reference()
        table = read_trials(self.paths.root)
        used = [str(t) for t in table.column("trial_id").to_pylist()] if table.num_rows else []
        self.markers = InflightMarkers(self.paths)
        used += [m["trial_id"] for m in self.markers.leftovers()]
        self.ids = TrialIds(used)
        self.writer = TrialLogWriter(self.paths.root)
        self.runner = TrialRunner(
            self.workload,
            memory_capacity_bytes=self.contract.memory_capacity_bytes,
            address=address,
        )

    def _load_reference(self) -> dict[str, Any] | None:
        if self.paths.doctor.exists():
            return dict(json.loads(self.paths.doctor.read_text()))
        return None

    def refresh_reference(self) -> None:
        self.reference = self._load_reference()

    def full_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config with every knob (inactive knobs at their defaults)."""
        return dict(self.space.validate(config))

    def run_trial(self, config: dict[str, Any], stage: str, *, patches: list[str] | None = None,
                  extra: dict[str, Any] | None = None, timeout_s: float | None = None) -> dict[str, Any]:
        """Run one trial and return its logged row as a dict (TrialResult fields)."""
        trial_id = self.ids.new(stage)
        self.markers.start(trial_id, stage, config, self.workload.world_size)
        log.info("trial.start", trial_id=trial_id, stage=stage, config=config)
        result: TrialResult = self.runner.run(
            config, trial_id=trial_id, stage=stage, patches=list(patches or []), timeout_s=timeout_s,
        )
        if extra:
            result.extra.update(extra)
        if self.check and result.status == "ok" and self.reference and self.reference.get("reference_loss"):
            self._apply_invariants(result)
        self.writer.write(result)
        self.markers.done(trial_id)
        log.info("trial.end", trial_id=trial_id, status=result.status, step_time_s=result.step_time_s,
                 peak_memory_bytes=result.peak_memory_bytes, error=result.error[:200])
        return result.to_dict()

    def _apply_invariants(self, result: TrialResult) -> None:
        from infrarsi.invariants import Reference, check_invariants

        ref = self.reference or {}
        reference = Reference(loss=list(ref["reference_loss"]), eval_loss=ref.get("reference_eval_loss"))
        ok, reasons = check_invariants(result, reference, self.contract)
        result.extra["invariants_checked"] = True
        if not ok:
            result.extra["invariant_reasons"] = reasons
            result.extra["measured_step_time_s"] = result.step_time_s
            result.status = "invariant_violation"
            result.error = "; ".join(reasons)

    def recover_inflight(self) -> list[dict[str, Any]]:
        """Log every trial left in flight by a killed harness as interrupted (status ``failed``,
        ``extra.interrupted``), so the log says what happened and the device time is counted.
        Interrupted rows do not count against the trial budget and do not teach the optimizer."""
        rows = []
        for m in self.markers.leftovers():
            now = time.time()
            started = float(m.get("started_at") or now)
            res = TrialResult(
                trial_id=m["trial_id"], stage=m.get("stage", "run"), config=m.get("config", {}),
                status="failed",
                error="interrupted: the harness was killed while this trial was in flight; "
                      "its measurements were lost, it is not counted against the budget",
                world_size=int(m.get("world_size") or 0),
                device_seconds=0.0, started_at=started, ended_at=started,
                extra={"interrupted": True},
            )
            self.writer.write(res)
            self.markers.done(m["trial_id"])
            rows.append(res.to_dict())
        return rows

    def close(self) -> None:
        self.runner.close()
        self.writer.close()

    def ping(self) -> bool:
        return True
