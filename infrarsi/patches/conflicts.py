"""Patch sets: whether patches apply together, one after another, to a base commit."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import git

from infrarsi.errors import PatchConflictError, PatchError
from infrarsi.patches.apply import check_applies
from infrarsi.patches.diff import Patch, git_stderr
from infrarsi.patches.worktree import patched_worktree


def check_conflicts(
    repo: str | Path | git.Repo, patches: Sequence[str | Path | Patch], *, base: str = "HEAD"
) -> None:
    """Raise ``PatchError`` if the patches do not apply, one after another, to ``base``
    (``PatchConflictError``, a subclass, when each applies alone but not after the earlier ones).

    Each patch is first checked alone against ``base``; then they are applied in order in a
    temporary worktree, and the first that fails is reported with the earlier patches it
    conflicts with (pairs checked with ``git apply --check``).
    """
    ps = [p if isinstance(p, Patch) else Patch.load(p) for p in patches]
    if not ps:
        return
    with patched_worktree(repo, [], base=base) as tree:
        for p in ps:
            check_applies(repo, p, cwd=tree.path)
        applied: list[Patch] = []
        for p in ps:
            try:
                git.Git(str(tree.path)).apply(str(Path(p.path).resolve()))
            except git.GitCommandError as e:
                culprits = _pairwise_culprits(repo, applied, p, base)
                overlap = sorted(set(p.paths) & {x for a in applied for x in a.paths})
                raise PatchConflictError(
                    f"patch {p.path} conflicts with {culprits or [a.path for a in applied]} "
                    f"(overlapping paths: {overlap or p.paths}): {git_stderr(e)}. "
                    f"Combine them into one patch or pick one."
                ) from None
            applied.append(p)


def _pairwise_culprits(
    repo: str | Path | git.Repo, earlier: list[Patch], p: Patch, base: str
) -> list[str]:
    out = []
    for a in earlier:
        with patched_worktree(repo, [a], base=base) as tree:
            try:
                check_applies(repo, p, cwd=tree.path)
            except PatchError:
                out.append(a.path)
    return out


__all__ = ["check_conflicts"]
