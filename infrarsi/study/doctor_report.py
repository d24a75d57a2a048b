"""``DoctorReport``: the typed record of ``DIR/doctor.json``, the doctor's calibration of a study.

``doctor`` writes it (``DoctorReport.save(DIR)``); ``run``, ``verify``, the study executor, the
report and the experience bank read it (``DoctorReport.load(DIR)``, or ``load_if_present``), so
the keys of ``doctor.json`` are named in this one place. The JSON keeps the keys earlier versions
wrote, so old study directories load; a missing or malformed file raises ``StudyError`` naming
the file, the field, the rule, the value and the fix::

    report = DoctorReport.load(DIR)
    report.step_time_s.median, report.noise_margin, report.reference_loss
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from infrarsi.errors import StudyError
from infrarsi.result import Status
from infrarsi.study.arithmetic_tolerance import ArithmeticTolerance
from infrarsi.study.json_record import read_json_record
from infrarsi.study.paths import StudyPaths, write_json_atomic


class _Record(BaseModel):
    # Keys a later version adds are ignored by this one (old and new directories both load).
    model_config = ConfigDict(extra="ignore")


class StepTimeNoise(_Record):
    """The baseline's step time and its noise, over the doctor's repeated baseline trials."""

    median: float = Field(gt=0)
    """Median over the ok baseline trials of each trial's step_time_s (seconds per optimizer step)."""
    per_trial: list[float] = Field(default_factory=list)
    """step_time_s of each ok baseline trial, seconds, in run order."""
    run_to_run_cv: float = Field(0.0, ge=0)
    """Coefficient of variation of ``per_trial`` (between trials), a fraction."""
    within_trial_cv: float = Field(0.0, ge=0)
    """Median over trials of the CV of one trial's per-step samples (between steps), a fraction."""


class Stragglers(_Record):
    """Whether one rank is consistently slower than the others (``doctor_analysis._stragglers``)."""

    flag: bool = False
    """True when one rank is the slowest in every trial by more than the rule's margin."""
    rank: int | None = None
    """The straggling rank (None when not flagged)."""
    spread: float = 0.0
    """Median over trials of (slowest rank's step time / median rank's) - 1, a fraction."""
    slowest_rank_per_trial: list[int] = Field(default_factory=list)
    """Index of the slowest rank in each trial."""
    rule: str = ""
    """The rule the flag applies, in words."""
    reason: str = ""
    """Why no straggler could be looked for (e.g. fewer than two ranks); empty otherwise."""


class ToleranceInForce(_Record):
    """A loss tolerance the contract holds after the doctor's calibration."""

    atol: float = Field(ge=0)
    """Absolute tolerance (loss units): |candidate - baseline| <= atol + rtol x |baseline|."""
    rtol: float = Field(0.0, ge=0)
    """Relative tolerance, a fraction."""
    source: str | None = None
    """Who set it: ``doctor`` (calibrated) or ``user (init)``; None for the eval tolerance."""


class HonestChange(_Record):
    """One honest-change trial of the doctor: a config that trains the same job (same tokens,
    same optimizer steps) by another route, and what it did to the loss."""

    changed: str
    """The knob changed from the baseline (``micro_batch_size``, ``zero_stage``, or a knob of
    another arithmetic such as ``float8_linear``, which may ride on the ZeRO change's config)."""
    config: dict[str, Any]
    """The trial's config (the baseline with ``changed`` set otherwise)."""
    status: Status
    """How the trial ended (``ok``, ``oom``...); only ``ok`` trials count."""
    loss_max_abs_diff: float | None = Field(None, ge=0)
    """Largest per-step |loss - reference loss|, loss units (None unless ``ok``)."""
    eval_loss_abs_diff: float | None = Field(None, ge=0)
    """|held-out eval loss - the baseline's median eval loss|, loss units (None unless ``ok``
    with an eval loss)."""


class DataOrder(_Record):
    """The doctor's data-order check: did identical baseline runs feed the model the same token
    ids in the same optimizer steps (``TrialExtra.data_digests``), and did the honest changes?"""

    repeatable: bool
    """Every ok baseline trial fed the same data in every step (False: the doctor refuses the
    job, since its losses cannot be compared step by step)."""
    first_differing_step: int | None = None
    """The first optimizer step whose digests differ between baseline trials (None: none)."""
    differing_trial_ids: list[str] = Field(default_factory=list)
    """Two baseline trials that differ there (empty: none)."""
    same_under_honest_changes: bool | None = None
    """The honest-change trials (another micro-batch split, another ZeRO stage) fed the
    baseline's data too (None: none ran ok). False: the job's data depend on the batch split,
    so the data invariant is not applied to candidates."""


