"""The code a trial runs in: a patch set turned into a patched worktree, cached per content.

``check_out(code_dir, patch_set)`` is the one function that turns the workload's code (a folder
inside a git repository) and a ``PatchSet`` into the tree a trial runs in: the repository's HEAD
in a separate git worktree with the patches applied in order, and the same folder inside it as
the trial's ``code_dir``. A set of several patches is first checked to apply together
(``PatchConflictError`` naming the culprits). ``PatchedTrees`` keeps one such tree per patch
set's content (the sha256 of its files, in order) for the life of a study executor or of one
``infrarsi trial``, and removes them all at ``close``; the study executor (doctor, run, verify,
the long check) and ``infrarsi trial`` both go through it, so a trial can never run other code
than its patches say.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import git
import structlog

from infrarsi.errors import PatchConflictError, PatchError
from infrarsi.patches.conflicts import check_conflicts
from infrarsi.patches.knob import (
    NO_PATCH,
    PATCH_DIR,
    PATCH_KNOB,
    PATCH_SUFFIX,
    check_patch_name,
    patch_file,
    patch_relpaths,
    patch_set,
)
from infrarsi.patches.worktree import PatchedTree, create_worktree, remove_worktree
from infrarsi.result import TrialExtra
from infrarsi.study.candidate import file_sha256

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class PatchSet:
    """The ordered patch files one trial runs with."""

    files: tuple[Path, ...]
    """The patch files, in the order they are applied."""
    logged: tuple[str, ...]
    """The same patches as the trial log names them (``TrialResult.patches``): relative to the
    workload's repository for a ``code_patch`` knob's, to the study directory for a proposal's."""

    def digests(self) -> list[str]:
        """The sha256 of each file's bytes as read now ("" for a missing file), in order."""
        return [file_sha256(f) for f in self.files]

    def key(self) -> str:
        """The set's identity: a hash of its files' contents in order (a missing file counts by
        its path), so an edited patch file gets a new tree and the same bytes share one."""
        parts = [d or f"missing:{f}" for d, f in zip(self.digests(), self.files, strict=True)]
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def knob_patch_set(code_dir: str | Path, value: Any) -> PatchSet | None:
    """The patch set a ``code_patch`` knob value names (None for ``none``): the files
    ``workloads/patches/<name>.diff`` beside the ``workloads`` package in ``code_dir``."""
    name = None if value is None or str(value) == NO_PATCH else check_patch_name(value)
    if name is None:
        return None
    root = Path(code_dir).resolve()
    return PatchSet(
        files=tuple(patch_file(root, n) for n in patch_set(name)),
        logged=tuple(patch_relpaths(name)),
    )


@dataclass(frozen=True)
class PatchedCode:
    """The code a trial runs: the workload's own, or a patched worktree of it."""

    code_dir: str | None
    """The code dir inside the patched worktree (None: the runner's own, unpatched)."""
    patches: list[str] = field(default_factory=list)
    """The patch files applied, in order, as the log names them (the row's ``patches`` column)."""
    extra: TrialExtra = field(default_factory=TrialExtra)
    """The row's patch fields: ``patch_base_sha`` and ``patch_paths_touched``."""
    tree: PatchedTree | None = None
    """The worktree it lives in (None: the untouched code)."""


