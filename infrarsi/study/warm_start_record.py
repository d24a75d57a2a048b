"""``WarmStartRecord``: the typed record of ``DIR/bank_warm_start.json``, the bank's warm start.

``orchestration.optimizer_factory.record_warm_start`` writes it when the search starts from the
experience bank (the configs of other studies tried first, those dropped as invalid here, and the
studies used inside the models); the report's bank audit reads it
(``WarmStartRecord.load_if_present(DIR)``), so its keys are named in this one place. Every field
has a default, so a record an older infrarsi wrote loads; a malformed file raises ``StudyError``
naming the file, the field, the rule, the value and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from infrarsi.study.json_record import read_json_record
from infrarsi.study.paths import StudyPaths


class _Record(BaseModel):
    # Keys a later version adds are ignored by this one (old and new directories both load).
    model_config = ConfigDict(extra="ignore")


class WarmStartEntry(_Record):
    """One bank entry: a config another study measured, used to warm-start this one or dropped."""

    config: dict[str, Any] | None = None
    """The config as this study runs it (the bank's, repaired into this study's space); for a
    dropped entry, the bank's as measured."""
    bank_config: dict[str, Any] | None = None
    """The config as the other study measured it."""
    repairs: list[str] = Field(default_factory=list)
    """How the bank's config was made valid here (``dropped unknown knob x=1``, ...); empty when
    it was valid as measured."""
    reason: str | None = None
    """A dropped entry: why no obvious repair makes it valid here (None for a used one)."""
    relative_step_time: float | None = None
    """Its step time over that study's baseline step time (< 1: faster than the baseline)."""
    relative_peak_memory: float | None = None
    """Its peak memory over that study's baseline peak memory."""
    similarity: float | None = None
    """How similar that study's workload is to this one (1: the same; the bank's score)."""
    source_study: str | None = None
    """The other study's name or directory."""
    source_key: str | None = None
    """The bank's key of the other study."""
    trial_id: str | None = None
    """The trial of that study that measured the config."""
    hardware_fingerprint: str | None = None
    """The hardware it was measured on."""
    same_hardware: bool | None = None
    """True when it was measured on this study's hardware (None in older records)."""


class TransferSource(_Record):
    """One similar study whose bank trials were used inside the models (the transfer prior)."""

    study: str | None = None
    """The study's name."""
    key: str | None = None
    """The bank's key of the study."""
    similarity: float | None = None
    """How similar its workload is to this one (the bank's score)."""
    rows: int = 0
    """Its bank trials used (valid in this study's space)."""
    dropped: int = 0
    """Its bank trials dropped (no valid repair here)."""
    own_prior: bool = False
    """True when the study's own fitted prior was used too."""


class TimeRankCheckRecord(_Record):
    """How the transferred formulas rank the bank's own trials, out of sample
    (``search.transfer.TimeRankCheck``): whether the transfer was trusted from the start."""

    kendall_tau: float
    """Kendall's tau between predicted and measured log step time (0: chance, 1: perfect)."""
    p_value: float
    """One-sided p-value of the tau against chance."""
    trials: int
    """Bank trials scored."""
    trusted: bool
    """True: the transfer's weights started at 1; False: the bank's step times were not used."""


class TransferSummary(_Record):
    """The bank's studies used inside the models (``bank.transfer.bank_transfer_prior``)."""

    sources: list[TransferSource] = Field(default_factory=list)
    """Each source study, in the bank's order."""
    time_rank_check: TimeRankCheckRecord | None = None
    """The check of the bank's own trials (None: too few to check, or an older record)."""


class WarmStartRecord(_Record):
    """``DIR/bank_warm_start.json``: what the experience bank gave the search."""

    bank: str | None = None
    """The bank's folder (None: no bank was given)."""
    used: list[WarmStartEntry] = Field(default_factory=list)
    """The bank entries that warm-start the search, in the order they are tried."""
    dropped: list[WarmStartEntry] = Field(default_factory=list)
    """The bank entries dropped as invalid in this study's space (each with its ``reason``)."""
    transfer: TransferSummary | None = None
    """The bank's studies used inside the models; None when the transfer prior was not used."""
    at: float | None = None
    """When the record was written (Unix seconds)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able dict the file holds."""
        return self.model_dump(mode="json")

    def same_choice(self, other: WarmStartRecord) -> bool:
        """True when ``other`` records the same choice (``at`` aside)."""
        return self.model_dump(exclude={"at"}) == other.model_dump(exclude={"at"})

    @classmethod
    def read(cls, path: str | Path) -> WarmStartRecord:
        """Parse ``path``; a malformed file raises ``StudyError`` naming the field and the fix."""
        fix = (
            "fix: delete the file; the next `infrarsi run` writes it again from the bank "
            "(the report then reads the warm start from the trial log)."
        )
        return read_json_record(Path(path), cls, "the bank's warm-start record", fix)

    @classmethod
    def load_if_present(cls, study_dir: str | Path) -> WarmStartRecord | None:
        """The study's record, or None when it has none."""
        path = StudyPaths(Path(study_dir)).bank_warm_start
        return cls.read(path) if path.exists() else None


__all__ = ["TransferSource", "TransferSummary", "WarmStartEntry", "WarmStartRecord"]
