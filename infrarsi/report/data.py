"""What the report shows, gathered from a study directory alone.

``load_study(DIR)`` reads ``contract.yaml``, ``doctor.json`` (``DoctorReport``), ``trials/``
(``infrarsi.study.trial_log``) and ``verify.json`` (each optional except the contract) and derives
the baseline and best rows the figures use.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infrarsi.errors import StudyError
from infrarsi.result import TrialResult
from infrarsi.study.contract import Contract
from infrarsi.study.doctor_report import DoctorReport
from infrarsi.study.paths import StudyPaths
from infrarsi.study.trial_log import read_results
from infrarsi.study.verify_report import VerifyReport


def read_trial_rows(study_dir: Path) -> list[TrialResult]:
    """Every logged trial of the study, in start order (``infrarsi.study.trial_log.read_results``)."""
    return sorted(read_results(study_dir), key=lambda r: (r.started_at, r.trial_id))


def config_key(cfg: dict[str, Any]) -> str:
    return json.dumps(cfg, sort_keys=True, default=str)


def median_or_none(values: list[float | None]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return statistics.median(vals) if vals else None


@dataclass
class Side:
    """Baseline or best: the rows measuring one config and their summary figures."""

    label: str
    """``baseline`` or ``best``."""
    config: dict[str, Any]
    """Its knob values."""
    rows: list[TrialResult]
    """The ok rows measuring it (verify rows when verify ran, else doctor/run rows)."""
    source: str
    """Which stage's rows were used."""

    @property
    def step_time_s(self) -> float | None:
        return median_or_none([r.step_time_s for r in self.rows])

    @property
    def tokens_per_s(self) -> float | None:
        return median_or_none([r.tokens_per_s for r in self.rows])

    @property
    def mfu(self) -> float | None:
        return median_or_none([r.mfu for r in self.rows])

    @property
    def peak_memory_bytes(self) -> int | None:
        vals = [r.peak_memory_bytes for r in self.rows if r.peak_memory_bytes is not None]
        return max(vals) if vals else None

    def phases(self) -> dict[str, float]:
        acc: dict[str, list[float]] = {}
        for r in self.rows:
            for k, v in (r.phase_times_s or {}).items():
                acc.setdefault(k, []).append(float(v))
        return {k: statistics.median(v) for k, v in acc.items()}

    def loss(self) -> list[float]:
        return list(self.rows[0].loss) if self.rows else []


@dataclass
class StudyData:
    """Everything the report needs."""

    study_dir: Path
    """The study directory."""
    contract: Contract
    """The verified contract."""
    doctor: DoctorReport | None
    """``doctor.json`` (None when doctor has not run)."""
    verify: VerifyReport | None
    """``verify.json`` (None when verify has not run, or its file is unreadable: a note says so)."""
    trials: list[TrialResult]
    """Every logged trial, in start order."""
    baseline: Side | None = None
    """The baseline's figures."""
    best: Side | None = None
    """The verified best's figures (or the best observed run config, flagged unverified)."""
    best_verified: bool = False
    """True when ``best`` comes from verify.json with ``accepted: true``."""
    notes: list[str] = field(default_factory=list)
    """Caveats shown at the top of the report."""
    long_check: dict[str, Any] | None = None
    """``long_check.json`` (``LongCheckResult.to_json``; None when no long check ran)."""
    applied: list[dict[str, Any]] = field(default_factory=list)
    """``apply.json``: every promotion apply made, with its long check or its skip."""

    @property
    def simulated(self) -> bool:
        return any(r.simulated for r in self.trials)

    @property
    def memory_capacity_bytes(self) -> int | None:
        """The study's memory capacity per device, bytes (``Contract.memory_capacity``; None: unlimited)."""
        return self.contract.memory_capacity.memory_capacity_bytes

    @property
    def capacity_bytes(self) -> int | None:
        """Alias of ``memory_capacity_bytes`` (the figures in ``infrarsi.report.plots`` read it)."""
        return self.memory_capacity_bytes


