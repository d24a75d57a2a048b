"""Helpers shared by the stages: the study's search space, baseline config and budgets."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infrarsi.study.paths import StudyPaths

if TYPE_CHECKING:
    from infrarsi.search import SearchSpace
    from infrarsi.study.contract import Contract


def copy_space(contract: Contract, study_dir: Path) -> Path:
    """Copy the contract's search-space YAML into the study directory (init does this)."""
    dst = StudyPaths(study_dir).search_space
    shutil.copyfile(contract.search_space_path, dst)
    return dst


def load_space(contract: Contract, study_dir: Path) -> SearchSpace:
    """The study's search space, checked against the contract's hash (``Contract.search_space``)."""
    return contract.search_space(study_dir)


def baseline_config(contract: Contract, study_dir: Path) -> dict[str, Any]:
    """The workload's baseline recipe as a full config (every knob; inactive ones at defaults)."""
    space = load_space(contract, study_dir)
    return dict(space.validate(dict(contract.workload_model().baseline)))


def scoped_space(contract: Contract, study_dir: Path) -> SearchSpace:
    """The space the search may move in: the contract's editable knobs (``knobs``) vary, every
    other knob is pinned at the baseline's value; the whole space when every knob is editable."""
    space = load_space(contract, study_dir)
    if set(contract.editable.knobs) >= set(space.names):
        return space
    return space.restrict(list(contract.editable.knobs), baseline_config(contract, study_dir))


def scope_violation(
    contract: Contract, space: SearchSpace, baseline: Mapping[str, Any], config: Mapping[str, Any]
) -> str | None:
    """Why ``config`` is outside the contract's editable knobs (None when it is inside)."""
    full = space.validate(dict(config), where="config")
    for name in space.names:
        if name not in contract.editable.knobs and full[name] != baseline[name]:
            return (
                f"contract.yaml: field 'editable.knobs': rule: a config may change only the editable knobs "
                f"{list(contract.editable.knobs)}; knob {name!r} has baseline value {baseline[name]!r}, "
                f"proposed {full[name]!r}. Fix: keep {name} at {baseline[name]!r}, or init a study "
                f"with --knob {name}."
            )
    return None


def device_budget_s(contract: Contract) -> float | None:
    """The device-hours budget in device-seconds (None: unlimited)."""
    dh = contract.budgets.device_hours
    return None if dh is None else float(dh) * 3600.0


def raise_harness_errors(grid: Any, stage: str = "run") -> None:
    """Raise the first error a Ray Tune trainable raised (``ResultGrid.errors``), if any.

    A trial's own failure (oom, a crash in a rank, a timeout) is a logged row, never an exception;
    an exception out of a trainable is the harness's (the trial log or the study directory cannot
    be written, an executor bug), so the stage stops and says so instead of reporting success.
    An infrarsi error (``LogError``: a full disk, an unwritable study directory) is re-raised as
    itself, with its message; anything else becomes a ``StudyError`` naming it."""
    from infrarsi.errors import InfrarsiError, StudyError

    errors = list(getattr(grid, "errors", None) or [])
    if not errors:
        return
    first = errors[0]
    cause = getattr(first, "cause", None)  # a RayTaskError wraps the trainable's exception
    for err in (cause, first):  # the cause first: its message is the error's own, no traceback
        if isinstance(err, InfrarsiError):
            raise err
    raise StudyError(
        f"{stage}: {len(errors)} Ray Tune trial(s) stopped with a harness error (not a "
        f"trial status); the first: {type(first).__name__}: {str(first)[-2000:]}"
    )
