"""Stage 6, ``apply``: promote the verified winner to a new git branch of the target repository.

``apply(DIR, REPO)`` writes, on a NEW branch (default ``infrarsi/<study>-<config hash>``) that
starts at the target repository's HEAD:

- ``infrarsi/<study>/deepspeed_config.json``: the DeepSpeed config the winning knobs build;
- ``infrarsi/<study>/knobs.yaml``: the winning knob values, the baseline's, and the evidence;
- ``infrarsi/<study>/patches/*.patch``: its code patches, which are also applied to the code;
- ``infrarsi/<study>/README.md``: speedup, CI, contract hash and how to reproduce;
- for a script workload, the script's own DeepSpeed config with the winning keys merged in, and
  ``infrarsi/<study>/launch.sh``: its launch line with the winning arguments
  (``infrarsi.stages.apply_script``).

What it promotes is exactly the candidate verify accepted (``verified_candidate``): its knobs and
the patches its verify trials ran, each file checked against the sha256 recorded then; a
candidate that broke an invariant in any trial is refused. It also needs a passed long check of
that very candidate (``DIR/long_check.json``; ``long_check_line``) unless ``skip_long_check``,
which the commit message, ``knobs.yaml`` and ``DIR/apply.json`` (the report's record) then say.

It tags the baseline commit ``infrarsi/golden/<study>`` if that tag is absent. It works in a
temporary git worktree, so the user's checkout and its current branch are never touched, and it
never commits to ``main`` or ``master``. It refuses (``ApplyError``) a protected branch name, a
dirty tree and an existing branch (the last two unless ``force``), and a study without an
accepted verified best.

Why one module: promoting a winner is one transaction (check the candidate and its patches, build
the branch in a temporary worktree, commit, or leave nothing behind); a script workload's own files
are written by ``apply_script``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import git
import yaml

from infrarsi.errors import ApplyError, PatchError, StudyError
from infrarsi.result import TrialResult
from infrarsi.study.candidate import Candidate, PatchRef, file_sha256
from infrarsi.study.contract import Contract
from infrarsi.study.paths import StudyPaths
from infrarsi.study.verify_report import VerifiedCandidate, VerifyReport

PROTECTED = ("main", "master")
"""Branches apply never writes to, even with ``force``."""


@dataclass
class ApplyResult:
    """What ``apply`` did."""

    branch: str
    """The branch it created (or, with force, recreated)."""
    commit_sha: str
    """The commit at its tip."""
    base_sha: str
    """The baseline commit the branch starts from (HEAD of the target repo)."""
    tag: str
    """The golden tag ``infrarsi/golden/<study>``."""
    tag_created: bool
    """False when the tag already existed (it is never moved)."""
    files: list[str] = field(default_factory=list)
    """Repository-relative paths written or changed by the commit."""

    def summary(self) -> str:
        return (
            f"branch {self.branch} at {self.commit_sha[:12]} (from {self.base_sha[:12]}); "
            f"golden tag {self.tag} {'created' if self.tag_created else 'already existed'}"
        )


def _ref_safe(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-")
    return s or "study"


def _check_ref(repo: git.Repo, branch: str) -> None:
    try:
        repo.git.check_ref_format("--branch", branch)
    except git.GitCommandError:
        raise ApplyError(
            f"branch name {branch!r} is not a valid git branch name; pass another --branch."
        ) from None


def _load_best(study_dir: Path) -> VerifiedCandidate:
    p = StudyPaths(study_dir).verify
    if not p.exists():
        raise ApplyError(
            f"{p} is missing: nothing verified to apply. Run `infrarsi verify {study_dir}` first."
        )
    try:
        best = VerifyReport.read(p).best
    except StudyError as e:
        raise ApplyError(str(e)) from None
    if best is None or not best.config:
        raise ApplyError(
            f"{p}: no best candidate (best is null): verify accepted nothing, so "
            f"there is nothing to apply."
        )
    if not best.accepted:
        raise ApplyError(
            f"{p}: the best candidate was NOT accepted by verify (speedup "
            f"{best.speedup}, CI low {best.ci_low}); apply only promotes verified wins."
        )
    return best


def _trial_rows(study_dir: Path) -> list[TrialResult]:
    try:
        from infrarsi.report.data import read_trial_rows

        return read_trial_rows(study_dir)
    except Exception:
        return []


def verified_candidate(
    best: VerifiedCandidate, rows: list[TrialResult], study_dir: Path
) -> Candidate:
    """The candidate verify accepted, checked against the log: ``verify.json``'s best must name
    its patches with digests and the verify trials that measured it, every one of those trials
    must be logged ``ok`` with exactly that config and those patches, and no run or verify trial
    of the same candidate may have broken an invariant. Anything else is an ``ApplyError``."""
    p = StudyPaths(study_dir).verify
    if best.patches is None or not best.trial_ids:
        raise ApplyError(
            f"{p}: the best candidate does not name its patches and verify trials (written by "
            f"an older infrarsi); re-run `infrarsi verify {study_dir}` so apply commits exactly "
            f"what verify measured."
        )
    cand = best.candidate
    for ref in cand.patches:
        if not ref.sha256:
            raise ApplyError(
                f"{p}: patch {ref.path!r} has no recorded digest; re-run `infrarsi verify "
                f"{study_dir}`."
            )
    by_id = {r.trial_id: r for r in rows}
    for tid in best.trial_ids:
        r = by_id.get(str(tid))
        if r is None or r.stage != "verify":
            raise ApplyError(
                f"{p}: verify trial {tid!r} of the best candidate is not in the study's log; "
                f"re-run `infrarsi verify {study_dir}`."
            )
        got = Candidate.from_row(r)
        if got.key != cand.key:
            raise ApplyError(
                f"{p}: the best candidate ({cand.describe()}) is not what verify trial {tid} ran "
                f"({got.describe()}); apply promotes only what verify measured. Re-run "
                f"`infrarsi verify {study_dir}`."
            )
        if r.status != "ok":
            raise ApplyError(
                f"{p}: verify trial {tid} of the best candidate ended {r.status}; it cannot be "
                f"promoted."
            )
    for r in rows:
        if (
            r.status == "invariant_violation"
            and r.stage in ("run", "verify")
            and Candidate.from_row(r).key == cand.key
        ):
            raise ApplyError(
                f"trial {r.trial_id} of this very candidate ({cand.describe()}) broke an invariant "
                f"({r.error[:200]}); a candidate that ever broke one is never promoted."
            )
    return cand


def _check_digest(ref: PatchRef, path: Path) -> None:
    got = file_sha256(path)
    if got != ref.sha256:
        raise ApplyError(
            f"patch {ref.path} ({path}): sha256 {got[:16] or 'unreadable'} now, {ref.sha256[:16]} "
            f"when verify measured it. apply commits exactly the verified patch: restore that file, "
            f"or propose and verify the new one."
        )


def _resolve_patch(ref: PatchRef, contract: Contract, study_dir: Path) -> Path:
    path = Path(ref.path)
    if path.is_absolute():
        return path
    if ref.source == "proposal":
        return study_dir / path
    bases = [*(Path(contract.workload_path).parents if contract.workload_path else []), study_dir]
    for b in bases:
        if (b / path).exists():
            return b / path
    return path


def apply(
    study_dir: str | Path,
    repo_path: str | Path,
    branch: str | None = None,
    force: bool = False,
    *,
    wait_s: float | None = None,
    skip_long_check: bool = False,
) -> ApplyResult:
    """Commit the study's verified winner to a new branch of ``repo_path``; see the module doc.
    Holds the study lock, so verify cannot rewrite verify.json meanwhile (``wait_s`` as in
    ``run_stage``)."""
    from infrarsi.study.lock import hold_study

    with hold_study(study_dir, "apply", wait_s=wait_s):
        return _apply(Path(study_dir), repo_path, branch, force, skip_long_check)


def long_check_line(d: Path, cand: Candidate, skip: bool) -> str:
    """The long check's verdict on ``cand`` as the commit message records it; an ``ApplyError``
    unless ``DIR/long_check.json`` holds a passed check of this very candidate (or ``skip``)."""
    from infrarsi.errors import StudyError
    from infrarsi.study.long_check_report import LongCheckResult

    if skip:
        return "Long check: SKIPPED (apply --skip-long-check): not checked past the trial's horizon"
    fix = (
        f"Run `infrarsi long-check {d}` (or `infrarsi tune`, which runs it), or pass --skip-long-check "
        f"(recorded in the commit)."
    )
    if not StudyPaths(d).long_check.exists():
        raise ApplyError(
            f"{d}: no long check of the verified candidate ({cand.describe()}): apply promotes a "
            f"candidate only after it trained beside the baseline past the trial's horizon and "
            f"round-tripped a checkpoint. {fix}"
        )
    try:
        lc = LongCheckResult.load(d)
    except StudyError as e:
        raise ApplyError(f"{e} {fix}") from None
    if lc.candidate_key != cand.key:
        raise ApplyError(
            f"{StudyPaths(d).long_check}: it checked another candidate than the one verify accepted "
            f"({cand.describe()}); re-run the long check. {fix}"
        )
    if not lc.passed:
        raise ApplyError(
            f"{StudyPaths(d).long_check}: the long check of this candidate {lc.status}: "
            f"{lc.reason[:400]}. It is not promoted."
        )
    diff = f"{lc.max_abs_diff:.3g}" if lc.max_abs_diff is not None else "-"
    return (
        f"Long check: passed over {lc.horizon_steps} optimizer steps (a trial: {lc.trial_steps}), max |loss "
        f"diff| {diff} <= {lc.loss_atol:.3g}; checkpoint round trip {lc.checkpoint.status} at step "
        f"{lc.checkpoint.step}"
    )


def _record_apply(d: Path, entry: dict[str, Any]) -> None:
    """Append a promotion to ``DIR/apply.json`` (the report's audit shows it); never fails apply."""
    from infrarsi.study.paths import StudyPaths, write_json_atomic

    path = StudyPaths(d).apply_record
    try:
        old = json.loads(path.read_text()) if path.exists() else []
        write_json_atomic(path, [*(old if isinstance(old, list) else []), entry])
    except (OSError, ValueError):
        pass


def _apply(
    d: Path, repo_path: str | Path, branch: str | None, force: bool, skip_long_check: bool
) -> ApplyResult:
    """``apply`` without the lock."""
    contract = Contract.load(d)
    best = _load_best(d)
    cfg = dict(best.config)
    try:
        repo = git.Repo(str(repo_path))
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise ApplyError(
            f"{repo_path} is not a git repository (run `git init` there, or pass "
            f"--repo PATH of the training code's repository)."
        ) from None
    if repo.bare:
        raise ApplyError(f"{repo_path} is a bare repository; pass a working clone.")
    try:
        base = repo.head.commit
    except ValueError:
        raise ApplyError(
            f"{repo_path} has no commits yet; commit the baseline code first."
        ) from None
    study = _ref_safe(contract.study)
    cfg_hash = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:8]
    branch = branch or f"infrarsi/{study}-{cfg_hash}"
    short = branch.removeprefix("refs/heads/")
    if short in PROTECTED:
        raise ApplyError(
            f"refusing to write to {short!r}: apply only creates a new branch and "
            f"never commits to {' or '.join(PROTECTED)}. Pass another --branch."
        )
    _check_ref(repo, short)
    if not repo.head.is_detached and repo.active_branch.name == short:
        raise ApplyError(
            f"branch {short!r} is the one checked out in {repo_path}; apply writes a "
            f"new branch. Pass another --branch."
        )
    if repo.is_dirty(untracked_files=False) and not force:
        changed = [str(x.a_path) for x in [*repo.index.diff(None), *repo.index.diff("HEAD")]]
        raise ApplyError(
            f"{repo_path} has uncommitted changes ({sorted(set(changed))[:8]}); the "
            f"baseline must be a commit. Commit or stash them, or pass --force."
        )
    exists = short in [h.name for h in repo.heads]
    if exists and not force:
        raise ApplyError(
            f"branch {short!r} already exists in {repo_path}; pass another --branch, "
            f"or --force to recreate it."
        )

    # Patches: scope-checked against the contract, applied in the new branch's tree.
    rows = _trial_rows(d)
    cand = verified_candidate(best, rows, d)
    checked = long_check_line(d, cand, skip_long_check)
    from infrarsi.patches import Patch, apply_patches, check_scope

    patches = []
    for ref in cand.patches:
        pf = _resolve_patch(ref, contract, d)
        _check_digest(ref, pf)
        try:
            patch = Patch.load(pf)
            check_scope(patch, contract.editable.globs)
        except PatchError as e:
            raise ApplyError(f"cannot apply the winner's patch: {e}") from None
        patches.append(patch)

    tag = f"infrarsi/golden/{study}"
    tag_created = tag not in [t.name for t in repo.tags]
    files: list[str] = []
    wt = Path(tempfile.mkdtemp(prefix="infrarsi-apply-"))
    wt.rmdir()
    old_sha = repo.heads[short].commit.hexsha if exists else None
    made = done = False
    try:
        try:
            repo.git.worktree("add", "-B" if exists else "-b", short, str(wt), base.hexsha)
            made = True
        except git.GitCommandError as e:
            raise ApplyError(
                f"cannot create branch {short!r} in {repo_path}: {str(e.stderr).strip()[:300]}"
            ) from None
        g = git.Git(str(wt))
        try:  # the same application as a trial's worktree, staged for the commit
            apply_patches(wt, patches, index=True, base=base.hexsha)
        except PatchError as e:
            raise ApplyError(f"cannot apply the winner's patch to {repo_path}: {e}") from None
        files += [x for p in patches for x in p.paths]
        out = wt / "infrarsi" / study
        out.mkdir(parents=True, exist_ok=True)
        written = _write_artifacts(
            out, contract, best, cfg, rows, patches, base.hexsha, d, cand.patches, checked
        )
        from infrarsi.stages.apply_script import write_script_files

        script = write_script_files(wt, out, contract, best, rows)  # None unless a script workload
        written += script.paths if script else []
        rel = [str(p.relative_to(wt)) for p in written]
        g.add("--", *rel)
        files += rel
        env: dict[str, str] = {}
        with repo.config_reader() as cr:
            if not cr.has_option("user", "name"):
                env.update(GIT_AUTHOR_NAME="infrarsi", GIT_COMMITTER_NAME="infrarsi")
            if not cr.has_option("user", "email"):
                env.update(
                    GIT_AUTHOR_EMAIL="infrarsi@localhost", GIT_COMMITTER_EMAIL="infrarsi@localhost"
                )
        msg = (
            f"infrarsi: {contract.study}: verified {best.speedup or 0:.3g}x step-time speedup\n\n"
            f"Knobs: {json.dumps({k: v for k, v in cfg.items()}, sort_keys=True)}\n"
            f"Interval: [{best.ci_low}, {best.ci_high}], {_coverage(best)}\n"
            f"Patches: {cand.describe()}\n{checked}\n"
            f"Contract: {contract.contract_hash}\nBaseline: {base.hexsha} (tag {tag})\n"
            + (script.message() if script else "")
        )
        with g.custom_environment(**env):
            g.commit("-m", msg, "--no-verify")
        sha = g.rev_parse("HEAD").strip()
        done = True
    finally:
        with contextlib.suppress(git.GitCommandError):
            repo.git.worktree("remove", "--force", str(wt))
        shutil.rmtree(wt, ignore_errors=True)
        with contextlib.suppress(git.GitCommandError):
            repo.git.worktree("prune")
        if made and not done:  # a failed apply leaves no branch behind (or the old one as it was)
            with contextlib.suppress(git.GitCommandError):
                if old_sha is None:
                    repo.git.branch("-D", short)
                else:
                    repo.git.branch("-f", short, old_sha)
    if tag_created:
        repo.create_tag(
            tag, ref=base.hexsha, message=f"infrarsi golden baseline of study {contract.study}"
        )
    _record_apply(
        d,
        {
            "branch": short,
            "commit_sha": sha,
            "base_sha": base.hexsha,
            "candidate_key": cand.key,
            "skip_long_check": skip_long_check,
            "long_check": checked,
            "at": time.time(),
        },
    )
    return ApplyResult(
        branch=short,
        commit_sha=sha,
        base_sha=base.hexsha,
        tag=tag,
        tag_created=tag_created,
        files=sorted(set(files)),
    )


