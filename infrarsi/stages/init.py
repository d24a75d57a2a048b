"""Stage 1, ``init``: lock the task contract of a new study directory."""

from __future__ import annotations

import math
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from infrarsi.errors import ConfigError, ContractError, WorkloadError
from infrarsi.execution.knobs.registry import check_space
from infrarsi.workload import Workload, space_file

if TYPE_CHECKING:
    from infrarsi.search import SearchSpace


def init_stage(
    workload_path: str | Path,
    study_dir: str | Path,
    *,
    request: str = "",
    editable_globs: list[str] | None = None,
    editable_knobs: list[str] | None = None,
    allow: list[str] | None = None,
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
    long_check_budget_s: float | None = None,
) -> Any:
    """Write ``DIR/contract.yaml`` (frozen, hashed) and a copy of the search space.

    ``allow`` names the knobs of another arithmetic (``KnobSpec.arithmetic``: float8 matmuls)
    the study may search; the others stay at the baseline, and naming one in ``editable_knobs``
    without allowing it is a ``ConfigError``. The contract's editable knobs record the choice.

    ``long_check_budget_s``: seconds the long check may take (``budgets.long_check_s``; default
    ``DEFAULT_LONG_CHECK_BUDGET_S``).

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
    from infrarsi.orchestration.common import copy_space
    from infrarsi.search import SearchSpace
    from infrarsi.study.contract import DEFAULT_LONG_CHECK_BUDGET_S, Contract
    from infrarsi.study.switches import StudySwitches

    d = Path(study_dir)
    check_init_options(
        study_dir=d,
        trials=trials,
        wall_time_s=wall_time_s,
        device_hours=device_hours,
        loss_tolerance=loss_tolerance,
        eval_tolerance=eval_tolerance,
        editable_globs=editable_globs,
        long_check_budget_s=long_check_budget_s,
    )
    switches = StudySwitches.resolve(
        analytic_prior=analytic_prior, loss_guard=loss_guard, bank=bank
    )
    wl = Workload.from_yaml(workload_path)
    space_path = space_file(space) if space else workload_space_path(wl, workload_path)
    sp = SearchSpace.from_yaml(space_path)
    unknown = [k for k in editable_knobs or [] if k not in sp.names]
    if unknown:  # before the preflight builds the model
        raise ConfigError(
            f"--knob {unknown[0]!r}: rule: must be a knob of the search space {space_path}. "
            f"Fix: pick from {sp.names}."
        )
    editable_knobs = allowed_knobs(list(sp.names), editable_knobs, allow or [], space_path)
    if wl.backend == "deepspeed":
        check_space(sp, source=str(space_path))
        if wl.script is not None:
            from infrarsi.execution.script_preflight import script_preflight

            script_preflight(wl)
        else:
            from infrarsi.execution.job_loader import preflight

            preflight(wl)
    if wl.script is not None:  # knobs that cannot reach a script stay at the baseline
        editable_knobs = script_editable_knobs(list(sp.names), editable_knobs, workload_path)
        if editable_globs is None:  # code patches may touch the script's folder
            editable_globs = [script_glob(wl)]
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
        long_check_s=DEFAULT_LONG_CHECK_BUDGET_S
        if long_check_budget_s is None
        else float(long_check_budget_s),
    )
    copy_space(contract, d)
    return contract


def script_glob(wl: Workload) -> str:
    """The default editable glob of a script workload: the script's folder in its repository
    (``**`` for a script at the root), so a code patch may touch the script and its modules."""
    folder = Path(wl.script_layout()[0]).parent.as_posix()
    return "**" if folder in ("", ".") else f"{folder}/**"


def allowed_knobs(
    knobs: list[str], editable: list[str] | None, allow: list[str], space_path: str | Path
) -> list[str] | None:
    """The editable knobs once the knobs of another arithmetic are settled: ``editable`` with the
    ``allow`` knobs added, or (``editable`` None) every knob but the ``arithmetic="different"``
    ones not in ``allow`` (None when that is every knob). ``ConfigError`` for an ``allow`` entry that is not such a knob
    of the space, or a knob in ``editable`` that needs allowing."""
    from infrarsi.execution.knobs import different_arithmetic_knobs

    different = different_arithmetic_knobs(knobs)
    for name in allow:
        if name not in different:
            raise ConfigError(
                f"--allow {name!r}: rule: must name a knob of {space_path} that changes the "
                f"arithmetic; this space has {different or 'none'}. Fix: drop --allow {name}."
            )
    blocked = [k for k in different if k not in allow]
    named = [k for k in editable or [] if k in blocked]
    if named:
        raise ConfigError(
            f"--knob {named[0]!r}: rule: a knob that changes the arithmetic is searched only "
            f"when the contract allows it. Fix: add --allow {named[0]}."
        )
    if editable is not None:  # an allowed knob is editable even when --knob leaves it out
        return [*editable, *(k for k in allow if k not in editable)]
    return [k for k in knobs if k not in blocked] if blocked else None


def script_editable_knobs(
    knobs: list[str], editable: list[str] | None, workload_path: str | Path
) -> list[str]:
    """The knobs a script workload's study may change: ``editable`` (default: every knob of the
    space) less the knobs that cannot reach a script (``script_config.SCRIPT_PINNED``), which stay
    at the baseline; ``ConfigError`` when ``--knob`` names one of those."""
    from infrarsi.execution.script_config import pinned_knobs

    pins = pinned_knobs(knobs)
    asked = [k for k in editable or [] if k in pins]
    if asked:
        raise ConfigError(
            f"--knob {asked[0]!r}: rule: a script workload ({workload_path}) cannot vary it: "
            f"{pins[asked[0]]}. Fix: drop --knob {asked[0]}"
        )
    return [k for k in (editable if editable is not None else knobs) if k not in pins]


def workload_space_path(wl: Workload, workload_path: str | Path) -> Path:
    """The workload's ``search_space`` file; ``WorkloadError`` naming the workload file and the
    field when it is not a file."""
    path = wl.search_space_path()
    if not path.is_file():
        raise WorkloadError(
            f"{workload_path}: field 'search_space': rule: must name a search-space YAML file, relative "
            f"to the workload file or absolute; {wl.search_space!r} is {path}, which is not a file. "
            f"Fix: e.g. search_space: ../search_spaces/deepspeed_dense.yaml."
        )
    return path


def check_init_options(
    *,
    study_dir: str | Path | None = None,
    trials: int | None = None,
    wall_time_s: float | None = None,
    device_hours: float | None = None,
    loss_tolerance: float | None = None,
    eval_tolerance: float | None = None,
    editable_globs: list[str] | None = None,
    long_check_budget_s: float | None = None,
) -> None:
    """Refuse (``ConfigError``, exit code 2) an init option no study could use, naming the
    flag, the rule and the value: budgets must be positive and finite, tolerances finite and
    >= 0, editable globs relative paths inside the repository; the study must be a directory."""
    if study_dir is not None and Path(study_dir).exists() and not Path(study_dir).is_dir():
        raise ConfigError(
            f"--study {str(study_dir)!r}: rule: must be a directory (new or existing); it is a "
            f"file. Fix: pick another path."
        )
    if trials is not None and (
        isinstance(trials, bool) or not isinstance(trials, int) or trials < 1
    ):
        raise ConfigError(f"--trials: rule: must be an integer >= 1; got {trials!r}.")
    for flag, value, low in (
        ("--time-budget", wall_time_s, "> 0"),
        ("--device-hours", device_hours, "> 0"),
        ("--loss-tolerance", loss_tolerance, ">= 0"),
        ("eval tolerance", eval_tolerance, ">= 0"),
        ("--long-check-budget", long_check_budget_s, "> 0"),
    ):
        if value is None:
            continue
        number = (
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        )
        if not number or (value <= 0 if low == "> 0" else value < 0):
            raise ConfigError(f"{flag}: rule: must be a finite number {low}; got {value!r}.")
    for g in editable_globs or []:
        parts = PurePosixPath(g).parts if isinstance(g, str) else ()
        if (
            not isinstance(g, str)
            or not g.strip()
            or g.startswith(("/", "\\"))
            or ".." in parts
            or "\\" in g
        ):
            raise ConfigError(
                f"--editable {g!r}: rule: a glob relative to the repository root, inside it (no absolute "
                f"path, no '..', '/' as separator). Fix: e.g. --editable 'workloads/**'."
            )


def _check_patches(space: SearchSpace, wl: Workload, editable_globs: list[str] | None) -> list[str]:
    """Scope- and apply-check the patches of the space's ``code_patch`` knob (none: no-op)."""
    from infrarsi.patches import check_space_patches, patch_names
    from infrarsi.study.contract import EditableScope

    if not patch_names(space):
        return []
    from infrarsi.execution.runner import default_code_dir

    factory = EditableScope.model_fields["globs"].default_factory
    globs = list(editable_globs) if editable_globs is not None else list(factory())  # type: ignore[misc, call-arg]
    return check_space_patches(space, default_code_dir(wl), globs)
