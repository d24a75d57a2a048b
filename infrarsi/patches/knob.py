"""The ``code_patch`` knob's values: patch names, patch sets, their files, and init's checks.

A value is ``none``, a patch name, or a patch SET: names joined by ``+`` (``a+b``), applied in
that order in one worktree. Patch name ``N`` maps to the unified diff ``workloads/patches/N.diff``,
relative to the root of the repository that holds the workload (the directory holding the
``workloads`` package). ``init`` scope-checks every patch the space names against the contract's
editable globs, checks that each applies to HEAD, and refuses a space holding a set whose patches
do not apply together (``check_space_patches``), so the optimizer never proposes one. The knob's
registration (``infrarsi.execution.knobs.code_patch``) only records the value.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infrarsi.errors import KnobError, PatchConflictError, PatchError
from infrarsi.knob_names import CODE_PATCH
from infrarsi.patches.apply import check_applies
from infrarsi.patches.conflicts import check_conflicts
from infrarsi.patches.diff import Patch
from infrarsi.patches.scope import check_scope
from infrarsi.patches.worktree import patched_worktree

PATCH_KNOB = CODE_PATCH
"""Name of the knob."""
NO_PATCH = "none"
"""The value that runs the untouched code."""
PATCH_DIR = "workloads/patches"
"""Where patch files live, relative to the workload's repository root."""
PATCH_SUFFIX = ".diff"
"""Suffix of a patch file."""
SET_SEP = "+"
"""Joins the names of a patch set (``rope_complex+moe_batched_experts``)."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


def check_patch_name(value: Any) -> str:
    """The value as a str: ``none``, a patch name or a set ``a+b`` of distinct names;
    ``KnobError`` for anything else (a name must be a safe file stem)."""
    name = str(value)
    if name == NO_PATCH:
        return name
    parts = name.split(SET_SEP)
    bad = [p for p in parts if p == NO_PATCH or not _NAME.match(p) or p.endswith(PATCH_SUFFIX)]
    if bad or len(set(parts)) != len(parts):
        raise KnobError(
            f"knob {PATCH_KNOB!r}: value {value!r} is not a patch name or set; use {NO_PATCH!r}, the "
            f"stem of a file {PATCH_DIR}/<name>{PATCH_SUFFIX} (letters, digits, '_', '-', '.'), or "
            f"distinct stems joined by {SET_SEP!r} (a set applied in that order)."
        )
    return name


def patch_set(value: Any) -> list[str]:
    """The patch names a ``code_patch`` value stands for, in order ([] for ``none``)."""
    name = check_patch_name(value)
    return [] if name == NO_PATCH else name.split(SET_SEP)


def patch_relpath(name: str) -> str:
    """Repository-relative path of ONE patch ``name`` (what the log's ``patches`` column holds)."""
    if SET_SEP in str(name):
        raise KnobError(f"knob {PATCH_KNOB!r}: {name!r} is a patch set; use patch_relpaths.")
    return f"{PATCH_DIR}/{check_patch_name(name)}{PATCH_SUFFIX}"


def patch_relpaths(value: Any) -> list[str]:
    """Repository-relative paths of the patches a value (name or set) stands for, in order."""
    return [patch_relpath(n) for n in patch_set(value)]


def patch_file(code_root: str | Path, name: str) -> Path:
    """The patch file of ``name`` under ``code_root`` (the directory holding ``workloads/``)."""
    return Path(code_root) / patch_relpath(name)


def patch_names(space: Any) -> list[str]:
    """The values (patch names and ``a+b`` sets) a ``SearchSpace`` (or YAML path/text/dict) names
    in its ``code_patch`` knob, ``none`` left out, in YAML order. Empty when the space has no such
    knob."""
    names = getattr(space, "names", None)
    if names is not None and not isinstance(space, dict):
        if PATCH_KNOB not in list(names):
            return []
        values: Sequence[Any] = getattr(space.knob(PATCH_KNOB), "values", ()) or ()
    else:
        import yaml

        data = (
            space
            if isinstance(space, dict)
            else yaml.safe_load(
                Path(space).read_text() if Path(str(space)).exists() else str(space)
            )
        )
        knobs = [k for k in (data or {}).get("knobs", []) if k.get("name") == PATCH_KNOB]
        values = knobs[0].get("values", []) if knobs else []
    return [check_patch_name(v) for v in values if str(v) != NO_PATCH]


def config_patch(config: dict[str, Any]) -> str | None:
    """The patch name or set a config asks for, or None for ``none`` / no such knob."""
    v = config.get(PATCH_KNOB, NO_PATCH)
    return None if v is None or str(v) == NO_PATCH else check_patch_name(v)


def check_space_patches(space: Any, code_root: str | Path, globs: Sequence[str]) -> list[str]:
    """Init-time checks of every patch the space names, alone or in a set: the file exists, it
    touches only ``globs`` (``PatchError`` naming the patch, the path and the globs) and it
    applies to the workload repository's HEAD; then every set's patches must apply together
    (``PatchConflictError`` listing each set that does not, and the patches it conflicts on), so
    that no trial is ever asked for a set that cannot be built. Returns the patch files (absolute
    paths, each once)."""
    values = patch_names(space)
    if not values:
        return []
    loaded: dict[str, Patch] = {}
    for n in dict.fromkeys(n for v in values for n in patch_set(v)):
        f = patch_file(code_root, n)
        if not f.is_file():
            raise PatchError(
                f"knob {PATCH_KNOB!r} value {n!r}: patch file {f} does not exist. Write it with "
                f"`git diff > {patch_relpath(n)}` in the workload's repository, or drop {n!r} "
                f"from the search space."
            )
        p = Patch.load(f)
        check_scope(p, globs)
        loaded[n] = p
    # Each patch applies on its own to the base commit the worktrees are made from ...
    with patched_worktree(code_root, []) as tree:
        for p in loaded.values():
            check_applies(code_root, p, cwd=tree.path)
    # ... and each set applies as a whole.
    conflicts = set_conflicts(code_root, [v for v in values if SET_SEP in v])
    if conflicts:
        raise PatchConflictError(
            f"knob {PATCH_KNOB!r}: patch set(s) {sorted(conflicts)} do not apply together: "
            + "; ".join(f"{v}: {m}" for v, m in conflicts.items())
            + ". Fix: drop those values from the search space, or write one patch holding both changes."
        )
    return [str(Path(p.path).resolve()) for p in loaded.values()]


def set_conflicts(code_root: str | Path, sets: Sequence[str]) -> dict[str, str]:
    """``{set: why}`` for each patch set of ``sets`` whose patches do not apply together to HEAD
    of ``code_root``'s repository (``check_conflicts``; one temporary worktree
    per set). Sets that apply are left out."""
    out: dict[str, str] = {}
    for v in dict.fromkeys(sets):
        try:
            check_conflicts(code_root, [patch_file(code_root, n) for n in patch_set(v)])
        except PatchConflictError as e:
            out[v] = str(e)
    return out


__all__ = [
    "NO_PATCH",
    "PATCH_DIR",
    "PATCH_KNOB",
    "PATCH_SUFFIX",
    "SET_SEP",
    "check_patch_name",
    "check_space_patches",
    "config_patch",
    "patch_file",
    "patch_names",
    "patch_relpath",
    "patch_relpaths",
    "patch_set",
    "set_conflicts",
]