def code_repo(code_dir: str | Path) -> tuple[git.Repo, Path]:
    """The git repository holding ``code_dir``, and ``code_dir``'s path inside it (``PatchError``
    when it is in none: patches need the workload's code committed to git)."""
    root = Path(code_dir).resolve()
    try:
        repo = git.Repo(str(root), search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise PatchError(
            f"{root} is not in a git repository; code patches need the workload's code "
            f"committed to git."
        ) from None
    return repo, root.relative_to(Path(str(repo.working_tree_dir)).resolve())


def check_out(
    code_dir: str | Path, patches: PatchSet, *, globs: Sequence[str] | None = None
) -> PatchedCode:
    """The tree a trial with ``patches`` runs in: HEAD of the repository holding ``code_dir``
    checked out into a new worktree, the patches applied in order (each scope-checked against
    ``globs`` when given), and ``code_dir``'s folder inside it. ``PatchError`` for a missing
    patch file or one that does not apply; ``PatchConflictError`` for a set whose patches do not
    apply together. The caller removes ``tree`` (``PatchedTrees`` does)."""
    repo, sub = code_repo(code_dir)
    missing = [str(f) for f in patches.files if not Path(f).is_file()]
    if missing:
        raise PatchError(
            f"patch file(s) {missing} do not exist; a {PATCH_KNOB!r} value names files "
            f"{PATCH_DIR}/<name>{PATCH_SUFFIX} of the workload's repository."
        )
    if len(patches.files) > 1:
        check_conflicts(repo, patches.files)
    tree = create_worktree(repo, patches.files, globs=globs)
    return PatchedCode(
        code_dir=str(tree.path / sub),
        patches=list(patches.logged),
        extra=TrialExtra(
            patch_base_sha=tree.base_sha, patch_paths_touched=list(tree.paths_touched)
        ),
        tree=tree,
    )


class PatchedTrees:
    """The patched worktrees of one study executor (or one ``infrarsi trial``): one per patch
    set's content, made on first use by ``check_out`` and removed at ``close``. A set found not to
    apply together is remembered and refused again without a new check. Thread-safe."""

    def __init__(self, globs: Sequence[str] | None = None) -> None:
        self.globs = list(globs) if globs is not None else None
        """The contract's editable globs every patch is checked against (None: no contract)."""
        self._codes: dict[str, PatchedCode] = {}
        """Patch set key -> the checked-out code."""
        self._conflicts: dict[str, str] = {}
        """Patch set key -> why its patches do not apply together."""
        self._lock = threading.Lock()
        """Guards the two maps across concurrent trials."""

    def __len__(self) -> int:
        return len(self._codes)

    def code_for(self, code_dir: str | Path, patches: PatchSet | None) -> PatchedCode:
        """The code a trial with ``patches`` runs (``PatchedCode(None)`` for no patch set)."""
        if patches is None:
            return PatchedCode(code_dir=None)
        key = patches.key()
        with self._lock:
            if key in self._conflicts:
                raise PatchConflictError(self._conflicts[key])
            if key not in self._codes:
                try:
                    self._codes[key] = check_out(code_dir, patches, globs=self.globs)
                except PatchConflictError as e:
                    self._conflicts[key] = str(e)
                    raise
                tree = self._codes[key].tree
                log.info(
                    "patch.worktree",
                    patch=" + ".join(patches.logged),
                    path=str(tree.path) if tree else "",
                    base_sha=tree.base_sha if tree else "",
                )
            return self._codes[key]

    def close(self) -> None:
        """Remove every worktree (a failure is logged: closing never fails a stage)."""
        with self._lock:
            codes, self._codes = list(self._codes.values()), {}
        for code in codes:
            if code.tree is None:
                continue
            try:
                remove_worktree(code.tree.repo_dir, code.tree.path)
            except Exception as e:
                log.warning(
                    "patch.worktree_remove_failed",
                    patch=" + ".join(code.patches),
                    path=str(code.tree.path),
                    error=str(e),
                )

    def __enter__(self) -> PatchedTrees:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def patched_code(code_dir: str | Path, value: Any) -> Iterator[PatchedCode]:
    """The code for a config's ``code_patch`` ``value`` outside a study (``infrarsi trial``): for
    ``none``, the untouched ``code_dir``; for a patch or a set, a temporary git worktree of the
    repository holding ``code_dir`` with the patches applied in order (``check_out``), removed on
    exit. No scope globs: a one-off trial has no contract (``init`` checks a study's patches
    against its editable globs)."""
    with PatchedTrees() as trees:
        yield trees.code_for(code_dir, knob_patch_set(code_dir, value))


def digest_mismatch(
    paths: Sequence[str], digests: Sequence[str], expect: Sequence[str] | None
) -> PatchError | None:
    """A ``PatchError`` when the patches about to run are not the ones a candidate recorded
    (another list, or a file whose bytes changed since), else None: verify and the long check
    run a candidate with exactly the patches it was measured with."""
    if expect is None:
        return None
    if len(expect) != len(digests):
        return PatchError(
            f"the candidate recorded {len(expect)} patch(es), this trial would run "
            f"{len(digests)} ({paths}); re-run the stage that chose it."
        )
    for path, got, want in zip(paths, digests, expect, strict=True):
        if got != want:
            return PatchError(
                f"patch {path!r} changed since the candidate was measured: sha256 "
                f"{got[:16] or 'unreadable'} now, {want[:16]} recorded. A candidate "
                f"runs exactly the patch it was measured with; restore that file or "
                f"propose the new one as a new candidate."
            )
    return None


__all__ = [
    "PatchSet",
    "PatchedCode",
    "PatchedTrees",
    "check_out",
    "code_repo",
    "digest_mismatch",
    "knob_patch_set",
    "patched_code",
]
