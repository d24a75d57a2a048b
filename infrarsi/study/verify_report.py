"""``VerifyReport``: the typed record of ``DIR/verify.json``, what verify measured and accepted.

``verify`` writes it (``VerifyReport.save(DIR)``); ``apply``, the long check and the report read
it (``VerifyReport.load_if_present(DIR)``), so the keys of ``verify.json`` are named in this one
place. Every field has a default, so a record an older infrarsi wrote (or one a test writes by
hand) loads; what a reader needs that is absent (e.g. ``patches``) is ``None`` and the reader
says what to re-run. A malformed file raises ``StudyError`` naming the file, the field, the rule,
the value and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from infrarsi.result import Status
from infrarsi.study.candidate import Candidate
from infrarsi.study.json_record import read_json_record
from infrarsi.study.paths import StudyPaths, write_json_atomic


class _Record(BaseModel):
    # Keys a later version adds are ignored by this one (old and new directories both load).
    model_config = ConfigDict(extra="ignore")


class VerifyRound(_Record):
    """One round of a candidate: its paired ratios and whether their median cleared the noise."""

    round: int = 0
    """Round index, from 0."""
    ratios: list[float] = Field(default_factory=list)
    """Baseline step time / candidate step time of each valid pair of the round."""
    statuses: list[Status] = Field(default_factory=list)
    """Status of each of the candidate's trials in the round, in run order."""
    passed: bool = False
    """True when the round's median ratio cleared 1 + noise margin and every trial was ok."""
    median_ratio: float | None = None
    """Median of ``ratios`` (None with fewer than two valid pairs or a failed trial)."""
    reason: str = ""
    """Why the round failed; empty when it passed."""


class VerifiedCandidate(_Record):
    """A candidate verify measured against the baseline, with its interval and decision."""

    config: dict[str, Any] = Field(default_factory=dict)
    """The candidate's full knob config."""
    patches: list[dict[str, Any] | str] | None = None
    """The candidate's patches with their digests (``PatchRef.to_dict``); None in a record an
    older verify wrote, which named no patches."""
    candidate_key: str | None = None
    """``Candidate.key``: the config and the patch digests (None in older records)."""
    accepted: bool = False
    """True when the candidate cleared every round, the interval rule and every invariant."""
    reason: str = ""
    """Why it was not accepted; empty when it was."""
    speedup: float | None = None
    """Median of all its paired ratios (baseline / candidate step time)."""
    ci_low: float | None = None
    """Lower bound of the order-statistic interval of the median."""
    ci_high: float | None = None
    """Upper bound of that interval."""
    ci_coverage: float | None = None
    """The interval's exact binomial coverage of the true median, a fraction."""
    ci_method: str | None = None
    """The interval's name, as the report prints it."""
    n_pairs: int = 0
    """Valid pairs over all rounds."""
    rounds: list[VerifyRound] = Field(default_factory=list)
    """Each round's record, in order."""
    trial_ids: list[str] = Field(default_factory=list)
    """The verify trials that measured the candidate (``apply`` checks each against the log)."""
    smoothed_step_time_s: float | None = None
    """The search's smoothed step time of the candidate, seconds (None when given by hand)."""
    observed_step_time_s: float | None = None
    """The median of its ok run step times, seconds (None when given by hand)."""
    selected_by: list[str] = Field(default_factory=list)
    """What put it among verify's candidates: ``"posterior"`` (among the top-k smoothed step
    times), ``"measured"`` (the lowest measured median), both, or ``"given"`` (by hand); empty
    in a record an older verify wrote."""
    diff_vs_baseline: dict[str, list[Any]] = Field(default_factory=dict)
    """Knob -> [baseline value, candidate value] for each knob that differs."""

    @property
    def candidate(self) -> Candidate:
        """The candidate as a ``Candidate`` (config and patch references)."""
        return Candidate.from_dict({"config": self.config, "patches": self.patches or []})

    def patch_dicts(self) -> list[dict[str, Any]]:
        """``patches`` as dicts (a bare path of an older record becomes ``{"path": ...}``)."""
        return [p if isinstance(p, dict) else {"path": p} for p in self.patches or []]


class VerifyReport(_Record):
    """Everything verify decided: the candidates, the best accepted one and the rule applied."""

    best: VerifiedCandidate | None = None
    """The fastest accepted candidate (None when verify accepted none)."""
    candidates: list[VerifiedCandidate] = Field(default_factory=list)
    """Every candidate verify measured, in selection order."""
    baseline_config: dict[str, Any] = Field(default_factory=dict)
    """The baseline's full knob config the candidates were paired with."""
    noise_margin: float = 0.0
    """The doctor's noise margin every ratio must clear (a fraction)."""
    pairs: int | None = None
    """Baseline/candidate pairs per round."""
    rounds: int | None = None
    """Rounds run."""
    confidence: float | None = None
    """The coverage the interval must reach, a fraction."""
    rule: str = ""
    """The acceptance rule, in words."""
    reason: str = ""
    """Why nothing was verified (no candidate to select); empty otherwise."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, as written to ``verify.json``."""
        return self.model_dump(mode="json")

    def save(self, study_dir: str | Path) -> Path:
        """Write ``DIR/verify.json`` atomically."""
        p = StudyPaths(Path(study_dir)).verify
        write_json_atomic(p, self.to_dict())
        return p

    @classmethod
    def read(cls, path: str | Path) -> VerifyReport:
        """Parse ``path``; ``StudyError`` naming file, field, rule, value and fix."""
        p = Path(path)
        fix = f"Fix: re-run `infrarsi verify {p.parent}` (it rewrites {p.name})."
        return read_json_record(p, cls, "verify's record", fix)

    @classmethod
    def load_if_present(cls, study_dir: str | Path) -> VerifyReport | None:
        """``read`` of ``DIR/verify.json``, or None when verify has not run."""
        p = StudyPaths(Path(study_dir)).verify
        return cls.read(p) if p.exists() else None


__all__ = ["VerifiedCandidate", "VerifyReport", "VerifyRound"]
