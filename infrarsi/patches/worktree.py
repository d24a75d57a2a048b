"""Patched git worktrees: the base commit checked out beside the user's checkout, patches applied.

``create_worktree(repo, patches)`` checks the base commit out into a separate, detached git
worktree and applies the patches there, so a trial's ``code_dir`` points at the patched tree and
the user's checkout is never touched; ``patched_worktree`` is the same in a temporary directory,
removed on exit::

    with patched_worktree(repo, ["workloads/patches/fused_rmsnorm.patch"]) as tree:
        run_trial(code_dir=tree.path)
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import git

from infrarsi.errors import PatchError
from infrarsi.patches.apply import apply_patches, open_repo
from infrarsi.patches.diff import Patch
from infrarsi.patches.scope import check_scope


@dataclass
class PatchedTree:
    """A git worktree at ``base_sha`` with patches applied (uncommitted)."""

    path: Path
    """The worktree's directory (a trial's ``code_dir``)."""
    base_sha: str
    """The commit it was checked out at."""
    patches: list[str]
    """Patch files applied, in order."""
    paths_touched: list[str]
    """Union of the paths the patches touch."""
    repo_dir: str = ""
    """The repository it is a worktree of (what ``remove_worktree`` needs)."""


def create_worktree(
    repo: str | Path | git.Repo,
    patches: Sequence[str | Path | Patch],
    *,
    base: str = "HEAD",
    dest: str | Path | None = None,
    globs: Sequence[str] | None = None,
) -> PatchedTree:
    """Check ``base`` out into a new detached worktree at ``dest`` and apply ``patches``.

    With ``globs``, every patch is scope-checked first. Remove it with ``remove_worktree``.
    """
    r = open_repo(repo)
    ps = [p if isinstance(p, Patch) else Patch.load(p) for p in patches]
    if globs is not None:
        for p in ps:
            check_scope(p, globs)
    try:
        sha = r.commit(base).hexsha
    except (git.BadName, ValueError) as e:
        raise PatchError(f"{r.working_tree_dir}: base commit {base!r} not found ({e}).") from None
    d = Path(dest) if dest else Path(tempfile.mkdtemp(prefix="infrarsi-wt-"))
    if d.exists() and any(d.iterdir()):
        raise PatchError(f"worktree destination {d} exists and is not empty; pick a new path.")
    if d.exists():
        d.rmdir()
    r.git.worktree("add", "--detach", str(d), sha)
    tree = PatchedTree(
        path=d,
        base_sha=sha,
        patches=[p.path for p in ps],
        paths_touched=sorted({x for p in ps for x in p.paths}),
        repo_dir=str(r.working_tree_dir),
    )
    try:
        apply_patches(d, ps, base=sha)
    except PatchError:
        remove_worktree(r, d)
        raise
    return tree


def remove_worktree(repo: str | Path | git.Repo, path: str | Path) -> None:
    """Remove a worktree made by ``create_worktree`` (its changes are discarded)."""
    r = open_repo(repo)
    try:
        r.git.worktree("remove", "--force", str(path))
    except git.GitCommandError:
        shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(git.GitCommandError):
            r.git.worktree("prune")


@contextlib.contextmanager
def patched_worktree(
    repo: str | Path | git.Repo,
    patches: Sequence[str | Path | Patch],
    *,
    base: str = "HEAD",
    globs: Sequence[str] | None = None,
) -> Iterator[PatchedTree]:
    """``create_worktree`` in a temporary directory, removed on exit."""
    tree = create_worktree(repo, patches, base=base, globs=globs)
    try:
        yield tree
    finally:
        remove_worktree(repo, tree.path)


__all__ = ["PatchedTree", "create_worktree", "patched_worktree", "remove_worktree"]
