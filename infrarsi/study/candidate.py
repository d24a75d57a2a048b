"""A candidate: what is tried, verified and promoted, as one record.

A candidate is the full knob config plus the ordered set of code patches it runs with, each
patch named by the path the trial log records and by its content digest. Two trials are the same
candidate only when both agree: the same knobs with another patch (or none) are another
candidate. Every stage keys on it: the run rows (``TrialResult.patches`` and
``TrialResult.patch_sha256``), the optimizer (a proposal's patch is not a knob, so such a row is
not told to the knob models as if the knobs alone had made it), ``run``'s summary, verify's
selection and trials, ``verify.json``, the report and ``apply``, which commits exactly the
verified candidate's patches after checking their digests.

Patch paths, as the log writes them:

- ``workloads/patches/<name>.diff``: a ``code_patch`` knob's patch, relative to the root of the
  workload's repository (``source="knob"``);
- ``proposals/patches/<id>.diff``: a proposal's patch, relative to the study directory
  (``source="proposal"``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from infrarsi.result import TrialResult

PatchSource = Literal["knob", "proposal"]

PROPOSAL_PATCH_DIR = "proposals/patches/"
"""Study-relative folder of the proposals' patch files (``ProposalQueue.patch_dir``)."""


def file_sha256(path: str | Path) -> str:
    """The hex sha256 of a file's bytes ("" when it cannot be read: a missing file)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


def patch_source(path: str) -> PatchSource:
    """Where a logged patch path is relative to: the study directory (a proposal's) or the
    workload's repository (a ``code_patch`` knob's)."""
    return "proposal" if str(path).startswith(PROPOSAL_PATCH_DIR) else "knob"


@dataclass(frozen=True)
class PatchRef:
    """One patch of a candidate."""

    path: str
    """The patch file as the trial log names it (module docstring: relative to the study
    directory for a proposal's, to the workload's repository for a knob's)."""
    sha256: str
    """Hex sha256 of the file's bytes when the trial ran ("" for rows logged before digests
    were recorded)."""
    source: PatchSource = "knob"
    """``proposal`` (a proposal's patch, run as the trial's ``patch_file``) or ``knob`` (named by
    the config's ``code_patch`` value)."""
    proposal_id: str | None = None
    """The proposal that brought it (``prop-0001``...), when there is one."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "sha256": self.sha256,
            "source": self.source,
            "proposal_id": self.proposal_id,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | str) -> PatchRef:
        """Inverse of ``to_dict``; a bare path string (an older record) has no digest."""
        if isinstance(raw, str):
            return cls(path=raw, sha256="", source=patch_source(raw))
        path = str(raw["path"])
        src = raw.get("source") or patch_source(path)
        return cls(
            path=path,
            sha256=str(raw.get("sha256") or ""),
            source="proposal" if src == "proposal" else "knob",
            proposal_id=raw.get("proposal_id"),
        )


def config_key(config: Mapping[str, Any]) -> str:
    """A config as canonical JSON (sorted keys): equal configs give equal keys."""
    return json.dumps(dict(config), sort_keys=True, default=str)


@dataclass(frozen=True)
class Candidate:
    """A knob config and the ordered patches it runs with: the unit verify measures and apply
    promotes."""

    config: Mapping[str, Any]
    """Knob name -> value, every knob of the space (inactive knobs at their defaults)."""
    patches: tuple[PatchRef, ...] = field(default_factory=tuple)
    """The code patches, in the order they are applied; empty for the untouched code."""

    @property
    def key(self) -> str:
        """The identity: the config and the patches' digests in order. Two proposals of the
        same patch text with the same knobs are one candidate; the same knobs with another patch,
        or none, are another."""
        digests = [p.sha256 or f"path:{p.path}" for p in self.patches]
        return json.dumps(
            {"config": dict(self.config), "patches": digests}, sort_keys=True, default=str
        )

    @property
    def proposal_patch(self) -> str | None:
        """The study-relative path of the proposal patch this candidate runs with (what
        ``StudyExecutor.run_trial``'s ``patch_file`` takes), or None."""
        own = [p.path for p in self.patches if p.source == "proposal"]
        return own[0] if own else None

    @property
    def proposal_id(self) -> str | None:
        """The proposal that brought its patch, if any."""
        return next((p.proposal_id for p in self.patches if p.proposal_id), None)

    def is_untouched(self, baseline: Mapping[str, Any]) -> bool:
        """True when this is the baseline itself: its knobs and no patch."""
        return not self.patches and config_key(self.config) == config_key(baseline)

    def describe(self) -> str:
        """A short human label: the patches by file name, or ``no patch``."""
        if not self.patches:
            return "no patch"
        return " + ".join(
            f"{Path(p.path).name} ({p.sha256[:12] or 'no digest'})" for p in self.patches
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (``from_dict`` inverts it)."""
        return {"config": dict(self.config), "patches": [p.to_dict() for p in self.patches]}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Candidate:
        return cls(
            config=dict(raw.get("config") or {}),
            patches=tuple(PatchRef.from_dict(p) for p in raw.get("patches") or ()),
        )

    @classmethod
    def from_row(cls, row: TrialResult) -> Candidate:
        """The candidate a logged trial (a ``TrialResult``) ran: its config, and its patches
        with the digests the executor recorded (rows logged before digests have none)."""
        paths: Sequence[str] = list(row.patches or [])
        digests: Sequence[str] = list(row.patch_sha256 or [])
        proposal = row.extra.proposal
        pid = proposal.get("proposal_id") if isinstance(proposal, dict) else None
        refs = []
        for i, p in enumerate(paths):
            src = patch_source(p)
            refs.append(
                PatchRef(
                    path=str(p),
                    sha256=str(digests[i]) if i < len(digests) else "",
                    source=src,
                    proposal_id=pid if src == "proposal" else None,
                )
            )
        return cls(config=dict(row.config), patches=tuple(refs))


__all__ = ["Candidate", "PatchRef", "PatchSource", "config_key", "file_sha256", "patch_source"]
