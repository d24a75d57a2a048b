"""Helpers shared by the stages: the study's search space, baseline config and budgets."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infrarsi.errors import ContractError

if TYPE_CHECKING:
    from infrarsi.search import SearchSpace
    from infrarsi.study.contract import Contract

SPACE_COPY = "search_space.yaml"
"""The study keeps its own copy of the search space, so it needs no other file."""


def copy_space(contract: Contract, study_dir: Path) -> Path:
    """Copy the contract's search-space YAML into the study directory (init does this)."""
    dst = study_dir / SPACE_COPY
    shutil.copyfile(contract.search_space_path, dst)
    return dst


def load_space(contract: Contract, study_dir: Path) -> SearchSpace:
    """The study's search space: the copy in the study directory, checked against the contract's
    hash (or the original path when no copy exists)."""
    from infrarsi.search import SearchSpace

    path = study_dir / SPACE_COPY
    if not path.exists():
        path = Path(contract.search_space_path)
    if not path.exists():
        raise ContractError(
            f"{study_dir}: the search space is missing (neither {SPACE_COPY} nor "
            f"{contract.search_space_path} exists). Restore it or re-run init."
        )
    text = path.read_text()
    if hashlib.sha256(text.encode()).hexdigest() != contract.search_space_hash:
        raise ContractError(
            f"{path}: the search space changed since init (its sha256 no longer matches the "
            f"contract's search_space_hash). Restore it, or run `infrarsi init` into a new study."
        )
    return SearchSpace.from_yaml(path)


def baseline_config(contract: Contract, study_dir: Path) -> dict[str, Any]:
    """The workload's baseline recipe as a full config (every knob; inactive ones at defaults)."""
    space = load_space(contract, study_dir)
    return dict(space.validate(dict(contract.workload_model().baseline)))


def device_budget_s(contract: Contract) -> float | None:
    """The device-hours budget in device-seconds (None: unlimited)."""
    dh = contract.budgets.device_hours
    return None if dh is None else float(dh) * 3600.0
