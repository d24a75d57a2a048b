"""Feeding the experience bank: each stage adds its study to the bank its contract names.

``add_to_bank`` is called by doctor, run, verify and tune as they end (cheap, and idempotent: a
study keeps one file in the bank); it never fails the stage. It holds the study lock while it
reads the study (re-entering the calling stage's), so a feed never reads a study another process
is writing; a feed refused the lock is logged and skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)


def add_to_bank(study_dir: str | Path, *, stage: str = "tune") -> dict[str, Any]:
    """Ingest the study into the bank its contract names (``switches.bank``); every stage calls
    it when it ends (doctor, run, verify, tune: cheap, and idempotent since a study keeps one
    file). Never fails the stage: a bank error is logged as a warning and returned. Returns
    ``{"root", "rows"}``, ``{"disabled": True}`` (the switch is off) or ``{"error"}``."""
    from infrarsi.bank.store import Bank
    from infrarsi.study.contract import Contract
    from infrarsi.study.lock import hold_study

    root: str | None = None
    try:
        root = Contract.load(study_dir, check_files=False).switches_in_force().bank
        if root is None:
            return {"disabled": True}
        bank = Bank(root)
        with hold_study(
            study_dir, "bank"
        ):  # re-entered by the stage that holds it; refused (logged) otherwise
            n = bank.add_study(study_dir)
    except Exception as e:  # the study's results stand even when the bank cannot take them
        log.warning("bank.add_failed", bank=root, study=str(study_dir), stage=stage, error=str(e))
        return {"root": root, "error": str(e)}
    log.info(
        "bank.added",
        bank=bank.uri,
        study=str(study_dir),
        stage=stage,
        rows=n,
        atomic=bank.atomic_writes,
    )
    return {"root": bank.uri, "rows": n}
