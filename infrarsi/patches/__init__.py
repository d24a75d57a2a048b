"""Code patches: unified-diff files a candidate may apply to the workload's code.

One package for the whole feature, one concept per module:

- ``diff``: the ``Patch`` record and the paths a unified diff touches (``paths_touched``,
  ``git_paths``: as this package and as ``git apply`` read them);
- ``scope``: what a patch may touch: ``check_scope(patch, globs)`` against the contract's editable
  globs, and ``check_content`` (no binary, symbolic link, submodule or mode change);
- ``apply``: ``check_tree`` (no write through a symbolic link of the tree) and ``check_applies``;
- ``worktree``: ``create_worktree`` / ``patched_worktree``: the base commit checked out in a
  separate git worktree with the patches applied, so the user's checkout is never touched;
- ``conflicts``: ``check_conflicts(repo, patches)``: a set of patches that do not apply together.

::

    with patched_worktree(repo, ["workloads/patches/fused_rmsnorm.patch"]) as tree:
        run_trial(code_dir=tree.path)
"""

from __future__ import annotations

from infrarsi.patches.apply import check_applies, check_tree
from infrarsi.patches.conflicts import check_conflicts
from infrarsi.patches.diff import Patch, git_paths, paths_touched
from infrarsi.patches.scope import check_content, check_scope, glob_to_regex, in_scope
from infrarsi.patches.worktree import (
    PatchedTree,
    create_worktree,
    patched_worktree,
    remove_worktree,
)

__all__ = [
    "Patch",
    "PatchedTree",
    "check_applies",
    "check_conflicts",
    "check_content",
    "check_scope",
    "check_tree",
    "create_worktree",
    "git_paths",
    "glob_to_regex",
    "in_scope",
    "patched_worktree",
    "paths_touched",
    "remove_worktree",
]
