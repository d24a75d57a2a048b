"""``LongCheckResult``: the typed record of ``DIR/long_check.json``, the long check's verdict.

``infrarsi.stages.long_check`` writes it; ``apply`` (which refuses a candidate without a passed
long check unless told ``--skip-long-check``) and the report read it with
``LongCheckResult.load(DIR)``. A missing or malformed file raises ``StudyError`` naming the file,
the field, the rule, the value and the fix.

JSON layout (``to_json``)::

    {"status": "passed" | "failed" | "skipped", "reason": str,
     "config": {...}, "patches": [...],
     "trial_steps": int, "horizon_steps": int, "horizon_factor": float, "budget_s": float,
     "estimated_cost_s": float, "capped_by_budget": bool, "wall_s": float,
     "loss_atol": float, "loss_rtol": float, "contract_loss_atol": float, "eval_atol": float,
     "calibration": {"changed": str, "config": {...}, "loss_max_abs_diff": float | null,
                     "eval_loss_abs_diff": float | null, "trial_id": str, "status": str} | null,
     "first_step_out": int | null, "max_abs_diff": float | null, "max_abs_diff_step": int | null,
     "invariant_reasons": [...],
     "checkpoint": {"status": ..., "reason": str, "step": int | null, "atol": float,
                    "max_abs_diff": float | null, "continued_steps": int, "save_s": float,
                    "restart_s": float, "checkpoint_bytes": int},
     "baseline_loss": [...], "candidate_loss": [...], "calibration_loss": [...],
     "trial_ids": {"baseline": str, "calibration": str, "candidate": str}, "notes": [...], "at": str}
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from infrarsi.errors import StudyError
from infrarsi.result import Status
from infrarsi.study.paths import StudyPaths, write_json_atomic

Verdict = Literal["passed", "failed", "skipped"]
"""``passed``: every check held. ``failed``: one did not (or a run it needs did not end ok).
``skipped``: it was not tried (the budget buys no step past the trial's horizon; a simulated
backend). Only ``passed`` lets ``apply`` promote without ``--skip-long-check``."""
VERDICTS: tuple[str, ...] = get_args(Verdict)


@dataclass(frozen=True)
class Calibration:
    """The honest change of the baseline run for the same horizon, whose loss difference from the
    baseline widens the horizon's tolerance (``long_check_analysis.horizon_tolerance``)."""

    changed: str
    """The knob changed from the baseline (the doctor's honest change: ``micro_batch_size`` or
    ``zero_stage``)."""
    config: dict[str, Any]
    """Its full config."""
    status: Status
    """How its long run ended (only ``ok`` widens the tolerance)."""
    trial_id: str
    """Its row in the trial log (stage ``long``)."""
    loss_max_abs_diff: float | None
    """Largest per-step |its loss - the baseline's| over the horizon, loss units (None unless ok)."""
    eval_loss_abs_diff: float | None
    """|its held-out eval loss - the baseline's|, loss units (None unless both have one)."""


@dataclass(frozen=True)
class CheckpointVerdict:
    """The checkpoint round trip at mid-horizon under the candidate's config: save, train on
    uninterrupted, rebuild the engine, load, continue; the continued losses must equal the
    uninterrupted run's within the dtype's tolerance."""

    status: Verdict
    """``passed``, ``failed`` (load failed, or the continued losses left the tolerance, or it did
    not run to the end) or ``skipped`` (not asked for, or training stopped before the step)."""
    reason: str
    """Why it did not pass (the load error names the missing / unexpected parameter keys); empty
    when it passed."""
    step: int | None
    """Optimizer steps done when the checkpoint was saved (None: no round trip)."""
    atol: float
    """Per-step tolerance of |continued - uninterrupted| loss, loss units
    (``long_check_analysis.checkpoint_tolerance``)."""
    max_abs_diff: float | None
    """Largest per-step |continued - uninterrupted| loss, loss units (None: nothing continued)."""
    continued_steps: int
    """Steps trained after the restart."""
    save_s: float
    """Seconds ``engine.save_checkpoint`` took."""
    restart_s: float
    """Seconds of the rebuild and ``engine.load_checkpoint``."""
    checkpoint_bytes: int
    """Bytes of the checkpoint files rank 0 saw on its node."""


