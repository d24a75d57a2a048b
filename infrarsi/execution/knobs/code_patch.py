"""The ``code_patch`` knob: a code patch as one more searchable choice.

A search space may hold::

    - name: code_patch
      type: choice
      values: [none, rope_complex]      # `none` plus patch names

Patch name ``N`` maps to the unified diff ``workloads/patches/N.diff``, relative to the root of
the repository that holds the workload (the directory holding the ``workloads`` package). The
knob's handler only records the value (``TrialBuild.runtime["code_patch"]``): the patch acts on
the CODE, not on the DeepSpeed config. The study executor (``infrarsi.stages.executor``) runs a
trial whose config has ``code_patch != none`` with ``code_dir`` = a git worktree of the
workload's repository with that patch applied, logs the patch file in the row's ``patches``
column, and leaves the eval check's reference code untouched. ``init`` scope-checks every patch
the space names against the contract's editable globs and checks that they apply
(``check_space_patches``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infrarsi.errors import KnobError, PatchError
from infrarsi.execution.knobs.registry import KnobContext, TrialBuild, register_knob

PATCH_KNOB = "code_patch"
"""Name of the knob."""
NO_PATCH = "none"
"""The value that runs the untouched code."""
PATCH_DIR = "workloads/patches"
"""Where patch files live, relative to the workload's repository root."""
PATCH_SUFFIX = ".diff"
"""Suffix of a patch file."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


def check_patch_name(value: Any) -> str:
    """The patch name as a str; ``KnobError`` for a value that is not a safe file stem."""
    name = str(value)
    if name != NO_PATCH and (not _NAME.match(name) or name.endswith(PATCH_SUFFIX)):
        raise KnobError(
            f"knob {PATCH_KNOB!r}: value {value!r} is not a patch name; use {NO_PATCH!r} or the "
            f"stem of a file {PATCH_DIR}/<name>{PATCH_SUFFIX} (letters, digits, '_', '-', '.')."
        )
    return name


@register_knob(PATCH_KNOB)
def code_patch(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """``none`` or the name of a patch ``workloads/patches/<name>.diff``. Record-only: sets
    runtime ``code_patch``; the study executor runs the trial in a patched git worktree."""
    build.runtime[PATCH_KNOB] = check_patch_name(value)


def patch_relpath(name: str) -> str:
    """Repository-relative path of patch ``name`` (what the log's ``patches`` column holds)."""
    return f"{PATCH_DIR}/{check_patch_name(name)}{PATCH_SUFFIX}"


def patch_file(code_root: str | Path, name: str) -> Path:
    """The patch file of ``name`` under ``code_root`` (the directory holding ``workloads/``)."""
    return Path(code_root) / patch_relpath(name)


def patch_names(space: Any) -> list[str]:
    """Patch names a ``SearchSpace`` (or YAML path/text/dict) names in its ``code_patch`` knob,
    ``none`` left out, in YAML order. Empty when the space has no such knob."""
    names = getattr(space, "names", None)
    if names is not None and not isinstance(space, dict):
        if PATCH_KNOB not in list(names):
            return []
        values: Sequence[Any] = getattr(space.knob(PATCH_KNOB), "values", ()) or ()
    else:
        import yaml

        data = space if isinstance(space, dict) else yaml.safe_load(
            Path(space).read_text() if Path(str(space)).exists() else str(space))
        knobs = [k for k in (data or {}).get("knobs", []) if k.get("name") == PATCH_KNOB]
        values = knobs[0].get("values", []) if knobs else []
    return [check_patch_name(v) for v in values if str(v) != NO_PATCH]


def config_patch(config: dict[str, Any]) -> str | None:
    """The patch name a config asks for, or None for ``none`` / no such knob."""
    v = config.get(PATCH_KNOB, NO_PATCH)
    return None if v is None or str(v) == NO_PATCH else check_patch_name(v)


def check_space_patches(space: Any, code_root: str | Path, globs: Sequence[str]) -> list[str]:
    """Init-time checks of every patch the space names: the file exists, it touches only
    ``globs`` (``PatchError`` naming the patch, the path and the globs), each applies to the
    workload repository's HEAD and they do not conflict with one another. Returns the patch
    files (absolute paths)."""
    from infrarsi.patches import Patch, check_applies, check_scope, patched_worktree

    names = patch_names(space)
    if not names:
        return []
    files = []
    for n in names:
        f = patch_file(code_root, n)
        if not f.is_file():
            raise PatchError(
                f"knob {PATCH_KNOB!r} value {n!r}: patch file {f} does not exist. Write it with "
                f"`git diff > {patch_relpath(n)}` in the workload's repository, or drop {n!r} "
                f"from the search space."
            )
        p = Patch.load(f)
        check_scope(p, globs)
        files.append(p)
    # The values are alternatives (one patch per trial, never stacked), so the conflict check
    # is that each applies on its own to the base commit the worktrees are made from.
    with patched_worktree(code_root, []) as tree:
        for p in files:
            check_applies(code_root, p, cwd=tree.path)
    return [str(Path(p.path).resolve()) for p in files]


__all__ = [
    "NO_PATCH",
    "PATCH_DIR",
    "PATCH_KNOB",
    "check_patch_name",
    "check_space_patches",
    "code_patch",
    "config_patch",
    "patch_file",
    "patch_names",
    "patch_relpath",
]
