"""The task contract: what a study may change and what it must keep, frozen and hashed.

``infrarsi init`` turns a workload and a human request into ``DIR/contract.yaml``. Every later
stage calls ``Contract.load(DIR)``, which refuses a contract whose content no longer matches its
hash, naming each field that changed (against the frozen copy ``DIR/.contract.frozen.json``), and a
workload or search-space file on disk that no longer hashes as it did at init.

The only change allowed after init is a calibration by ``doctor`` (loss and eval tolerances,
and a memory capacity left unset at init), made through ``Contract.with_calibration`` which
records an ``Amendment`` and re-freezes the contract. The contract also records the study's
switches (analytic prior, loss guard, experience bank: ``infrarsi.study.switches``) and is the one
place its memory capacity is resolved (``Contract.memory_capacity``, ``infrarsi.study.capacity``)::

    c = Contract.create(workload, study_dir=DIR, request="make it faster")
    c = Contract.load(DIR)
    c = c.with_calibration(loss_atol=2e-4, reason="doctor: 3 baseline runs").save(DIR)

Why one module: the contract's fields, creation, hashing, freezing, loading and calibration are one
record's life cycle.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infrarsi.errors import ContractError
from infrarsi.study.arithmetic_tolerance import ArithmeticTolerance
from infrarsi.study.capacity import (
    MemoryCapacity,
    resolve_memory_capacity,
)
from infrarsi.study.contract_diff import canonical as _canonical
from infrarsi.study.contract_diff import describe_diff as _describe_diff
from infrarsi.study.contract_diff import describe_sections
from infrarsi.study.contract_diff import field_diff as _diff
from infrarsi.study.contract_diff import sha256 as _sha256
from infrarsi.study.paths import CONTRACT_FILE, SPACE_COPY, StudyPaths, make_private_dir
from infrarsi.study.switches import StudySwitches
from infrarsi.workload import Workload

if TYPE_CHECKING:
    from infrarsi.search import SearchSpace


TIMING_RULES = (
    "A step is one optimizer step of the contract's fixed tokens_per_step, timed across all "
    "ranks with synchronisation so that communication is inside it; step_time_s is the median "
    "over the measured steps of the max-over-ranks step time. Warm-up steps and compile/setup "
    "time are reported separately, never dropped silently. One trial owns its devices and CPU "
    "cores while it is timed. A failed trial still costs device time (device_seconds)."
)

DEFAULT_LOSS_ATOL = 1e-4
"""Loss tolerance used while the contract is uncalibrated (doctor replaces it)."""
DEFAULT_EVAL_ATOL = 1e-3
"""Eval-loss tolerance used while the contract is uncalibrated."""

# Fields that with_calibration may change (dotted paths); anything else changing is tampering.
_CALIBRATABLE = {
    "invariants.loss_atol",
    "invariants.loss_rtol",
    "invariants.loss_calibrated",
    "invariants.eval_atol",
    "invariants.eval_rtol",
    "invariants.eval_calibrated",
    "invariants.arithmetic_tolerances",
    "memory_capacity_bytes",
    "amendments",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EditableScope(_Strict):
    """What a study may change."""

    knobs: list[str]
    """Knob names a candidate config may set away from the baseline."""
    globs: list[str] = Field(default_factory=lambda: ["workloads/**"])
    """File globs (relative to the repo root, ``**`` spans directories) a code patch may touch."""


class Invariants(_Strict):
    """What every candidate must keep; checked by ``infrarsi.study.invariants.check_invariants``."""

    tokens_per_step: int
    """Tokens per optimizer step across all ranks, as counted by the harness."""
    optimizer_steps: int
    """Optimizer steps every trial takes (warm-up + measured)."""
    warmup_steps: int
    """Warm-up optimizer steps (timed and reported apart)."""
    loss_atol: float | None = None
    """Absolute loss tolerance per step vs the baseline; None until doctor calibrates it."""
    loss_rtol: float = 0.0
    """Relative loss tolerance per step (|d| <= atol + rtol*|baseline|)."""
    loss_calibrated: bool = False
    """True once doctor measured the loss tolerance (or the user gave it at init)."""
    eval_atol: float | None = None
    """Absolute tolerance of the held-out eval loss vs the baseline's; None until calibrated."""
    eval_rtol: float = 0.0
    """Relative eval-loss tolerance."""
    eval_calibrated: bool = False
    """True once doctor measured the eval tolerance (or the user gave it at init)."""
    replica_checksum_rtol: float = 1e-6
    """Max relative spread of the parameter checksums across data-parallel replicas."""
    timing_rules: str = TIMING_RULES
    """How step time is measured (the rule text every figure obeys)."""
    arithmetic_tolerances: dict[str, ArithmeticTolerance] = Field(default_factory=dict)
    """Knob of another arithmetic the contract allows -> the tolerances of configs that turn it
    on (truthy value), as the doctor calibrated them; empty unless such a knob is allowed."""

    def loss_tolerance(self, config: Mapping[str, Any] | None = None) -> tuple[float, float]:
        """(atol, rtol) in force: the calibrated values, or ``DEFAULT_LOSS_ATOL`` before that;
        for a ``config`` that turns on a knob of ``arithmetic_tolerances``, that knob's wider
        atol where it is wider."""
        atol = DEFAULT_LOSS_ATOL if self.loss_atol is None else self.loss_atol
        own = [t.loss_atol for t in self._arithmetic_on(config)]
        return (max([atol, *own]), self.loss_rtol)

    def eval_tolerance(self, config: Mapping[str, Any] | None = None) -> tuple[float, float]:
        """(atol, rtol) of the eval check: calibrated, or ``DEFAULT_EVAL_ATOL`` before that;
        widened for ``config`` as ``loss_tolerance`` is."""
        atol = DEFAULT_EVAL_ATOL if self.eval_atol is None else self.eval_atol
        own = [t.eval_atol for t in self._arithmetic_on(config)]
        return (max([atol, *own]), self.eval_rtol)

    def _arithmetic_on(self, config: Mapping[str, Any] | None) -> list[ArithmeticTolerance]:
        """The ``arithmetic_tolerances`` of the knobs ``config`` turns on (truthy value)."""
        return [t for k, t in self.arithmetic_tolerances.items() if (config or {}).get(k)]