class DoctorReport(_Record):
    """What ``doctor`` measured on the untouched baseline (``DIR/doctor.json``).

    Only ``trials``, ``ok_trials`` and ``statuses`` are always present; the rest needs at least
    one ok baseline trial. ``load`` requires ``REQUIRED_TO_LOAD`` (a report written on success).
    """

    trials: int = Field(ge=0)
    """Baseline trials the doctor ran."""
    ok_trials: int = Field(ge=0)
    """How many of them ended ``ok`` (noise and tolerance need at least two)."""
    statuses: dict[Status, int] = Field(default_factory=dict)
    """Status -> count over the baseline trials."""
    step_time_s: StepTimeNoise | None = None
    """The baseline's step time (seconds per optimizer step) and its noise."""
    noise_margin: float | None = Field(None, ge=0)
    """The fraction a speed-up's CI lower bound must clear in verify (``1 + noise_margin``)."""
    stragglers: Stragglers | None = None
    """The straggler check over the baseline trials' per-rank step times."""
    phase_times_s: dict[str, float] = Field(default_factory=dict)
    """Phase -> median seconds per step (data, forward, backward, optimizer, communication)."""
    peak_memory_bytes: int | None = Field(None, ge=0)
    """Largest per-device peak memory of the baseline trials, bytes."""
    device_memory_capacity_bytes: int | None = Field(None, gt=0)
    """Memory of one device as the hardware reports it, bytes (None: not reported). The contract's
    memory capacity falls back to it when neither ``--memory-capacity`` nor the workload set one."""
    tokens_per_s: float | None = Field(None, ge=0)
    """Median throughput of the baseline, tokens per second."""
    mfu: float | None = None
    """Median model FLOPs utilisation of the baseline, a fraction (None: no peak FLOP/s measured)."""
    peak_flops_per_s: float | None = Field(None, gt=0)
    """Median measured peak FLOP/s of one device (None: no probe)."""
    hardware: dict[str, Any] = Field(default_factory=dict)
    """The first ok baseline trial's hardware dict (device kind, count, hosts, versions...)."""
    loss_run_to_run_max_abs_diff: float | None = Field(None, ge=0)
    """Largest per-step spread of the training loss across the baseline trials, loss units."""
    honest_changes: list[HonestChange] = Field(default_factory=list)
    """The honest-change trials (the baseline with another micro-batch split; with another ZeRO
    stage; with an allowed knob of another arithmetic on) and what each did to the loss (empty:
    none in scope)."""
    loss_honest_change_max_abs_diff: float | None = Field(None, ge=0)
    """Largest per-step |loss - reference loss| over the honest changes that ended ``ok``, loss
    units (None: none did)."""
    loss_tolerance: float | None = Field(None, ge=0)
    """The measured loss tolerance: max(floor, 10 x run-to-run spread, 3 x the largest
    honest-change difference), loss units."""
    loss_tolerance_floor: float | None = Field(None, ge=0)
    """The floor the measured loss tolerance never goes under, loss units."""
    reference_loss: list[float] = Field(default_factory=list)
    """Per-step median training loss of the baseline trials: the invariant check's reference
    (empty: none recorded, so the loss invariant and the ranks' loss guard are not applied)."""
    reference_eval_loss: float | None = None
    """Median held-out eval loss of the baseline trials (None: no eval)."""
    data_order: DataOrder | None = None
    """The data-order check (None: the trials recorded no data digests)."""
    reference_data_digests: list[int] = Field(default_factory=list)
    """The baseline's per-step data digests: the data invariant's reference (empty: not applied,
    because no digests were recorded, runs differed, or an honest change fed other data)."""
    eval_run_to_run_abs_diff: float | None = Field(None, ge=0)
    """Spread of the eval loss across the baseline trials, loss units."""
    eval_tolerance: float | None = Field(None, ge=0)
    """The measured eval-loss tolerance: max(floor, 10 x run-to-run spread, 3 x the largest
    honest-change eval difference), loss units."""
    arithmetic_tolerances: dict[str, ArithmeticTolerance] = Field(default_factory=dict)
    """Knob of another arithmetic -> the tolerances of candidates that turn it on: the study's
    own, widened to 3 x that knob's honest-change differences (its trials count only here, never
    in ``loss_tolerance``/``eval_tolerance``); empty when no such knob was measured ``ok``."""
    tokens_per_step: int | None = Field(None, ge=0)
    """Tokens per optimizer step the harness counted in the baseline."""
    optimizer_steps: int | None = Field(None, ge=0)
    """Optimizer steps the harness counted in the baseline."""
    baseline_trial_wall_s: float | None = Field(None, ge=0)
    """Median wall time of one baseline trial, seconds (sets the trial deadline)."""
    setup_time_s: float | None = Field(None, ge=0)
    """Median engine build time of the baseline, seconds."""
    warmup_time_s: float | None = Field(None, ge=0)
    """Median total time of the baseline's warm-up steps, seconds."""
    baseline_config: dict[str, Any] = Field(default_factory=dict)
    """The full baseline config the doctor ran (every knob)."""
    trial_ids: list[str] = Field(default_factory=list)
    """Trial ids of the doctor's baseline trials, in run order."""
    loss_tolerance_in_force: ToleranceInForce | None = None
    """The per-step loss tolerance the contract holds after calibration."""
    eval_tolerance_in_force: ToleranceInForce | None = None
    """The eval-loss tolerance the contract holds after calibration."""
    how_measured: str = ""
    """How the figures above were measured, in words."""

    REQUIRED_TO_LOAD: ClassVar[tuple[str, ...]] = ("step_time_s", "noise_margin")
    """Fields a saved report must have for the later stages (run, verify) to use it."""

    @model_validator(mode="after")
    def _ok_within_total(self) -> DoctorReport:
        if self.ok_trials > self.trials:
            raise ValueError(f"ok_trials ({self.ok_trials}) must be <= trials ({self.trials})")
        return self

    # ------------------------------------------------------------------------- files
    def to_json(self) -> dict[str, Any]:
        """The JSON-able dict written to ``doctor.json`` (the keys earlier versions wrote)."""
        return self.model_dump(mode="json")

    def write(self, path: str | Path) -> Path:
        """Write the report to ``path`` atomically."""
        p = Path(path)
        write_json_atomic(p, self.to_json())
        return p

    def save(self, study_dir: str | Path) -> Path:
        """Write ``DIR/doctor.json`` atomically."""
        return self.write(StudyPaths(Path(study_dir)).doctor)

    def save_failed(self, study_dir: str | Path) -> Path:
        """Write ``DIR/doctor.failed.json`` (the analysis of a doctor that could not calibrate)."""
        return self.write(StudyPaths(Path(study_dir)).doctor_failed)

    @classmethod
    def read(cls, path: str | Path, *, require: tuple[str, ...] = ()) -> DoctorReport:
        """Parse the report at ``path``; ``StudyError`` naming file, field, rule, value and fix."""
        p = Path(path)
        fix = (
            f"Fix: re-run `infrarsi doctor {p.parent}` (it rewrites {p.name}), or restore the file."
        )
        report = read_json_record(p, cls, "the doctor's report", fix)
        for name in require:
            if getattr(report, name) is None:
                raise StudyError(
                    f"{p}: field {name!r}: rule: required once doctor succeeded; value: "
                    f"<absent>. {fix}"
                )
        return report

    @classmethod
    def load(cls, study_dir: str | Path) -> DoctorReport:
        """Read ``DIR/doctor.json``; ``StudyError`` when it is missing (run doctor) or malformed."""
        paths = StudyPaths(Path(study_dir))
        paths.require("the doctor's report", paths.doctor, "doctor")
        return cls.read(paths.doctor, require=cls.REQUIRED_TO_LOAD)

    @classmethod
    def load_if_present(cls, study_dir: str | Path) -> DoctorReport | None:
        """``load``, or None when the doctor has not run (a malformed file still raises)."""
        if not StudyPaths(Path(study_dir)).doctor.exists():
            return None
        return cls.load(study_dir)

    # ------------------------------------------------------------------------- derived
    @property
    def baseline_step_time_s(self) -> float | None:
        """The baseline's median step time, seconds (None before any ok baseline trial)."""
        return self.step_time_s.median if self.step_time_s is not None else None


__all__ = ["DoctorReport", "StepTimeNoise", "Stragglers", "ToleranceInForce"]