def load_study(study_dir: str | Path) -> StudyData:
    """Read a study directory (the contract is verified: an edited one is refused)."""
    d = Path(study_dir)
    contract = Contract.load(d, check_files=False)
    doctor = DoctorReport.load_if_present(d)
    try:
        verify = VerifyReport.load_if_present(d)
        unreadable = ""
    except StudyError as e:
        verify, unreadable = None, str(e)
    trials = read_trial_rows(d)
    data = StudyData(
        study_dir=d,
        contract=contract,
        doctor=doctor,
        verify=verify,
        trials=trials,
        long_check=_json(StudyPaths(d).long_check),
    )
    if unreadable:
        data.notes.append(
            f"verify's record is unreadable, so nothing is shown as verified: {unreadable}"
        )
    applied = _json_list(StudyPaths(d).apply_record)
    data.applied = [a for a in applied if isinstance(a, dict)]
    base_cfg = _baseline_config(data)
    data.baseline = _side("baseline", base_cfg, trials, role="baseline", doctor_ok=True)
    best = verify.best if verify is not None else None
    if best is not None and best.config:
        data.best = _side(
            "best", dict(best.config), trials, role="candidate", trial_ids=best.trial_ids
        )
        data.best_verified = best.accepted
        if not data.best_verified:
            data.notes.append(
                "verify did not accept any candidate: the 'best' shown is the top "
                "candidate verify tried, NOT a verified win."
            )
    else:
        runs = [r for r in trials if r.stage == "run" and r.ok and r.step_time_s]
        if runs:
            top = min(runs, key=lambda r: r.step_time_s or float("inf"))
            data.best = _side("best", dict(top.config), trials, role="candidate")
            data.notes.append(
                "verify has not accepted a candidate (verify.json missing or no "
                "best): the 'best' shown is the fastest run trial, unverified."
            )
    if data.simulated:
        data.notes.insert(
            0, "SIMULATED: rows come from the analytic surrogate backend, not from real training."
        )
    return data


def _json(p: Path) -> dict[str, Any] | None:
    if not p.exists():
        return None
    try:
        out = json.loads(p.read_text())
    except json.JSONDecodeError:
        return None
    return out if isinstance(out, dict) else None


def _json_list(p: Path) -> list[Any]:
    if not p.exists():
        return []
    try:
        out = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return []
    return out if isinstance(out, list) else []


def _baseline_config(data: StudyData) -> dict[str, Any]:
    cfg = data.verify.baseline_config if data.verify is not None else None
    if cfg:
        return dict(cfg)
    if data.doctor is not None and data.doctor.baseline_config:
        return dict(data.doctor.baseline_config)
    doc = [r for r in data.trials if r.stage == "doctor" and r.extra.role in (None, "baseline")]
    if doc:
        return dict(doc[0].config)
    return dict(data.contract.workload.get("baseline", {}))


def _matches(cfg: dict[str, Any], want: dict[str, Any]) -> bool:
    return all(cfg.get(k) == v for k, v in want.items())


def _side(
    label: str,
    cfg: dict[str, Any],
    trials: list[TrialResult],
    *,
    role: str,
    doctor_ok: bool = False,
    trial_ids: list[str] | None = None,
) -> Side:
    """The figures of one side; ``trial_ids`` (verify's record of the candidate's own trials)
    picks exactly those rows, so another candidate with the same knobs never counts."""
    ok = [r for r in trials if r.ok and r.step_time_s is not None]
    if trial_ids:
        own = set(trial_ids)
        ver = [r for r in ok if r.trial_id in own]
        if ver:
            return Side(label, cfg, ver, "verify")
    ver = [
        r for r in ok if r.stage == "verify" and r.extra.role == role and _matches(r.config, cfg)
    ]
    if ver:
        return Side(label, cfg, ver, "verify")
    if doctor_ok:
        doc = [r for r in ok if r.stage == "doctor" and r.extra.role in (None, "baseline")]
        if doc:
            return Side(label, cfg, doc, "doctor")
    run = [r for r in ok if r.stage == "run" and _matches(r.config, cfg)]
    return Side(label, cfg, run, "run" if run else "none")


__all__ = ["Side", "StudyData", "config_key", "load_study", "read_trial_rows"]
