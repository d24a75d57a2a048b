"""Applying patches to a checked-out tree.

It refuses a patch that would write through a symbolic link of the tree (``check_tree``) and
checks that a patch applies (``check_applies``: ``git apply --check``); ``apply_patches`` applies a
patch set, in order, to a tree: the one way every patched tree is made (a trial's worktree,
``apply``'s branch).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import git

from infrarsi.errors import PatchError
from infrarsi.patches.diff import Patch, git_paths, git_stderr
from infrarsi.patches.scope import check_content


def check_tree(tree: str | Path, patch: Patch) -> None:
    """Refuse a patch that would write through a symbolic link of the checked-out ``tree``: a path
    it touches, or a folder on the way to it, is a link (``PatchError`` naming the patch, the
    path and the link)."""
    root = Path(tree)
    real_root = root.resolve()
    for p in [*patch.paths, *git_paths(patch)]:
        cur = root
        for part in p.split("/"):
            cur = cur / part
            if cur.is_symlink():
                raise PatchError(
                    f"patch {patch.path}: path {p!r}: rule: a patch may not write through a symbolic link; "
                    f"{cur.relative_to(root)} is a link to {os.readlink(cur)!r}. Fix: edit the file it "
                    f"points to (if it is inside the editable scope) instead."
                )
        if not (real_root / p).resolve().is_relative_to(real_root):
            raise PatchError(
                f"patch {patch.path}: path {p!r}: rule: must stay inside the repository {root}."
            )


def open_repo(repo: str | Path | git.Repo) -> git.Repo:
    """The git repository at (or above) ``repo``; ``PatchError`` when there is none."""
    if isinstance(repo, git.Repo):
        return repo
    try:
        return git.Repo(str(repo), search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as e:
        raise PatchError(
            f"{repo}: not a git repository; code patches need the workload's code in git."
        ) from e


def check_applies(
    repo: str | Path | git.Repo, patch: Patch | str | Path, *, cwd: str | Path | None = None
) -> None:
    """Raise ``PatchError`` if ``patch`` does not apply to the tree at ``cwd`` (default: the repo)."""
    r = open_repo(repo)
    p = patch if isinstance(patch, Patch) else Patch.load(patch)
    check_content(p)
    check_tree(cwd or str(r.working_tree_dir), p)
    g = git.Git(str(cwd)) if cwd else r.git
    try:
        g.apply("--check", str(Path(p.path).resolve()))
    except git.GitCommandError as e:
        raise PatchError(
            f"patch {p.path} does not apply to {cwd or r.working_tree_dir}: "
            f"{git_stderr(e)}. Regenerate it against the base commit."
        ) from None


def apply_patches(
    tree: str | Path, patches: Sequence[Patch], *, index: bool = False, base: str = ""
) -> None:
    """Apply ``patches``, in order, to the checked-out ``tree`` (the commit ``base``): each is
    first checked (``check_content``; ``check_tree``: no write through a symbolic link), then
    ``git apply`` (with ``index``, ``--index``: the change is staged, for a commit). A
    ``PatchError`` names the patch, the ones applied before it and git's words; the patches
    applied so far stay in the tree (the caller discards it)."""
    g = git.Git(str(tree))
    for i, p in enumerate(patches):
        check_content(p)
        check_tree(tree, p)
        try:
            g.apply(*(["--index"] if index else []), str(Path(p.path).resolve()))
        except git.GitCommandError as e:
            raise PatchError(
                f"patch {p.path} does not apply at {base[:12] or tree} after "
                f"{[x.path for x in patches[:i]]}: {git_stderr(e)}. Regenerate it against that "
                f"commit."
            ) from None


__all__ = ["apply_patches", "check_applies", "check_tree", "open_repo"]
