"""Code patches: unified-diff files a candidate may apply to the workload's code.

A patch is a unified diff (``git diff`` output) relative to the root of the workload's git
repository. Before a trial uses it:

- ``check_scope(patch, globs)`` refuses a patch that touches a path outside the contract's
  editable globs (``**`` spans directories, ``*`` stays inside one), and any patch that is not a
  plain text edit of regular files: an absolute or ``..`` path or one inside ``.git``, a binary
  patch, a symbolic link (created, retargeted or deleted) or submodule, a mode change or a new
  file that is not mode 100644, and a rename or copy with either side out of scope
  (``check_content``). The paths are read both by this module and by ``git apply --numstat``, so
  a path git would decode differently (C-quoted escapes) is checked as git sees it;
- ``check_tree(tree, patch)`` refuses a patch that would write through a symbolic link of the
  checked-out tree (a touched path or one of its folders is a link); ``check_applies``,
  ``create_worktree`` and ``apply`` run it before ``git apply``;
- ``check_conflicts(repo, patches)`` refuses a set of patches that do not apply together;
- ``patched_worktree(repo, patches)`` checks the base commit out into a separate git worktree
  and applies the patches there, so the trial's ``code_dir`` points at the patched tree and the
  user's checkout is never touched::

    with patched_worktree(repo, ["workloads/patches/fused_rmsnorm.patch"]) as tree:
        run_trial(code_dir=tree.path)
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import git

from infrarsi.errors import PatchConflictError, PatchError

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


def _unquote(name: str) -> str:
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


def _strip(name: str) -> str | None:
    name = name.strip()
    name = _unquote(name) if name.startswith('"') else name.split("\t")[0]
    if name == "/dev/null":
        return None
    for prefix in ("a/", "b/"):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


_GIT_HEADER = re.compile(r'^diff --git ("(?:[^"\\]|\\.)*"|\S+) ("(?:[^"\\]|\\.)*"|\S+)$')


def paths_touched(text: str, *, source: str = "<patch>") -> list[str]:
    """Repository-relative paths a unified diff touches (both sides of renames), sorted.

    Raises ``PatchError`` for a diff that touches nothing, or an absolute or ``..`` path.
    """
    paths: set[str] = set()
    for line in text.splitlines():
        q = _GIT_HEADER.match(line)
        m = _DIFF_GIT.match(line)
        if q and (q.group(1).startswith('"') or q.group(2).startswith('"')):
            paths.update(x for x in (_strip(q.group(1)), _strip(q.group(2))) if x)
        elif m:
            paths.update(x for x in (_strip("a/" + m.group(1)), _strip("b/" + m.group(2))) if x)
        elif line.startswith(("--- ", "+++ ")):
            p = _strip(line[4:])
            if p:
                paths.add(p)
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            paths.add(_unquote(line.split(" ", 2)[2].strip()))
    if not paths:
        raise PatchError(
            f"{source}: no file header ('--- a/...', '+++ b/...') found: not a "
            f"unified diff. Create it with `git diff > file.patch`."
        )
    for p in sorted(paths):
        _check_path(p, source)
    return sorted(paths)


def _check_path(p: str, source: str) -> None:
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
        h = _GIT_HEADER.match(line)
        if h:
            current = _strip(h.group(2)) or current
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
                moves.append((verb, _unquote(line[len(verb) + 6 :].strip())))
    for p in git_paths(patch):
        _check_path(p, patch.path)
    if globs is not None:
        for verb, src in moves:
            if not in_scope(src, globs):
                raise PatchError(
                    f"patch {patch.path}: path {src!r}: rule: a {verb} must stay inside the "
                    f"contract's editable scope {list(globs)}, both sides; its source is "
                    f"outside. Fix: edit the file in place, inside the scope."
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
                f"{_stderr(e)}. Fix: regenerate it with `git diff`."
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


def _repo(repo: str | Path | git.Repo) -> git.Repo:
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
    r = _repo(repo)
    p = patch if isinstance(patch, Patch) else Patch.load(patch)
    check_content(p)
    check_tree(cwd or str(r.working_tree_dir), p)
    g = git.Git(str(cwd)) if cwd else r.git
    try:
        g.apply("--check", str(Path(p.path).resolve()))
    except git.GitCommandError as e:
        raise PatchError(
            f"patch {p.path} does not apply to {cwd or r.working_tree_dir}: "
            f"{_stderr(e)}. Regenerate it against the base commit."
        ) from None


def _stderr(e: git.GitCommandError) -> str:
    return str(e.stderr).strip().replace("\n", " ")[:400]


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
                    f"(overlapping paths: {overlap or p.paths}): {_stderr(e)}. "
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
    r = _repo(repo)
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
    )
    g = git.Git(str(d))
    for p in ps:
        try:
            check_content(p)
            check_tree(d, p)
        except PatchError:
            remove_worktree(r, d)
            raise
        try:
            g.apply(str(Path(p.path).resolve()))
        except git.GitCommandError as e:
            remove_worktree(r, d)
            raise PatchError(
                f"patch {p.path} does not apply at {sha[:12]} after "
                f"{tree.patches[: tree.patches.index(p.path)]}: {_stderr(e)}."
            ) from None
    return tree


def remove_worktree(repo: str | Path | git.Repo, path: str | Path) -> None:
    """Remove a worktree made by ``create_worktree`` (its changes are discarded)."""
    r = _repo(repo)
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
