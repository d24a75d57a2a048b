"""A code patch as text: the ``Patch`` record, the paths a unified diff touches, and how git reads them.

A patch is a unified diff (``git diff`` output) relative to the root of the workload's git
repository. ``paths_touched`` reads its file headers (C-quoted names decoded as git decodes them)
and refuses an absolute or ``..`` path, one inside ``.git`` or one with a control character;
``git_paths`` asks ``git apply --numstat`` for the paths git itself would write, so the rules of
``infrarsi.patches.scope`` see a path the way git does.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import git

from infrarsi.errors import PatchError

_DIFF_GIT = re.compile(r"^diff --git a/(.+?) b/(.+)$")


@dataclass
class Patch:
    """One patch file."""

    path: str
    """Where the patch file lives (as given)."""
    text: str
    """The unified diff."""
    paths: list[str] = field(default_factory=list)
    """Repository-relative paths it touches (old and new names), sorted, no duplicates."""

    @classmethod
    def load(cls, path: str | Path) -> Patch:
        """Read the patch file at ``path``; ``PatchError`` when it is missing or not UTF-8 text."""
        p = Path(path)
        if not p.is_file():
            raise PatchError(
                f"patch file {str(p)!r} does not exist. Pass a unified diff "
                f"(e.g. from `git diff > my.patch`)."
            )
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise PatchError(
                f"patch {p}: rule: a patch is a UTF-8 text diff; it cannot be read as one "
                f"({e}). Fix: create it with `git diff > file.patch` (without --binary)."
            ) from None
        return cls(path=str(p), text=text, paths=paths_touched(text, source=str(p)))


_C_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def unquote(name: str) -> str:
    """A path as git reads it: a C-style quoted name (``"a/\\303\\251.py"``) unescaped."""
    if not (len(name) >= 2 and name.startswith('"') and name.endswith('"')):
        return name
    body, out, i = name[1:-1], bytearray(), 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            if body[i + 1] in _C_ESCAPES:
                out.append(_C_ESCAPES[body[i + 1]])
                i += 2
                continue
            if re.match(r"[0-7]{3}", body[i + 1 : i + 4]):
                out.append(int(body[i + 1 : i + 4], 8) & 0xFF)
                i += 4
                continue
        out += c.encode()
        i += 1
    return out.decode(errors="replace")


def strip_name(name: str) -> str | None:
    """A header's file name without its ``a/``/``b/`` prefix and trailing tab field, unquoted;
    None for ``/dev/null`` (the side of a created or deleted file)."""
    name = name.strip()
    name = unquote(name) if name.startswith('"') else name.split("\t")[0]
    if name == "/dev/null":
        return None
    for prefix in ("a/", "b/"):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


GIT_HEADER = re.compile(r'^diff --git ("(?:[^"\\]|\\.)*"|\S+) ("(?:[^"\\]|\\.)*"|\S+)$')
"""A ``diff --git`` line whose names may be C-quoted."""


def paths_touched(text: str, *, source: str = "<patch>") -> list[str]:
    """Repository-relative paths a unified diff touches (both sides of renames), sorted.

    Raises ``PatchError`` for a diff that touches nothing, or an absolute or ``..`` path.
    """
    paths: set[str] = set()
    for line in text.splitlines():
        q = GIT_HEADER.match(line)
        m = _DIFF_GIT.match(line)
        if q and (q.group(1).startswith('"') or q.group(2).startswith('"')):
            paths.update(x for x in (strip_name(q.group(1)), strip_name(q.group(2))) if x)
        elif m:
            paths.update(
                x for x in (strip_name("a/" + m.group(1)), strip_name("b/" + m.group(2))) if x
            )
        elif line.startswith(("--- ", "+++ ")):
            p = strip_name(line[4:])
            if p:
                paths.add(p)
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            paths.add(unquote(line.split(" ", 2)[2].strip()))
    if not paths:
        raise PatchError(
            f"{source}: no file header ('--- a/...', '+++ b/...') found: not a "
            f"unified diff. Create it with `git diff > file.patch`."
        )
    for p in sorted(paths):
        check_path(p, source)
    return sorted(paths)


def check_path(p: str, source: str) -> None:
    """Refuse an absolute path, a ``..`` component, a path inside ``.git``, or a control character."""
    parts = p.replace("\\", "/").split("/")
    if p.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", p) or ".." in parts:
        raise PatchError(
            f"patch {source}: path {p!r}: rule: patch paths are relative to the repository "
            f"root; this one is absolute or leaves the repository (path traversal). Fix: "
            f"regenerate it with `git diff` in the repository."
        )
    if any(x.lower() == ".git" for x in parts):
        raise PatchError(
            f"patch {source}: path {p!r}: rule: a patch may not touch git's own files (.git). "
            f"Fix: remove that file from the patch."
        )
    if any(ord(c) < 32 for c in p):
        raise PatchError(
            f"patch {source}: path {p!r}: rule: a path may not hold control characters."
        )


def git_paths(patch: Patch) -> list[str]:
    """The paths ``git apply --numstat -z`` reads from ``patch`` (as git decodes them); refuses
    (``PatchError``) a patch git cannot parse."""
    with tempfile.TemporaryDirectory(prefix="infrarsi-numstat-") as d:
        f = Path(d) / "p.diff"
        f.write_text(patch.text)
        try:
            out = git.Git(d).apply("--numstat", "-z", str(f), strip_newline_in_stdout=False)
        except git.GitCommandError as e:
            raise PatchError(
                f"patch {patch.path}: rule: must be a diff `git apply` can read; it says: "
                f"{git_stderr(e)}. Fix: regenerate it with `git diff`."
            ) from None
    fields = out.split("\0")
    paths: list[str] = []
    i = 0
    while i < len(fields):
        rec = fields[i]
        cols = rec.split("\t")
        if len(cols) == 3 and cols[2]:
            paths.append(cols[2])
        elif len(cols) == 3 and i + 2 < len(fields):  # a rename or copy: "A\tD\t", old, new
            paths += [fields[i + 1], fields[i + 2]]
            i += 2
        i += 1
    return paths


def git_stderr(e: git.GitCommandError) -> str:
    """A git error's stderr on one line, cut to 400 characters (for a refusal's message)."""
    return str(e.stderr).strip().replace("\n", " ")[:400]


__all__ = ["Patch", "git_paths", "paths_touched"]