def _coverage(best: VerifiedCandidate) -> str:
    cov = best.ci_coverage
    return (
        f"{best.ci_method}, exact coverage {cov:.1%}"
        if cov is not None
        else "coverage not recorded"
    )


def _write_artifacts(
    out: Path,
    contract: Contract,
    best: VerifiedCandidate,
    cfg: dict[str, Any],
    rows: list[TrialResult],
    patches: list[Any],
    base_sha: str,
    study_dir: Path,
    refs: tuple[PatchRef, ...] = (),
    checked: str = "",
) -> list[Path]:
    from infrarsi.report.dsconfig import deepspeed_config

    written = []
    ds = deepspeed_config(contract, cfg, rows)
    if ds is not None:
        p = out / "deepspeed_config.json"
        p.write_text(json.dumps(ds, indent=2, sort_keys=True) + "\n")
        written.append(p)
    knobs = {
        "study": contract.study,
        "workload": contract.workload.get("name"),
        "contract_hash": contract.contract_hash,
        "baseline_commit": base_sha,
        "speedup": best.speedup,
        "ci_low": best.ci_low,
        "ci_high": best.ci_high,
        "ci_coverage": best.ci_coverage,
        "patch_sha256": {
            f"patches/{Path(p.path).name}": ref.sha256 for p, ref in zip(patches, refs, strict=True)
        },
        "knobs": cfg,
        "baseline_knobs": contract.workload.get("baseline", {}),
        "patches": [f"patches/{Path(p.path).name}" for p in patches],
        "long_check": checked,
    }
    p = out / "knobs.yaml"
    p.write_text(
        "# Written by `infrarsi apply`: the verified winning knob values.\n"
        + yaml.safe_dump(knobs, sort_keys=False)
    )
    written.append(p)
    if patches:
        (out / "patches").mkdir(exist_ok=True)
        for patch in patches:
            dst = out / "patches" / Path(patch.path).name
            dst.write_text(patch.text)
            written.append(dst)
    readme = out / "README.md"
    readme.write_text(
        f"# infrarsi study {contract.study}\n\n"
        f"Verified step-time speedup {best.speedup}x (interval [{best.ci_low}, "
        f"{best.ci_high}], {_coverage(best)}) over the baseline commit {base_sha} (tag "
        f"`infrarsi/golden/{_ref_safe(contract.study)}`), at fixed {contract.invariants.tokens_per_step} "
        f"tokens per optimizer step, loss within the contract's tolerance.\n\n"
        f"- `knobs.yaml`: the winning knob values\n"
        + ("- `deepspeed_config.json`: the DeepSpeed config they build\n" if ds is not None else "")
        + ("- `patches/`: code patches (already applied on this branch)\n" if patches else "")
        + f"\nContract hash: `{contract.contract_hash}`. Study directory at apply time: "
        f"`{study_dir.resolve()}` (report.html there holds the evidence).\n"
    )
    written.append(readme)
    return written


__all__ = ["PROTECTED", "ApplyResult", "apply"]
