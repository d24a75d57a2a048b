"""What a patch may touch: the contract's editable globs, and the rules a plain text edit keeps.

``check_scope(patch, globs)`` refuses a patch that touches a path outside the contract's editable
globs (``**`` spans directories, ``*`` stays inside one), and any patch that is not a plain text
edit of regular files (``check_content``): a binary patch, a symbolic link (created, retargeted or
deleted) or submodule, a mode change or a new file that is not mode 100644, and a rename or copy
with either side out of scope. The paths are read both by ``infrarsi.patches.diff`` and by
``git apply --numstat``, so a path git would decode differently is checked as git sees it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from infrarsi.errors import PatchError
from infrarsi.patches.diff import GIT_HEADER, Patch, check_path, git_paths, strip_name, unquote

REGULAR_MODE = "100644"
"""The only file mode a patch may create: a regular, non-executable file."""
_MODE_LINE = re.compile(r"^(old mode|new mode|new file mode|deleted file mode) ([0-7]{6})\s*$")
_INDEX_LINE = re.compile(r"^index [0-9a-f]+\.\.[0-9a-f]+ ([0-7]{6})\s*$")
_BINARY_LINE = re.compile(r"^(GIT binary patch|Binary files .* differ)\s*$")


def check_content(patch: Patch, globs: Sequence[str] | None = None) -> None:
    """Refuse (``PatchError`` naming the patch file, the path and the rule) a patch that is not a
    plain text edit of regular files: binary, a symlink or submodule (mode 120000 / 160000) made,
    changed or deleted, a mode change (``old mode``/``new mode``: e.g. making a file executable), a
    new file of another mode than 100644; with ``globs``, a rename or copy with a side outside them.
    Also checks every path ``git apply --numstat`` reads from the patch (``git_paths``)."""
    current = patch.paths[0] if patch.paths else "?"
    moves: list[tuple[str, str]] = []
    for line in patch.text.splitlines():
        h = GIT_HEADER.match(line)
        if h:
            current = strip_name(h.group(2)) or current
            continue
        if _BINARY_LINE.match(line):
            raise PatchError(
                f"patch {patch.path}: path {current!r}: rule: binary patches are refused; a "
                f"patch edits text files. Fix: drop the binary file from the patch."
            )
        mode = _MODE_LINE.match(line)
        index = _INDEX_LINE.match(line)
        kind, value = (
            (mode.group(1), mode.group(2))
            if mode
            else ("index", index.group(1))
            if index
            else ("", "")
        )
        if value in ("120000", "160000"):
            what = "symbolic links" if value == "120000" else "submodules (gitlinks)"
            raise PatchError(
                f"patch {patch.path}: path {current!r}: rule: a patch may not create, change or "
                f"delete {what} (mode {value}). Fix: drop that file from the patch."
            )
        if kind in ("old mode", "new mode"):
            raise PatchError(
                f"patch {patch.path}: path {current!r}: rule: a patch may not change a file's "
                f"mode ({line.strip()}; e.g. making it executable). Fix: drop the mode change."
            )
        if kind == "new file mode" and value != REGULAR_MODE:
            raise PatchError(
                f"patch {patch.path}: path {current!r}: rule: a new file must be a regular "
                f"file, mode {REGULAR_MODE}; got mode {value}. Fix: create it non-executable."
            )
        for verb in ("rename", "copy"):
            if line.startswith(f"{verb} from "):
                moves.append((verb, unquote(line[len(verb) + 6 :].strip())))
    for p in git_paths(patch):
        check_path(p, patch.path)
    if globs is not None:
        for verb, src in moves:
            if not in_scope(src, globs):
                raise PatchError(
                    f"patch {patch.path}: path {src!r}: rule: a {verb} must stay inside the "
                    f"contract's editable scope {list(globs)}, both sides; its source is "
                    f"outside. Fix: edit the file in place, inside the scope."
                )


def glob_to_regex(glob: str) -> re.Pattern[str]:
    """Compile a path glob: ``**`` matches any number of directories, ``*`` and ``?`` one name."""
    out, i = "", 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif glob.startswith("**", i):
            out += ".*"
            i += 2
        elif glob[i] == "*":
            out += "[^/]*"
            i += 1
        elif glob[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(glob[i])
            i += 1
    return re.compile(out + r"\Z")


def in_scope(path: str, globs: Sequence[str]) -> bool:
    """True when ``path`` matches at least one glob."""
    return any(glob_to_regex(g).match(path) for g in globs)


def check_scope(patch: Patch | str | Path, globs: Sequence[str]) -> list[str]:
    """Return the paths ``patch`` touches; raise ``PatchError`` for any outside ``globs``."""
    p = patch if isinstance(patch, Patch) else Patch.load(patch)
    check_content(p, globs)
    outside = [x for x in sorted({*p.paths, *git_paths(p)}) if not in_scope(x, globs)]
    if outside:
        raise PatchError(
            f"patch {p.path}: touches {outside}, outside the contract's editable scope "
            f"{list(globs)}. Restrict the patch to those paths, or run `infrarsi init "
            f"--editable GLOB` into a new study to widen the scope."
        )
    return p.paths


__all__ = ["REGULAR_MODE", "check_content", "check_scope", "glob_to_regex", "in_scope"]
