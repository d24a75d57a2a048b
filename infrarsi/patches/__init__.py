"""Code patches: unified-diff files a candidate may apply to the workload's code.

One package for the whole feature, one concept per module:

- ``diff``: the ``Patch`` record and the paths a unified diff touches (``paths_touched``,
  ``git_paths``: as this package and as ``git apply`` read them);
- ``scope``: what a patch may touch: ``check_scope(patch, globs)`` against the contract's editable
  globs, and ``check_content`` (no binary, symbolic link, submodule or mode change);
- ``apply``: ``check_tree`` (no write through a symbolic link of the tree) and ``check_applies``;
- ``worktree``: ``create_worktree`` / ``patched_worktree``: the base commit checked out in a
  separate git worktree with the patches applied, so the user's checkout is never touched;
- ``conflicts``: ``check_conflicts(repo, patches)``: a set of patches that do not apply together;
- ``knob``: the ``code_patch`` knob's values (``a``, ``a+b``), their files and init's checks;
- ``checkout``: ``check_out(code_dir, patch_set)``, the one function that turns the workload's
  code and a patch set into the tree a trial runs in (``PatchedTrees`` caches them per content),
  used by the study executor (doctor, run, verify, long check) and ``infrarsi trial`` alike.

::

    with patched_worktree(repo, ["workloads/patches/fused_rmsnorm.patch"]) as tree:
        run_trial(code_dir=tree.path)
"""

from __future__ import annotations

from infrarsi.patches.apply import apply_patches, check_applies, check_tree, open_repo
from infrarsi.patches.checkout import (
    PatchedCode,
    PatchedTrees,
    PatchSet,
    check_out,
    code_repo,
    digest_mismatch,
    knob_patch_set,
    patched_code,
)
from infrarsi.patches.conflicts import check_conflicts
from infrarsi.patches.diff import Patch, git_paths, paths_touched
from infrarsi.patches.knob import (
    NO_PATCH,
    PATCH_DIR,
    PATCH_KNOB,
    PATCH_SUFFIX,
    SET_SEP,
    check_patch_name,
    check_space_patches,
    config_patch,
    patch_file,
    patch_names,
    patch_relpath,
    patch_relpaths,
    patch_set,
    set_conflicts,
)
from infrarsi.patches.scope import REGULAR_MODE, check_content, check_scope, glob_to_regex, in_scope
from infrarsi.patches.worktree import (
    PatchedTree,
    create_worktree,
    patched_worktree,
    remove_worktree,
)

__all__ = [
    "NO_PATCH",
    "PATCH_DIR",
    "PATCH_KNOB",
    "PATCH_SUFFIX",
    "REGULAR_MODE",
    "SET_SEP",
    "Patch",
    "PatchSet",
    "PatchedCode",
    "PatchedTree",
    "PatchedTrees",
    "apply_patches",
    "check_applies",
    "check_conflicts",
    "check_content",
    "check_out",
    "check_patch_name",
    "check_scope",
    "check_space_patches",
    "check_tree",
    "code_repo",
    "config_patch",
    "create_worktree",
    "digest_mismatch",
    "git_paths",
    "glob_to_regex",
    "in_scope",
    "knob_patch_set",
    "open_repo",
    "patch_file",
    "patch_names",
    "patch_relpath",
    "patch_relpaths",
    "patch_set",
    "patched_code",
    "patched_worktree",
    "paths_touched",
    "remove_worktree",
    "set_conflicts",
]
