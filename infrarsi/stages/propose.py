"""The proposal protocol: what an outside agent reads from a study, and how it proposes.

An outside agent (an LLM coding agent, a person) reads the study and asks it to try something:

- ``study_state(DIR, predict=[...])``: the trials, the best so far (and verify's confidence
  interval once verify ran), the budget left, the editable scope, the queued proposals, and the
  optimizer's predictions (step time, P(fit), P(ok), peak memory) for any configs passed in.
- ``propose(DIR, config, why=..., patch=...)``: checks the proposal against the contract (every
  knob known and valid, only editable knobs changed, no knob set where its ``when`` condition is
  false, a patch only inside the editable globs and applying to the workload's code, not a
  candidate already queued or measured) and queues it (``infrarsi.study.proposals``);
  ``withdraw(DIR, ID)`` takes a queued one back. The next run
  trial takes it; it is then an ordinary trial: invariant-checked, told to the optimizer, verified
  like any candidate, its rationale kept in the row and the report.

The CLI (``infrarsi state``, ``infrarsi propose``) and the MCP server (``infrarsi mcp``) call these.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from infrarsi.errors import PatchError, ProposalError
from infrarsi.study.candidate import Candidate, PatchRef, file_sha256
from infrarsi.study.paths import StudyPaths, make_private_dir
from infrarsi.study.proposals import Proposal, ProposalQueue

if TYPE_CHECKING:
    from infrarsi.result import TrialResult
    from infrarsi.search.space import SearchSpace
    from infrarsi.study.contract import Contract


@dataclass(frozen=True)
class ProposalFields:
    """How the caller spells a proposal's fields, so that a refusal names what the caller typed.

    The CLI says ``--config``, the MCP tools say ``config``: the same rule, in the caller's terms."""

    config: str
    """The field holding the knob values (``--config``, ``config``)."""
    why: str
    """The field holding the rationale (``--why``, ``why``)."""
    patch: str
    """The field holding the patch (``--patch``: a file; ``patch``: the diff text)."""
    proposal_id: str
    """The field naming a proposal to withdraw (``PROPOSAL_ID``, ``proposal_id``)."""
    style: Literal["flag", "json"]
    """How a fix example is written: ``--why 'text'`` (flag) or ``"why": "text"`` (json)."""

    def example(self, field_name: str, value: str) -> str:
        """``field_name`` set to ``value`` (a JSON text) the way the caller writes it."""
        return f"{field_name} '{value}'" if self.style == "flag" else f'"{field_name}": {value}'


CLI_FIELDS = ProposalFields(
    config="--config", why="--why", patch="--patch", proposal_id="PROPOSAL_ID", style="flag"
)
"""Field names of ``infrarsi propose`` (and of the Python API)."""
TOOL_FIELDS = ProposalFields(
    config="config", why="why", patch="patch", proposal_id="proposal_id", style="json"
)
"""Field names of the MCP server's tools (``infrarsi mcp``)."""


EXAMPLE_WHY = "larger micro-batch: the GPU is underfed at mbs 1"
"""The reason an error shows as an example of a proposal's ``why``."""