DEFAULT_LONG_CHECK_BUDGET_S = 90.0
"""Seconds the long check (``infrarsi.stages.long_check``) may take by default: what init records
when not told otherwise, and what a contract written before the field gets. Measured on
``dense_debug`` (2 CPU cores; docs/LONG_CHECK.md): it buys about 2.5x a trial's steps there (the
budget, not the factor, binds: the baseline recipe's steps are slow), and the demo's ``tune``
(9.6 min measured) plus the check stays under 12 minutes."""


class Budgets(_Strict):
    """Limits of the search (None: unlimited)."""

    trials: int | None = None
    """Maximum number of run-stage trials."""
    wall_time_s: float | None = None
    """Maximum wall time of the run stage, seconds."""
    device_hours: float | None = None
    """Maximum device-hours (devices x hours) the study may burn, failed trials included."""
    long_check_s: float | None = None
    """Seconds the long check past the trial's horizon may take (its estimated cost caps the
    horizon: ``infrarsi.stages.long_check``). Init records it; None only in a contract written
    before the field, which gets ``DEFAULT_LONG_CHECK_BUDGET_S`` (``long_check_budget_s``)."""

    @property
    def long_check_budget_s(self) -> float:
        """The long check's budget in force, seconds: ``long_check_s``, else the default."""
        return (
            DEFAULT_LONG_CHECK_BUDGET_S if self.long_check_s is None else float(self.long_check_s)
        )


