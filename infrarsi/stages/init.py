"""Stage 1, ``init``: lock the task contract of a new study directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infrarsi.errors import ContractError
from infrarsi.execution.knobs.registry import check_handlers
from infrarsi.workload import Workload


def init_stage(
    workload_path: str | Path,
    study_dir: str | Path,
    *,
    request: str = "",
    editable_globs: list[str] | None = None,
    editable_knobs: list[str] | None = None,
    space: str | Path | None = None,
    memory_capacity_bytes: int | None = None,
    trials: int | None = None,
    wall_time_s: float | None = None,
    device_hours: float | None = None,
    loss_tolerance: float | None = None,
    eval_tolerance: float | None = None,
    analytic_prior: bool | None = None,
    loss_guard: bool | None = None,
    bank: str | None = None,
) -> Any:
    """Write ``DIR/contract.yaml`` (frozen, hashed) and a copy of the search space.

    ``memory_capacity_bytes`` is ``--memory-capacity`` (else the workload's: see
    ``infrarsi.study.capacity``). The switches ``analytic_prior``, ``loss_guard`` and ``bank`` (a
    directory, or ``off``) are recorded in the contract; each one not given takes its
    environment variable's value, else its default (``infrarsi.study.switches``).

    Everything that can be checked before a trial is checked here: the workload and the search
    space parse, every knob has a handler, the job's entry point imports and returns a
    well-formed job whose model builds and whose data has the right shape
    (``infrarsi.execution.job_loader.preflight``), the baseline recipe is a valid config, the global
    batch divides over the ranks, and every patch the ``code_patch`` knob names stays inside the
    editable globs and applies to the workload repository's HEAD (``PatchError`` otherwise).
    """
    from infrarsi.search import SearchSpace
    from infrarsi.stages.common import copy_space
    from infrarsi.study.contract import Contract
    from infrarsi.study.switches import StudySwitches

    d = Path(study_dir)
    switches = StudySwitches.resolve(analytic_prior=analytic_prior, loss_guard=loss_guard, bank=bank)
    wl = Workload.from_yaml(workload_path)
    space_path = Path(space) if space else wl.search_space_path()
    sp = SearchSpace.from_yaml(space_path)
    if wl.backend == "deepspeed":
        check_handlers(sp.names, source=str(space_path))
        from infrarsi.execution.job_loader import preflight

        preflight(wl)
    try:
        sp.validate(dict(wl.baseline))
    except Exception as e:
        raise ContractError(
            f"{workload_path}: field 'baseline' is not a valid config of {space_path}: {e}"
        ) from e
    _check_patches(sp, wl, editable_globs)
    if wl.global_batch_size % wl.world_size:
        raise ContractError(
            f"{workload_path}: tokens_per_step / seq_len = {wl.global_batch_size} sequences do not "
            f"divide over {wl.world_size} ranks; pick tokens_per_step so that they do."
        )
    contract = Contract.create(
        wl,
        study_dir=d,
        request=request,
        editable_knobs=editable_knobs,
        editable_globs=editable_globs,
        search_space=space_path,
        memory_capacity_bytes=memory_capacity_bytes,
        switches=switches,
        trials=trials,
        wall_time_s=wall_time_s,
        device_hours=device_hours,
        loss_atol=loss_tolerance,
        eval_atol=eval_tolerance,
    )
    copy_space(contract, d)
    return contract


def _check_patches(space: Any, wl: Workload, editable_globs: list[str] | None) -> list[str]:
    """Scope- and apply-check the patches of the space's ``code_patch`` knob (none: no-op)."""
    from infrarsi.execution.knobs.code_patch import check_space_patches, patch_names
    from infrarsi.study.contract import EditableScope

    if not patch_names(space):
        return []
    from infrarsi.execution.runner import default_code_dir

    factory = EditableScope.model_fields["globs"].default_factory
    globs = list(editable_globs) if editable_globs is not None else list(factory())  # type: ignore[misc, call-arg]
    return check_space_patches(space, default_code_dir(wl), globs)