def propose(
    study_dir: str | Path,
    config: Mapping[str, Any],
    *,
    why: str,
    patch: str | Path | None = None,
    patch_text: str | None = None,
    proposer: str = "python",
    fields: ProposalFields = CLI_FIELDS,
) -> Proposal:
    """Check ``config`` (knob -> value; knobs left out keep the baseline's value) and a patch
    (``patch``: a diff file; ``patch_text``: the diff itself) against the study's contract and
    queue them. Bad input raises a ``UserInputError`` (exit 2) naming the field (as ``fields``
    spells it), the rule and the fix: an unknown knob or value, a knob outside the editable scope,
    a knob set while its ``when`` condition is false (it would be silently dropped), and a
    candidate already queued or already measured (it would be run twice)."""
    from infrarsi.orchestration.common import baseline_config, load_space
    from infrarsi.patches import config_patch
    from infrarsi.study.contract import Contract

    paths = StudyPaths(Path(study_dir).resolve())
    contract = Contract.load(paths.root)
    if not isinstance(why, str) or not why.strip():
        raise ProposalError(
            f"propose {fields.why}: rule: a proposal says why it should be faster (kept in the log "
            f"and the report). Fix: {fields.example(fields.why, json.dumps(EXAMPLE_WHY))}."
        )
    if not isinstance(config, Mapping):
        raise ProposalError(
            f"propose {fields.config}: rule: an object of knob -> value; got {type(config).__name__}. "
            f"Fix: {fields.example(fields.config, json.dumps({'micro_batch_size': 4}))}."
        )
    if patch is not None and patch_text is not None:
        raise ProposalError(
            f"propose {fields.patch}: rule: one patch per proposal, given as a file or as text, not both."
        )
    space = load_space(contract, paths.root)
    base = baseline_config(contract, paths.root)
    full = space.validate({**base, **dict(config)}, where=f"propose {fields.config}")
    _check_scope(contract, space.names, base, full, fields)
    _check_active(space, config, full, fields)
    if (patch is not None or patch_text is not None) and config_patch(full) is not None:
        raise ProposalError(
            f"propose {fields.patch}: rule: a proposal brings one patch, and its {fields.config} also "
            f"names code_patch={full.get('code_patch')!r}. Fix: drop one of them."
        )
    queue = ProposalQueue(paths.root)
    with queue.locked():  # the id, the duplicate check and the files, one proposer at a time
        pid = _next_id(queue, paths)
        stored: str | None = None
        touched: list[str] = []
        if patch is not None:
            touched, stored = _check_and_store_patch(contract, paths, Path(patch), pid)
        elif patch_text is not None:
            touched, stored = _store_patch_text(contract, paths, patch_text, pid, fields)
        try:
            _check_new(paths, space, queue, full, stored, fields)
        except ProposalError:
            if stored is not None:
                (paths.root / stored).unlink(missing_ok=True)
            raise
        return queue.add(
            Proposal(
                proposal_id=pid,
                config=full,
                why=why.strip(),
                proposer=proposer,
                asked=dict(config),
                patch=stored,
                patch_paths=touched,
            )
        )


def withdraw(
    study_dir: str | Path, proposal_id: str, *, fields: ProposalFields = CLI_FIELDS
) -> Proposal:
    """Withdraw the queued proposal ``proposal_id``: it moves to ``proposals/withdrawn/`` (kept
    for the record) and no run trial takes it. One already taken by a run trial, or unknown,
    raises ``ProposalError`` naming what the queue holds."""
    paths = StudyPaths(Path(study_dir).resolve())
    queue = ProposalQueue(paths.root)
    with queue.locked():
        queued = {p.proposal_id: p for p in queue.queued()}
        p = queued.get(proposal_id)
        if p is not None:
            make_private_dir(withdrawn_dir(paths))
            try:
                os.rename(
                    queue.queued_dir / f"{proposal_id}.json",
                    withdrawn_dir(paths) / f"{proposal_id}.json",
                )
                return p
            except FileNotFoundError:
                pass  # a run trial took it meanwhile
    taken = {t.proposal_id for t in queue.taken()}
    state = (
        "already taken by a run trial (it ran, or is running: see the trials)"
        if proposal_id in taken
        else "already withdrawn"
        if (withdrawn_dir(paths) / f"{proposal_id}.json").exists()
        else "not a proposal of this study"
    )
    raise ProposalError(
        f"withdraw {fields.proposal_id}: rule: only a queued proposal can be withdrawn; "
        f"{proposal_id!r} is {state}. Queued now: {sorted(queued) or 'none'}."
    )


def withdrawn_dir(paths: StudyPaths) -> Path:
    """Where withdrawn proposals are kept (``DIR/proposals/withdrawn/``)."""
    return paths.proposals / "withdrawn"