@dataclass(frozen=True)
class LongCheckResult:
    """The long check of one candidate (``DIR/long_check.json``; layout in the module docstring)."""

    status: Verdict
    """The verdict: ``passed`` only when the loss curves agree over the horizon, the horizon
    run kept every invariant (eval loss included) and the checkpoint round trip passed."""
    reason: str
    """Why it did not pass, in words (every failed check); empty when it passed."""
    config: dict[str, Any]
    """The candidate's full knob config."""
    patches: list[str]
    """The patch files the candidate ran with (as its log row names them)."""
    trial_steps: int
    """Optimizer steps of an ordinary trial (the contract's, warm-up included)."""
    horizon_steps: int
    """Optimizer steps of the long runs (warm-up included); 0 when skipped before choosing."""
    horizon_factor: float
    """The horizon asked for, in trials' steps (the horizon is ``factor x trial_steps`` unless the
    budget caps it)."""
    budget_s: float
    """The contract's long-check budget, seconds (``budgets.long_check_s``)."""
    estimated_cost_s: float
    """What the chosen horizon was estimated to cost, seconds (``long_check_analysis.plan_horizon``)."""
    capped_by_budget: bool
    """True when the budget, not the factor, set the horizon."""
    wall_s: float
    """Seconds the check really took."""
    loss_atol: float
    """Per-step absolute loss tolerance over the horizon (the contract's, widened by the
    calibration), loss units."""
    loss_rtol: float
    """Per-step relative loss tolerance (the contract's), a fraction."""
    contract_loss_atol: float
    """The contract's per-step absolute loss tolerance (calibrated on a trial's steps)."""
    eval_atol: float
    """Absolute tolerance of the held-out eval loss after the horizon, loss units."""
    calibration: Calibration | None
    """The honest change run for the horizon (None: none in scope, the contract's tolerance holds)."""
    first_step_out: int | None
    """First optimizer step (0-based) whose |candidate - baseline| loss left the tolerance (None:
    none did)."""
    max_abs_diff: float | None
    """Largest per-step |candidate - baseline| loss over the horizon, loss units (None: no curves)."""
    max_abs_diff_step: int | None
    """The step of ``max_abs_diff``."""
    invariant_reasons: list[str]
    """The horizon run's invariant violations (``check_invariants`` against the long baseline
    under the horizon's tolerances), each naming what broke."""
    checkpoint: CheckpointVerdict
    """The checkpoint round trip's verdict."""
    baseline_loss: list[float] = field(default_factory=list)
    """The baseline's loss per step over the horizon."""
    candidate_loss: list[float] = field(default_factory=list)
    """The candidate's (uninterrupted) loss per step over the horizon."""
    calibration_loss: list[float] = field(default_factory=list)
    """The honest change's loss per step over the horizon (empty: none)."""
    trial_ids: dict[str, str] = field(default_factory=dict)
    """Role (``baseline``, ``calibration``, ``candidate``) -> trial id in the log."""
    notes: list[str] = field(default_factory=list)
    """What the check left out and why (e.g. no calibration run when the budget could not buy one)."""
    at: str = ""
    """ISO-8601 UTC time the check ended."""
    candidate_key: str = ""
    """``Candidate.key`` of what was checked (knobs and patch digests): ``apply`` promotes a
    candidate only with a passed check of this very key ("" in records of older versions)."""

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    # ------------------------------------------------------------------------- files
    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, study_dir: str | Path) -> Path:
        """Write ``DIR/long_check.json`` atomically."""
        path = StudyPaths(Path(study_dir)).long_check
        write_json_atomic(path, self.to_json())
        return path

    @classmethod
    def from_json(cls, data: dict[str, Any], *, source: str = "long_check.json") -> LongCheckResult:
        """Parse ``to_json`` output; ``StudyError`` naming ``source``, the field, the rule and the value."""
        fix = "Fix: re-run `infrarsi long-check DIR` (it rewrites the file)."
        if not isinstance(data, dict):
            raise StudyError(f"{source}: rule: a JSON object; got {type(data).__name__}. {fix}")
        for name, allowed in (("status", VERDICTS),):
            if data.get(name) not in allowed:
                raise StudyError(
                    f"{source}: field {name!r}: rule: one of {list(allowed)}; value: "
                    f"{data.get(name)!r}. {fix}"
                )
        ck = data.get("checkpoint")
        if not isinstance(ck, dict) or ck.get("status") not in VERDICTS:
            raise StudyError(
                f"{source}: field 'checkpoint.status': rule: one of {list(VERDICTS)}; value: "
                f"{ck.get('status') if isinstance(ck, dict) else ck!r}. {fix}"
            )
        try:
            cal = data.get("calibration")
            return cls(
                **{
                    **{
                        k: v
                        for k, v in data.items()
                        if k in {f.name for f in dataclasses.fields(cls)}
                    },
                    "checkpoint": CheckpointVerdict(**ck),
                    "calibration": Calibration(**cal) if isinstance(cal, dict) else None,
                }
            )
        except TypeError as e:
            raise StudyError(f"{source}: rule: the long check's fields ({e}). {fix}") from None

    @classmethod
    def load(cls, study_dir: str | Path) -> LongCheckResult:
        """Read ``DIR/long_check.json``; ``StudyError`` when missing (run the long check) or malformed."""
        paths = StudyPaths(Path(study_dir))
        paths.require("the long check's verdict", paths.long_check, "long-check")
        try:
            data = json.loads(paths.long_check.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise StudyError(
                f"{paths.long_check}: rule: readable JSON ({e}). Fix: re-run "
                f"`infrarsi long-check {paths.root}`."
            ) from None
        return cls.from_json(data, source=str(paths.long_check))


__all__ = ["VERDICTS", "Calibration", "CheckpointVerdict", "LongCheckResult", "Verdict"]
