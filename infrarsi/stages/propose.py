"""The proposal protocol: what an outside agent reads from a study, and how it proposes.

An outside agent (an LLM coding agent, a person) reads the study and asks it to try something:

- ``study_state(DIR, predict=[...])``: the trials, the best so far (and verify's confidence
  interval once verify ran), the budget left, the editable scope, the queued proposals, and the
  optimizer's predictions (step time, P(fit), P(ok), peak memory) for any configs passed in.
- ``propose(DIR, config, why=..., patch=...)``: checks the proposal against the contract (every
  knob known and valid, only editable knobs changed, a patch only inside the editable globs and
  applying to the workload's code) and queues it (``infrarsi.study.proposals``). The next run
  trial takes it; it is then an ordinary trial: invariant-checked, told to the optimizer, verified
  like any candidate, its rationale kept in the row and the report.

The CLI (``infrarsi state``, ``infrarsi propose``) and the MCP server (``infrarsi mcp``) call these.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from infrarsi.errors import PatchError, ProposalError
from infrarsi.study.paths import StudyPaths, make_private_dir
from infrarsi.study.proposals import Proposal, ProposalQueue


def propose(study_dir: str | Path, config: Mapping[str, Any], *, why: str, patch: str | Path | None = None,
            proposer: str = "python") -> Proposal:
    """Check ``config`` (knob -> value; knobs left out keep the baseline's value) and ``patch``
    against the study's contract and queue them. Bad input raises a ``UserInputError`` (exit 2)
    naming the field, the rule and the fix."""
    from infrarsi.execution.knobs.code_patch import config_patch
    from infrarsi.stages.common import baseline_config, load_space, scope_violation
    from infrarsi.study.contract import Contract

    paths = StudyPaths(Path(study_dir).resolve())
    contract = Contract.load(paths.root)
    if not isinstance(why, str) or not why.strip():
        raise ProposalError("propose --why: rule: a proposal says why it should be faster (kept in the log and "
                            "the report). Fix: --why 'larger micro-batch: the GPU is underfed at mbs 1'.")
    if not isinstance(config, Mapping):
        raise ProposalError(f"propose --config: rule: a JSON object of knob -> value; got {type(config).__name__}. "
                            f"Fix: --config '{{\"micro_batch_size\": 4}}'.")
    space = load_space(contract, paths.root)
    base = baseline_config(contract, paths.root)
    full = space.validate({**base, **dict(config)}, where="propose --config")
    scope = scope_violation(contract, space, base, full)
    if scope is not None:
        raise ProposalError(f"propose --config: out of scope: {scope}")
    if patch is not None and config_patch(full) is not None:
        raise ProposalError("propose --patch: rule: a proposal brings one patch, and its config also names "
                            f"code_patch={full.get('code_patch')!r}. Fix: drop one of them.")
    queue = ProposalQueue(paths.root)
    with queue.locked():  # the id and its files, one proposer at a time
        pid = queue.next_id()
        stored: str | None = None
        touched: list[str] = []
        if patch is not None:
            touched, stored = _check_and_store_patch(contract, paths, Path(patch), pid)
        return queue.add(Proposal(proposal_id=pid, config=full, why=why.strip(), proposer=proposer,
                                  asked=dict(config), patch=stored, patch_paths=touched))


def _check_and_store_patch(contract: Any, paths: StudyPaths, patch: Path, pid: str) -> tuple[list[str], str]:
    import git

    from infrarsi.execution.runner import default_code_dir
    from infrarsi.patches import Patch, check_applies, check_scope

    p = Patch.load(patch)
    touched = check_scope(p, contract.editable.globs)  # forbidden paths, binary, symlinks, modes: refused
    code_root = Path(default_code_dir(contract.workload_model())).resolve()
    try:
        repo = git.Repo(str(code_root), search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise PatchError(f"propose --patch: the workload's code ({code_root}) is not in a git repository; "
                         f"patches need it committed to git.") from None
    check_applies(repo, p)
    dest_dir = make_private_dir(paths.proposals / "patches")
    dest = dest_dir / f"{pid}.diff"
    shutil.copyfile(patch, dest)
    return list(touched), str(dest.relative_to(paths.root))


def study_state(study_dir: str | Path, predict: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """What a proposer needs to know, as one JSON-able dict (see the module docstring)."""
    from infrarsi.stages.common import baseline_config, scoped_space
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
    run = [r for r in history if r.stage == "run" and not r.extra.get("interrupted")]
    ok = [r for r in run if r.status == "ok" and r.step_time_s]
    best = min(ok, key=lambda r: r.step_time_s or math.inf) if ok else None
    budget = int(contract.budgets.trials or 24)
    queue = ProposalQueue(paths.root)
    by_proposal = {str(r.extra["proposal"].get("proposal_id")): r for r in history
                   if isinstance(r.extra.get("proposal"), dict)}
    out: dict[str, Any] = {
        "study": str(paths.root),
        "workload": contract.workload_model().name,
        "stages_done": [s for s, p in (("doctor", paths.doctor), ("verify", paths.verify)) if p.exists()],
        "held_by": None if holder is None else holder.to_dict(),
        "baseline": {"config": baseline_config(contract, paths.root), "step_time_s": base_s},
        "trials": {
            "by_stage_and_status": _counts(history),
            "run": [_brief(r) for r in run],
        },
        "best": None if best is None else {**_brief(best), "speedup_vs_baseline": (base_s / best.step_time_s) if base_s and best.step_time_s else None},
        "verified": _verified(paths),
        "budget": {"run_trials": budget, "run_trials_used": len(run), "run_trials_left": max(0, budget - len(run)),
                   "device_hours": contract.budgets.device_hours,
                   "device_seconds_used": sum(float(r.device_seconds or 0.0) for r in history)},
        "scope": {"editable_knobs": {k.name: list(k.values) for k in space.knobs if k.name in contract.editable.knobs},
                  "editable_globs": list(contract.editable.globs),
                  "memory_capacity_bytes": contract.memory_capacity.memory_capacity_bytes},
        "proposals": {"queued": [p.to_dict() for p in queue.queued()],
                      "taken": [{**p.to_dict(), "trial": _brief(by_proposal[p.proposal_id]) if p.proposal_id in by_proposal else None}
                                for p in queue.taken()]},
        "predictions": predictions(contract, paths, history, predict) if predict else [],
    }
    return json.loads(json.dumps(out, default=_jsonable))


def predictions(contract: Any, paths: StudyPaths, history: list[Any], configs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The optimizer's predictions for ``configs`` (knobs left out: the baseline's), fitted on the
    study's log: step time (s), its sd (log), peak memory (bytes per device), P(fit), P(ok)."""
    from infrarsi.stages.common import baseline_config
    from infrarsi.stages.optimizer_factory import build_optimizer

    base = baseline_config(contract, paths.root)
    opt = build_optimizer(contract, history, study_dir=paths.root)
    full = [opt.space.validate({**base, **dict(c)}, where=f"predict config {i}") for i, c in enumerate(configs)]
    pred = opt.predict(full)
    return [{"config": c, **{k: _finite(v[i]) for k, v in pred.items()}} for i, c in enumerate(full)]


def _brief(r: Any) -> dict[str, Any]:
    return {"trial_id": r.trial_id, "stage": r.stage, "status": r.status, "step_time_s": r.step_time_s,
            "peak_memory_bytes": r.peak_memory_bytes, "mfu": r.mfu, "config": dict(r.config),
            "proposal_id": (r.extra.get("proposal") or {}).get("proposal_id"), "error": (r.error or "")[:300]}


def _counts(history: list[Any]) -> dict[str, dict[str, int]]:
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