def _next_id(queue: ProposalQueue, paths: StudyPaths) -> str:
    """The queue's next id, past the withdrawn ones too (an id, and its patch file, is never reused)."""
    n = max(
        [
            int(f.stem.split("-")[1])
            for f in withdrawn_dir(paths).glob("prop-*.json")
            if f.stem.split("-")[1].isdigit()
        ],
        default=0,
    )
    return f"prop-{max(int(queue.next_id().split('-')[1]), n + 1):04d}"


def _check_scope(
    contract: Contract,
    names: Sequence[str],
    base: Mapping[str, Any],
    full: Mapping[str, Any],
    fields: ProposalFields,
) -> None:
    """Refuse a change to a knob outside the contract's ``editable.knobs``."""
    editable = list(contract.editable.knobs)
    for name in names:
        if name not in editable and full[name] != base[name]:
            raise ProposalError(
                f"propose {fields.config}: knob {name!r}: out of scope: rule: a proposal may change only the "
                f"contract's editable.knobs {editable}; {name} is pinned at the baseline's {base[name]!r}, "
                f"proposed {full[name]!r}. Fix: leave {name} out (it keeps {base[name]!r})."
            )


def _check_active(
    space: SearchSpace, asked: Mapping[str, Any], full: Mapping[str, Any], fields: ProposalFields
) -> None:
    """Refuse a knob set to a value its ``when`` condition would drop (the knob is inactive under
    the rest of the config, so the trial would run its default instead of what was asked)."""
    for name in asked:
        knob = space.knob(name)
        if knob.when is None or full[name] == knob.canonical(
            asked[name], file=f"propose {fields.config}"
        ):
            continue
        deps = {d: full[d] for d in sorted(knob.when.names)}
        raise ProposalError(
            f"propose {fields.config}: knob {name!r}: inactive: rule: a knob takes effect only where its "
            f"condition '{knob.when.text}' holds; with {deps} it does not, so {name} would run at its "
            f"default {knob.default!r}, not {asked[name]!r}. Fix: also set "
            f"{', '.join(deps)} so that '{knob.when.text}' holds, or leave {name} out."
        )


def _check_new(
    paths: StudyPaths,
    space: SearchSpace,
    queue: ProposalQueue,
    full: Mapping[str, Any],
    stored: str | None,
    fields: ProposalFields,
) -> None:
    """Refuse a candidate (``Candidate.key``: the config and its proposal patch's digest) that is
    already queued, taken by a run trial still in flight, or already measured by a run trial (a
    ``failed`` row, which measured nothing, does not count; nor do doctor's calibration rows, which
    are not candidates verify picks from)."""
    from infrarsi.study.trial_log import read_trials, rows

    key = _candidate_key(paths, full, stored)
    what = f"config{' and patch' if stored else ''}"
    history = rows(read_trials(paths.root))
    logged = {str((r.extra.proposal or {}).get("proposal_id")) for r in history}
    waiting = [(q, "queued proposal") for q in queue.queued()]
    waiting += [
        (t, "proposal in flight (taken by a run trial)")
        for t in queue.taken()
        if t.proposal_id not in logged
    ]
    for q, state in waiting:
        if _candidate_key(paths, _canonical(space, q.config), q.patch) == key:
            raise ProposalError(
                f"propose {fields.config}: duplicate: rule: a candidate is queued once; {state} "
                f"{q.proposal_id} ({q.why!r}) is the same {what}. Fix: change a knob or the patch"
                + (f", or withdraw {q.proposal_id} first." if state.startswith("queued") else ".")
            )
    for r in history:
        if r.stage != "run" or r.status == "failed" or r.extra.interrupted:
            continue
        own = tuple(p for p in Candidate.from_row(r).patches if p.source == "proposal")
        if Candidate(config=_canonical(space, r.config), patches=own).key == key:
            raise ProposalError(
                f"propose {fields.config}: duplicate: rule: a candidate is run once; run trial "
                f"{r.trial_id} ({r.status}, step_time_s={r.step_time_s}) already ran this {what}. Fix: "
                f"propose another config (the study's state lists the trials), or let verify re-measure it."
            )


