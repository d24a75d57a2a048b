"""The ``code_patch`` knob: a code patch as one more searchable choice.

A search space may hold::

    - name: code_patch
      type: choice
      values: [none, rope_complex, moe_batched_experts, rope_complex+moe_batched_experts]

A value is ``none``, a patch name, or a patch SET: names joined by ``+`` (``a+b``), applied in
that order in one worktree. Patch name ``N`` maps to the unified diff ``workloads/patches/N.diff``,
relative to the root of
the repository that holds the workload (the directory holding the ``workloads`` package). The
knob's handler only records the value (``TrialBuild.runtime["code_patch"]``): the patch acts on
the CODE, not on the DeepSpeed config. The study executor (``infrarsi.stages.executor``) runs a
trial whose config has ``code_patch != none`` with ``code_dir`` = a git worktree of the
workload's repository with that patch applied, logs the patch file in the row's ``patches``
column (every file of a set), and leaves the eval check's reference code untouched. ``init``
scope-checks every patch the space names against the contract's editable globs, checks that each
applies to HEAD, and refuses a space holding a set whose patches do not apply together
(``check_space_patches``), so the optimizer never proposes one; a set that reaches the executor
some other way (a warm start, a hand-written config) and conflicts is logged ``failed`` with
``extra.patch_conflict`` and ``device_seconds`` 0, before any rank starts.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infrarsi.errors import KnobError, PatchConflictError, PatchError
from infrarsi.execution.knobs.registry import KnobContext, TrialBuild, checked_by, register_knob
from infrarsi.knob_names import CODE_PATCH
from infrarsi.result import TrialExtra

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


@register_knob(
    PATCH_KNOB,
    default=NO_PATCH,
    values=checked_by(
        check_patch_name, f"{NO_PATCH}, a patch name, or distinct names joined by {SET_SEP}"
    ),
)
def code_patch(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """The code patch the trial runs with: ``none``, a patch name, or a set ``a+b`` applied in order.

    Name ``N`` is ``workloads/patches/N.diff``. Record-only: sets runtime ``code_patch``; the study
    executor (and ``infrarsi trial``, through ``patched_code``) runs the trial in a patched git
    worktree. A set that does not apply together is refused at ``init``, and failed without a
    trial if it reaches the executor (docs/PATCHES.md). No DeepSpeed key (the code, not the config)."""
    build.runtime[PATCH_KNOB] = check_patch_name(value)


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


@dataclass(frozen=True)
class PatchedCode:
    """The code a one-off trial runs: the workload's own, or a patched worktree of it."""

    code_dir: str | None
    """The code dir inside the patched worktree (None: the runner's own, unpatched)."""
    patches: list[str] = field(default_factory=list)
    """Repository-relative patch files applied, in order (the row's ``patches`` column)."""
    extra: TrialExtra = field(default_factory=TrialExtra)
    """The row's patch fields: ``patch_base_sha`` and ``patch_paths_touched``."""


@contextlib.contextmanager
def patched_code(code_dir: str | Path, value: Any) -> Iterator[PatchedCode]:
    """The code for a config's ``code_patch`` ``value`` outside a study (``infrarsi trial``): for
    ``none``, the untouched ``code_dir``; for a patch or a set, a temporary git worktree of the
    repository holding ``code_dir`` with the patches applied in order (a set that does not apply
    together is a ``PatchConflictError``), removed on exit. No scope globs: a one-off trial has no
    contract (``init`` checks a study's patches against its editable globs)."""
    name = None if value is None or str(value) == NO_PATCH else check_patch_name(value)
    if name is None:
        yield PatchedCode(code_dir=None)
        return
    import git

    from infrarsi.patches import check_conflicts, patched_worktree

    root = Path(code_dir).resolve()
    try:
        repo = git.Repo(str(root), search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise PatchError(
            f"knob {PATCH_KNOB!r} value {name!r}: {root} is not in a git repository; code "
            f"patches need the workload's code committed to git."
        ) from None
    sub = root.relative_to(Path(str(repo.working_tree_dir)).resolve())
    files = [patch_file(root, n) for n in patch_set(name)]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise PatchError(
            f"knob {PATCH_KNOB!r} value {name!r}: patch file(s) {missing} do not exist; "
            f"name a file {PATCH_DIR}/<name>{PATCH_SUFFIX} of the workload's repository."
        )
    if len(files) > 1:
        check_conflicts(repo, files)
    with patched_worktree(repo, files) as tree:
        yield PatchedCode(
            code_dir=str(tree.path / sub),
            patches=patch_relpaths(name),
            extra=TrialExtra(
                patch_base_sha=tree.base_sha, patch_paths_touched=list(tree.paths_touched)
            ),
        )


def check_space_patches(space: Any, code_root: str | Path, globs: Sequence[str]) -> list[str]:
    """Init-time checks of every patch the space names, alone or in a set: the file exists, it
    touches only ``globs`` (``PatchError`` naming the patch, the path and the globs) and it
    applies to the workload repository's HEAD; then every set's patches must apply together
    (``PatchConflictError`` listing each set that does not, and the patches it conflicts on), so
    that no trial is ever asked for a set that cannot be built. Returns the patch files (absolute
    paths, each once)."""
    from infrarsi.patches import Patch, check_applies, check_scope, patched_worktree

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
    of ``code_root``'s repository (``infrarsi.patches.check_conflicts``; one temporary worktree
    per set). Sets that apply are left out."""
    from infrarsi.patches import check_conflicts

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
    "SET_SEP",
    "check_patch_name",
    "check_space_patches",
    "code_patch",
    "config_patch",
    "patch_file",
    "patch_names",
    "patch_relpath",
    "patch_relpaths",
    "patch_set",
    "set_conflicts",
]