class Amendment(_Strict):
    """One recorded change after init (only calibrations are allowed)."""

    at: str
    """ISO-8601 UTC time of the change."""
    by: str
    """Who changed it (``doctor``)."""
    changes: dict[str, list[Any]]
    """Dotted field -> [old, new]."""
    reason: str = ""
    """Why (e.g. how the tolerance was measured)."""


class Contract(_Strict):
    """The frozen task contract of one study (``DIR/contract.yaml``)."""

    study: str
    """Study name (the study directory's name)."""
    workload_path: str
    """Absolute path of the workload YAML at init."""
    workload: dict[str, Any]
    """The full workload (as ``Workload.to_yaml_dict``), so the study needs no other file."""
    workload_hash: str
    """``Workload.hash()``: sha256 of the canonical workload dump."""
    workload_git_sha: str | None = None
    """HEAD commit of the git repository holding the workload file at init (None: not in git)."""
    workload_git_dirty: bool = False
    """True when that repository had uncommitted changes at init."""
    search_space_path: str
    """Absolute path of the search-space YAML."""
    search_space_hash: str
    """sha256 of the search-space YAML text."""
    request: str = ""
    """The human request, verbatim."""
    editable: EditableScope
    invariants: Invariants
    memory_capacity_bytes: int | None = None
    """Memory capacity per device in bytes, as resolved at init (``--memory-capacity``, else the
    workload's) or filled in by doctor (the device's); None: unlimited. Read it through
    ``memory_capacity``, which also says where it came from."""
    switches: StudySwitches | None = None
    """The study's switches (analytic prior, loss guard, bank), recorded at init. None only in a
    contract written before they were recorded (see ``switches_in_force``)."""
    budgets: Budgets = Field(default_factory=Budgets)
    created_at: str
    """ISO-8601 UTC time of init."""
    infrarsi_version: str
    """Version of infrarsi that wrote the contract."""
    amendments: list[Amendment] = Field(default_factory=list)
    """Recorded calibrations since init (the only allowed changes)."""
    contract_hash: str = ""
    """sha256 over every field above (canonical JSON); set by ``freeze``."""
    section_hashes: dict[str, str] = Field(default_factory=dict)
    """Top-level field -> sha256 of its canonical JSON, so a change is located even without
    the frozen copy; set by ``freeze`` and not itself hashed."""

    # ----------------------------------------------------------------------------- building
    @classmethod
    def create(
        cls,
        workload: Workload | str | Path,
        *,
        study_dir: str | Path | None = None,
        study: str | None = None,
        request: str = "",
        editable_knobs: list[str] | None = None,
        editable_globs: list[str] | None = None,
        search_space: str | Path | None = None,
        memory_capacity_bytes: int | None = None,
        switches: StudySwitches | None = None,
        trials: int | None = None,
        wall_time_s: float | None = None,
        device_hours: float | None = None,
        loss_atol: float | None = None,
        loss_rtol: float = 0.0,
        eval_atol: float | None = None,
        eval_rtol: float = 0.0,
        long_check_s: float = DEFAULT_LONG_CHECK_BUDGET_S,
    ) -> Contract:
        """Build (and, with ``study_dir``, write) a frozen contract for ``workload``.

        ``editable_knobs`` defaults to every knob of the search space; a tolerance given here
        counts as calibrated; ``memory_capacity_bytes`` is ``--memory-capacity`` (the workload's
        applies when it is None: ``resolve_memory_capacity``); ``switches`` default to
        ``StudySwitches.resolve()`` (the environment, else on / the default bank). Raises
        ``ContractError`` if ``study_dir`` already has a contract.
        """
        from infrarsi.search import SearchSpace

        wl = workload if isinstance(workload, Workload) else Workload.from_yaml(workload)
        wl_path = Path(wl.path).resolve() if wl.path else None
        space_path = Path(search_space) if search_space else wl.search_space_path()
        if not space_path.exists():
            raise ContractError(
                f"search space {str(space_path)!r} does not exist (from workload field "
                f"'search_space' or --space). Fix the path."
            )
        space_text = space_path.read_text()
        knobs = list(SearchSpace.from_yaml(space_path).names)
        if editable_knobs is not None:
            unknown = [k for k in editable_knobs if k not in knobs]
            if unknown:
                raise ContractError(
                    f"--knob (editable.knobs): rule: must be knobs of the search space {space_path}; "
                    f"{unknown} are not (valid: {knobs}). Fix: pick knobs from that list."
                )
        capacity = resolve_memory_capacity(
            flag_bytes=memory_capacity_bytes, workload=wl, device_bytes=None
        )
        git_sha, dirty = _git_head(wl_path.parent) if wl_path else (None, False)
        name = study or (Path(study_dir).resolve().name if study_dir else wl.name)
        c = cls(
            study=name,
            workload_path=str(wl_path) if wl_path else "",
            workload=wl.to_yaml_dict(),
            workload_hash=wl.hash(),
            workload_git_sha=git_sha,
            workload_git_dirty=dirty,
            search_space_path=str(space_path.resolve()),
            search_space_hash=_sha256(space_text),
            request=request,
            editable=EditableScope(
                knobs=list(editable_knobs) if editable_knobs is not None else knobs,
                globs=list(editable_globs) if editable_globs is not None else ["workloads/**"],
            ),
            invariants=Invariants(
                tokens_per_step=wl.tokens_per_step,
                optimizer_steps=wl.steps.warmup + wl.steps.measured,
                warmup_steps=wl.steps.warmup,
                loss_atol=loss_atol,
                loss_rtol=loss_rtol,
                loss_calibrated=loss_atol is not None,
                eval_atol=eval_atol,
                eval_rtol=eval_rtol,
                eval_calibrated=eval_atol is not None,
            ),
            memory_capacity_bytes=capacity.memory_capacity_bytes,
            switches=switches if switches is not None else StudySwitches.resolve(),
            budgets=Budgets(
                trials=trials,
                wall_time_s=wall_time_s,
                device_hours=device_hours,
                long_check_s=long_check_s,
            ),
            created_at=_now(),
            infrarsi_version=_version(),
        ).freeze()
        if study_dir is not None:
            d = Path(study_dir)
            if (StudyPaths(d).contract).exists():
                raise ContractError(
                    f"{StudyPaths(d).contract} already exists; a contract is frozen once written. "
                    f"Start a new study directory to change it."
                )
            c._write(d)
        return c

    def content(self) -> dict[str, Any]:
        """Every field but ``contract_hash``, as canonical JSON-able data (an absent ``switches``
        section, ``budgets.long_check_s`` or empty ``invariants.arithmetic_tolerances`` stays
        absent, so contracts written before them keep their hash)."""
        exclude: dict[str, Any] = {"contract_hash": True, "section_hashes": True}
        if self.switches is None:
            exclude["switches"] = True
        if self.budgets.long_check_s is None:
            exclude["budgets"] = {"long_check_s": True}
        if not self.invariants.arithmetic_tolerances:
            exclude["invariants"] = {"arithmetic_tolerances": True}
        return self.model_dump(mode="json", exclude=exclude)

    def compute_hash(self) -> str:
        return _sha256(_canonical(self.content()))

    def freeze(self) -> Contract:
        """A copy with ``contract_hash`` set over the current content."""
        content = self.content()
        sections = {k: _sha256(_canonical(v))[:16] for k, v in content.items()}
        return self.model_copy(
            update={"contract_hash": _sha256(_canonical(content)), "section_hashes": sections}
        )

    def workload_model(self) -> Workload:
        """The embedded workload as a ``Workload`` (path set to the original file)."""
        wl = Workload.from_dict(dict(self.workload), source=self.workload_path or "<contract>")
        return wl

    # ----------------------------------------------------------------------------- resolved facts
    @property
    def memory_capacity(self) -> MemoryCapacity:
        """The study's memory capacity per device and its source, in the order of
        ``infrarsi.study.capacity``: ``--memory-capacity``, the workload's, the device's (filled in
        by doctor), else unlimited. Every reader of the capacity uses this. The source is read
        back from the record: a doctor amendment means ``device``; a value equal to the embedded
        workload's ``memory_capacity`` reads as ``workload`` (also when the flag gave the same)."""
        cap = self.memory_capacity_bytes
        if cap is None:
            return MemoryCapacity(None, "unlimited")
        if any("memory_capacity_bytes" in a.changes for a in self.amendments):
            return MemoryCapacity(cap, "device")
        try:
            from_workload = self.workload_model().memory_capacity_bytes
        except Exception:  # an unparsable embedded size cannot have produced ``cap``
            from_workload = None
        return MemoryCapacity(cap, "workload" if from_workload == cap else "--memory-capacity")

    def switches_in_force(self) -> StudySwitches:
        """The study's switches: the recorded ``switches``; for a contract written before they
        were recorded, what init would record now (``StudySwitches.resolve()``: the environment,
        else the defaults), which is how such a study always behaved."""
        return self.switches if self.switches is not None else StudySwitches.resolve()

    def search_space(self, study_dir: str | Path) -> SearchSpace:
        """The study's search space: its copy ``DIR/search_space.yaml`` (or, without one, the
        file at ``search_space_path``), refused with ``ContractError`` unless it hashes as at
        init (``check_space_file``)."""
        from infrarsi.search import SearchSpace

        d = Path(study_dir)
        path = StudyPaths(d).search_space
        if not path.exists():
            path = Path(self.search_space_path)
        if not path.exists():
            raise ContractError(
                f"{d}: the search space is missing (neither {SPACE_COPY} nor "
                f"{self.search_space_path} exists). Restore it or re-run init."
            )
        self.check_space_file(path)
        return SearchSpace.from_yaml(path)

    def check_space_file(self, path: str | Path) -> str:
        """The text of the search-space file ``path``; ``ContractError`` when its sha256 is not
        the contract's ``search_space_hash`` (the one check of the search space)."""
        p = Path(path)
        text = p.read_text()
        now = _sha256(text)
        if now != self.search_space_hash:
            raise ContractError(
                f"search space {p} changed since init (sha256 {self.search_space_hash[:12]} at init, "
                f"{now[:12]} now; field search_space_hash). The study measured the old space: "
                f"restore the file, or run `infrarsi init` into a new study directory."
            )
        return text

    # ----------------------------------------------------------------------------- calibration
    def with_calibration(
        self,
        *,
        loss_atol: float | None = None,
        loss_rtol: float | None = None,
        eval_atol: float | None = None,
        eval_rtol: float | None = None,
        memory_capacity_bytes: int | None = None,
        arithmetic_tolerances: Mapping[str, ArithmeticTolerance] | None = None,
        by: str = "doctor",
        reason: str = "",
    ) -> Contract:
        """A re-frozen copy with calibrated tolerances, recording an ``Amendment``.

        A memory capacity may only be filled in when init left it unset. Call ``save(DIR)``.
        """
        inv = self.invariants.model_copy()
        changes: dict[str, list[Any]] = {}

        def setf(name: str, value: Any) -> None:
            old = getattr(inv, name)
            if old != value:
                changes[f"invariants.{name}"] = [old, value]
                setattr(inv, name, value)

        for name, val in (
            ("loss_atol", loss_atol),
            ("loss_rtol", loss_rtol),
            ("eval_atol", eval_atol),
            ("eval_rtol", eval_rtol),
        ):
            if val is not None:
                if not (val >= 0 and val == val):
                    raise ContractError(f"calibration {name}={val!r}: a tolerance must be >= 0.")
                setf(name, float(val))
        if loss_atol is not None or loss_rtol is not None:
            setf("loss_calibrated", True)
        if eval_atol is not None or eval_rtol is not None:
            setf("eval_calibrated", True)
        if arithmetic_tolerances:
            merged = {**inv.arithmetic_tolerances, **arithmetic_tolerances}
            if merged != inv.arithmetic_tolerances:
                changes["invariants.arithmetic_tolerances"] = [
                    {k: t.model_dump() for k, t in inv.arithmetic_tolerances.items()},
                    {k: t.model_dump() for k, t in merged.items()},
                ]
                inv.arithmetic_tolerances = merged
        cap = self.memory_capacity_bytes
        if memory_capacity_bytes is not None and memory_capacity_bytes != cap:
            if cap is not None:
                raise ContractError(
                    f"contract {self.study}: memory_capacity_bytes is fixed at {cap} by init; "
                    f"calibration may only fill it in when unset. Start a new study to change it."
                )
            changes["memory_capacity_bytes"] = [None, int(memory_capacity_bytes)]
            cap = int(memory_capacity_bytes)
        if not changes:
            return self
        amend = Amendment(at=_now(), by=by, changes=changes, reason=reason)
        return self.model_copy(
            update={
                "invariants": inv,
                "memory_capacity_bytes": cap,
                "amendments": [*self.amendments, amend],
            }
        ).freeze()

    # ----------------------------------------------------------------------------- files
    def save(self, study_dir: str | Path) -> Contract:
        """Write a calibrated contract over the existing one (refuses any other change)."""
        d = Path(study_dir)
        frozen_path = StudyPaths(d).frozen_contract
        if frozen_path.exists():
            old = json.loads(frozen_path.read_text())
            old.pop("contract_hash", None)
            old.pop("section_hashes", None)
            bad = [p for p, _a, _b in _diff(old, self.content()) if not _calibratable(p)]
            if bad:
                raise ContractError(
                    f"{StudyPaths(d).contract}: only calibrations may change a frozen contract "
                    f"(through Contract.with_calibration), but these fields differ: {bad}. "
                    f"Start a new study directory (infrarsi init) to change them."
                )
        frozen = self.freeze()
        frozen._write(d)
        return frozen

    def _write(self, d: Path) -> None:
        make_private_dir(d)
        data = self.content()
        data["contract_hash"] = self.contract_hash
        data["section_hashes"] = dict(self.section_hashes)
        header = (
            "# infrarsi task contract: frozen. Any edit here is refused by later stages.\n"
            "# To change it, run `infrarsi init` into a new study directory.\n"
        )
        _atomic_write(StudyPaths(d).contract, header + yaml.safe_dump(data, sort_keys=False))
        _atomic_write(StudyPaths(d).frozen_contract, json.dumps(data, indent=1, sort_keys=True))

    @classmethod
    def load(cls, study_dir: str | Path, *, check_files: bool = True) -> Contract:
        """Read and verify ``DIR/contract.yaml``.

        Raises ``ContractError`` naming every changed field when the content no longer matches
        its hash or the frozen copy, and (with ``check_files``) when the workload or search-space
        file on disk no longer hashes as at init. A missing file is not an error: the contract
        embeds the workload.
        """
        d = Path(study_dir)
        path = StudyPaths(d).contract
        if not path.exists():
            raise ContractError(
                f"{path} does not exist; run `infrarsi init WORKLOAD --study {d}` first."
            )
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, UnicodeDecodeError) as e:
            raise ContractError(
                f"{path}: cannot be read as UTF-8 text ({e}); the contract was edited or "
                f"damaged. Restore it, or re-run init in a new study directory."
            ) from None
        except yaml.YAMLError as e:
            raise ContractError(
                f"{path}: not valid YAML ({e}); the contract was edited. "
                f"Re-run init in a new study directory."
            ) from e
        if not isinstance(data, dict):
            raise ContractError(f"{path}: a contract must be a mapping; got {type(data).__name__}.")
        odd = [k for k in data if not isinstance(k, str)]
        if odd:
            raise ContractError(
                f"{path}: field {odd[0]!r}: field names must be strings; the contract was "
                f"edited. Restore it, or re-run init in a new study directory."
            )
        frozen = None
        if (StudyPaths(d).frozen_contract).exists():
            try:
                frozen = json.loads((StudyPaths(d).frozen_contract).read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ContractError(
                    f"{StudyPaths(d).frozen_contract}: the frozen copy of the contract cannot be read ({e}); "
                    f"it was edited or damaged. Restore it, or re-run init in a new study "
                    f"directory."
                ) from None
            if not isinstance(frozen, dict):
                raise ContractError(
                    f"{StudyPaths(d).frozen_contract}: the frozen copy of the contract must be a JSON object; "
                    f"got {type(frozen).__name__}. Restore it, or re-run init."
                )
        stored_hash = data.get("contract_hash", "")
        try:
            c = cls(**data)
        except ValidationError as e:
            hint = _describe_diff(frozen, data) if frozen else ""
            raise ContractError(
                f"{path}: malformed contract ({e.error_count()} errors: "
                f"{e.errors()[0]['loc']}: {e.errors()[0]['msg']}). {hint}"
            ) from None
        actual = c.compute_hash()
        problems = []
        if frozen is not None and frozen.get("contract_hash") != stored_hash:
            problems.append(
                f"contract_hash was edited (frozen {frozen.get('contract_hash')!r}, "
                f"file {stored_hash!r})"
            )
        if actual != stored_hash or (frozen is not None and actual != frozen.get("contract_hash")):
            diff = (
                _describe_diff(frozen, c.content())
                if frozen
                else describe_sections(c.content(), c.section_hashes)
            )
            problems.append(f"content does not match its hash: {diff}")
        if problems:
            raise ContractError(
                f"{path}: the contract changed after init and is refused: "
                + "; ".join(problems)
                + ". A contract is frozen: restore the original, or run `infrarsi init` into a "
                "new study directory."
            )
        if check_files:
            c.check_files()
        return c

    def check_files(self) -> None:
        """Raise ``ContractError`` if the workload or search-space file changed since init."""
        wp = Path(self.workload_path) if self.workload_path else None
        if wp is not None and wp.exists():
            try:
                now = Workload.from_yaml(wp).hash()
            except Exception as e:  # a broken workload file is a changed one
                now = f"<unreadable: {e}>"
            if now != self.workload_hash:
                raise ContractError(
                    f"workload file {wp} changed since init (sha256 {self.workload_hash[:12]} at "
                    f"init, {now[:12]} now). The study measured the old workload: restore the "
                    f"file, or run `infrarsi init {wp} --study NEW_DIR` for a new study."
                )
        sp = Path(self.search_space_path)
        if sp.exists():
            self.check_space_file(sp)


# --------------------------------------------------------------------------------- helpers
def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("infrarsi")
    except Exception:
        return "0+unknown"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _git_head(folder: Path) -> tuple[str | None, bool]:
    """(HEAD sha, dirty) of the git repo holding ``folder``; (None, False) outside git or
    before its first commit. Dirty counts tracked files only (untracked files are ignored)."""
    import git

    try:
        repo = git.Repo(str(folder), search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return None, False
    try:
        with repo:
            return repo.head.commit.hexsha, repo.is_dirty(untracked_files=False)
    except (ValueError, git.GitError):  # no commit yet (unborn HEAD), or git itself failed
        return None, False


def _calibratable(path: str) -> bool:
    return any(path == c or path.startswith(c + ".") for c in _CALIBRATABLE)


__all__ = [
    "CONTRACT_FILE",
    "DEFAULT_LONG_CHECK_BUDGET_S",
    "SPACE_COPY",
    "TIMING_RULES",
    "Amendment",
    "Budgets",
    "Contract",
    "EditableScope",
    "Invariants",
]