def _candidate_key(paths: StudyPaths, config: Mapping[str, Any], patch: str | None) -> str:
    refs = (
        ()
        if patch is None
        else (PatchRef(path=patch, sha256=file_sha256(paths.root / patch), source="proposal"),)
    )
    return Candidate(config=dict(config), patches=refs).key


def _canonical(space: SearchSpace, config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as the space writes it (canonical values, inactive knobs at defaults), or as
    is when the space no longer accepts it."""
    from infrarsi.errors import SearchSpaceError

    try:
        return dict(space.validate(dict(config)))
    except SearchSpaceError:
        return dict(config)


def _store_patch_text(
    contract: Contract, paths: StudyPaths, text: str, pid: str, fields: ProposalFields
) -> tuple[list[str], str]:
    """``_check_and_store_patch`` for a diff given as text: it is written where it will be kept,
    checked there, and removed again on a refusal, whose message names the field, not the file."""
    dest = make_private_dir(paths.proposal_patches) / f"{pid}.diff"
    dest.write_text(text)
    try:
        return _check_and_store_patch(contract, paths, dest, pid)
    except PatchError as e:
        dest.unlink(missing_ok=True)
        text = (
            str(e)
            .replace(f"patch {dest}", f"propose {fields.patch}")
            .replace(str(dest), f"the {fields.patch} text")
        )
        if fields.style == "json":  # an agent cannot widen the scope: the study's owner can
            text = text.replace(
                "run `infrarsi init --editable GLOB` into a new study",
                "ask the study's owner for a new study with wider editable globs",
            )
        raise PatchError(text) from None


def _check_and_store_patch(
    contract: Contract, paths: StudyPaths, patch: Path, pid: str
) -> tuple[list[str], str]:
    from infrarsi.execution.runner import default_code_dir
    from infrarsi.patches import Patch, check_applies, check_scope, code_repo

    p = Patch.load(patch)
    touched = check_scope(
        p, contract.editable.globs
    )  # forbidden paths, binary, symlinks, modes: refused
    try:
        repo, _ = code_repo(default_code_dir(contract.workload_model()))
    except PatchError as e:
        raise PatchError(f"propose --patch: the workload's code: {e}") from None
    check_applies(repo, p)
    dest_dir = make_private_dir(paths.proposal_patches)
    dest = dest_dir / f"{pid}.diff"
    if patch.resolve() != dest.resolve():
        shutil.copyfile(patch, dest)
    return list(touched), str(dest.relative_to(paths.root))


def study_state(study_dir: str | Path, predict: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """What a proposer needs to know, as one JSON-able dict (see the module docstring)."""
    from infrarsi.orchestration.common import baseline_config, scoped_space
    from infrarsi.study.contract import Contract
    from infrarsi.study.doctor_report import DoctorReport
    from infrarsi.study.lock import holder_of
    from infrarsi.study.trial_log import read_trials, rows

    paths = StudyPaths(Path(study_dir).resolve())
    contract = Contract.load(paths.root)
    holder = holder_of(paths.root)  # read only: state never takes the study lock
    history = rows(read_trials(paths.root))
    doctor = DoctorReport.load_if_present(paths.root)
    base_s = doctor.baseline_step_time_s if doctor is not None else None
    space = scoped_space(contract, paths.root)
    run = [r for r in history if r.stage == "run" and not r.extra.interrupted]
    ok = [r for r in run if r.status == "ok" and r.step_time_s]
    best = min(ok, key=lambda r: r.step_time_s or math.inf) if ok else None
    budget = int(contract.budgets.trials or 24)
    queue = ProposalQueue(paths.root)
    by_proposal = {
        str(r.extra.proposal.get("proposal_id")): r
        for r in history
        if isinstance(r.extra.proposal, dict)
    }
    out: dict[str, Any] = {
        "study": str(paths.root),
        "workload": contract.workload_model().name,
        "stages_done": [
            s for s, p in (("doctor", paths.doctor), ("verify", paths.verify)) if p.exists()
        ],
        "held_by": None if holder is None else holder.to_dict(),
        "baseline": {"config": baseline_config(contract, paths.root), "step_time_s": base_s},
        "trials": {
            "by_stage_and_status": _counts(history),
            "run": [_brief(r) for r in run],
        },
        "best": None
        if best is None
        else {
            **_brief(best),
            "speedup_vs_baseline": (base_s / best.step_time_s)
            if base_s and best.step_time_s
            else None,
        },
        "verified": _verified(paths),
        "budget": {
            "run_trials": budget,
            "run_trials_used": len(run),
            "run_trials_left": max(0, budget - len(run)),
            "device_hours": contract.budgets.device_hours,
            "device_seconds_used": sum(float(r.device_seconds or 0.0) for r in history),
        },
        "scope": {
            "editable_knobs": {
                k.name: list(k.values) for k in space.knobs if k.name in contract.editable.knobs
            },
            "editable_globs": list(contract.editable.globs),
            "memory_capacity_bytes": contract.memory_capacity.memory_capacity_bytes,
        },
        "proposals": {
            "queued": [p.to_dict() for p in queue.queued()],
            "taken": [
                {
                    **p.to_dict(),
                    "trial": _brief(by_proposal[p.proposal_id])
                    if p.proposal_id in by_proposal
                    else None,
                }
                for p in queue.taken()
            ],
            "withdrawn": [
                json.loads(f.read_text()) for f in sorted(withdrawn_dir(paths).glob("prop-*.json"))
            ],
        },
        "predictions": predictions(contract, paths, history, predict) if predict else [],
    }
    return json.loads(json.dumps(out, default=_jsonable))


def predictions(
    contract: Contract,
    paths: StudyPaths,
    history: list[TrialResult],
    configs: Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """The optimizer's predictions for ``configs`` (knobs left out: the baseline's), fitted on the
    study's log: step time (s), its sd (log), peak memory (bytes per device), P(fit), P(ok)."""
    from infrarsi.orchestration.common import baseline_config
    from infrarsi.orchestration.optimizer_factory import build_optimizer

    base = baseline_config(contract, paths.root)
    opt = build_optimizer(contract, history, study_dir=paths.root)
    full = [
        opt.space.validate({**base, **dict(c)}, where=f"predict config {i}")
        for i, c in enumerate(configs)
    ]
    pred = opt.predict(full)
    return [
        {"config": c, **{k: _finite(v[i]) for k, v in pred.items()}} for i, c in enumerate(full)
    ]


def _brief(r: TrialResult) -> dict[str, Any]:
    return {
        "trial_id": r.trial_id,
        "stage": r.stage,
        "status": r.status,
        "step_time_s": r.step_time_s,
        "peak_memory_bytes": r.peak_memory_bytes,
        "mfu": r.mfu,
        "config": dict(r.config),
        "proposal_id": (r.extra.proposal or {}).get("proposal_id"),
        "error": (r.error or "")[:300],
    }


def _counts(history: list[TrialResult]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in history:
        out.setdefault(r.stage, {}).setdefault(r.status, 0)
        out[r.stage][r.status] += 1
    return out


def _verified(paths: StudyPaths) -> dict[str, Any] | None:
    if not paths.verify.exists():
        return None
    v = json.loads(paths.verify.read_text())
    best = v.get("best")
    return {"best": best, "reason": v.get("reason"), "noise_margin": v.get("noise_margin")}


def _finite(x: Any) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _jsonable(x: Any) -> Any:
    if hasattr(x, "isoformat"):
        return x.isoformat()
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)
