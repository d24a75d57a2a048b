"""Proposals: configs (and patches) that an outside agent or a person asks a study to try.

``infrarsi propose`` (or the Python API ``infrarsi.stages.propose.propose``, or the MCP server's
``propose`` tool) checks a proposal against the contract and queues it as a JSON file in
``DIR/proposals/queued/``. The ``run`` stage's searcher serves queued proposals before asking the
optimizer, oldest first, each as an ordinary run trial: it is moved to ``proposals/taken/``
(an atomic rename, so two runs never take the same one), run under the contract, checked against
the invariants, told to the optimizer, and verified like any candidate. The proposer's rationale
travels in the row (``extra.proposal``) into the report.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from infrarsi.study.paths import StudyPaths, make_private_dir, write_json_atomic

QUEUE_WAIT_S = 30.0
"""Seconds a proposer waits for the queue's lock (each holder keeps it for milliseconds)."""


@dataclass(frozen=True)
class Proposal:
    """One proposal, as queued."""

    proposal_id: str
    """``prop-0001``, ... in the order they were queued."""
    config: dict[str, Any]
    """The full config to run (every knob; the knobs the proposer left out at the baseline's values)."""
    why: str
    """The proposer's rationale, kept verbatim in the log and the report."""
    proposer: str = "cli"
    """Who proposed it: ``cli``, ``python``, ``mcp`` (or what the caller says)."""
    asked: dict[str, Any] = field(default_factory=dict)
    """The knobs exactly as proposed, before the baseline filled in the rest."""
    patch: str | None = None
    """The proposal's patch, copied into the study (``proposals/patches/<id>.diff``), or None."""
    patch_paths: list[str] = field(default_factory=list)
    """Repository-relative paths the patch touches (all inside the contract's editable globs)."""
    created_at: float = 0.0
    """When it was queued (Unix seconds)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (``from_dict`` inverts it)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Proposal:
        """Inverse of ``to_dict``; unknown keys are ignored."""
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in raw.items() if k in names})


class ProposalQueue:
    """The proposals of one study directory."""

    def __init__(self, study_dir: str | Path) -> None:
        self.paths = StudyPaths(Path(study_dir))
        self.queued_dir = self.paths.proposals_queued
        """Proposals waiting for a run trial."""
        self.taken_dir = self.paths.proposals_taken
        """Proposals a run trial took (its row carries ``extra.proposal``)."""
        self.patch_dir = self.paths.proposal_patches
        """The proposals' patch files."""
        self.lock_path = self.paths.proposals_lock
        """The queue's own lock (``infrarsi.study.lock``): held while an id is chosen and its
        proposal written, so two proposers never get the same id (the study lock is not taken:
        proposing while ``run`` holds the study is the point of the queue)."""

    def locked(self, wait_s: float = QUEUE_WAIT_S) -> AbstractContextManager[object]:
        """Hold the queue's lock (``StudyLockedError`` if another live proposer keeps it past ``wait_s``)."""
        from infrarsi.study.lock import hold

        make_private_dir(self.paths.proposals)
        return hold(self.lock_path, "propose", wait_s=wait_s, what="proposal queue")

    def next_id(self) -> str:
        """The next unused proposal id."""
        used = [
            p.stem
            for d in (self.queued_dir, self.taken_dir)
            if d.is_dir()
            for p in d.glob("prop-*.json")
        ]
        n = max((int(u.split("-")[1]) for u in used if u.split("-")[1].isdigit()), default=0)
        return f"prop-{n + 1:04d}"

    def add(self, proposal: Proposal) -> Proposal:
        """Queue ``proposal`` (its id must be new)."""
        make_private_dir(self.queued_dir)
        stamped = Proposal.from_dict(
            {**proposal.to_dict(), "created_at": proposal.created_at or time.time()}
        )
        write_json_atomic(self.queued_dir / f"{proposal.proposal_id}.json", stamped.to_dict())
        return stamped

    def queued(self) -> list[Proposal]:
        """Proposals waiting, oldest first."""
        return self._read(self.queued_dir)

    def taken(self) -> list[Proposal]:
        """Proposals already given to a run trial."""
        return self._read(self.taken_dir)

    def take(self) -> Proposal | None:
        """The oldest queued proposal, moved to ``taken/`` (None when none is queued, or another
        process took each one first)."""
        for p in self.queued():
            make_private_dir(self.taken_dir)
            try:
                os.rename(
                    self.queued_dir / f"{p.proposal_id}.json",
                    self.taken_dir / f"{p.proposal_id}.json",
                )
            except FileNotFoundError:
                continue  # taken meanwhile
            return p
        return None

    def _read(self, folder: Path) -> list[Proposal]:
        if not folder.is_dir():
            return []
        out = []
        for f in sorted(folder.glob("prop-*.json")):
            try:
                out.append(Proposal.from_dict(json.loads(f.read_text())))
            except (OSError, ValueError, TypeError):
                continue  # moved meanwhile, or not ours
        return out
