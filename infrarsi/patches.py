"""Code patches: unified-diff files a candidate may apply to the workload's code.

A patch is a unified diff (``git diff`` output) relative to the root of the workload's git
repository. Before a trial uses it:

- ``check_scope(patch, globs)`` refuses a patch that touches a path outside the contract's
  editable globs (``**`` spans directories, ``*`` stays inside one);
- ``check_conflicts(repo, patches)`` refuses a set of patches that do not apply together;
- ``patched_worktree(repo, patches)`` checks the base commit out into a separate git worktree
  and applies the patches there, so the trial's ``code_dir`` points at the patched tree and the
  user's checkout is never touched::

    with patched_worktree(repo, ["workloads/patches/fused_rmsnorm.patch"]) as tree:
        run_trial(code_dir=tree.path)
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
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
        p = Path(path)
        if not p.is_file():
            raise PatchError(f"patch file {str(p)!r} does not exist. Pass a unified diff "
                             f"(e.g. from `git diff > my.patch`).")
        text = p.read_text()
        return cls(path=str(p), text=text, paths=paths_touched(text, source=str(p)))


def _strip(name: str) -> str | None:
    name = name.strip().split("\t")[0]
    if name == "/dev/null":
        return None
    if name.startswith('"') and name.endswith('"'):
        name = name[1:-1]
    for prefix in ("a/", "b/"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def paths_touched(text: str, *, source: str = "<patch>") -> list[str]:
    """Repository-relative paths a unified diff touches (both sides of renames), sorted.

    Raises ``PatchError`` for a diff that touches nothing, or an absolute or ``..`` path.
    """
    paths: set[str] = set()
    for line in text.splitlines():
        m = _DIFF_GIT.match(line)
        if m:
            paths.update(x for x in (_strip("a/" + m.group(1)), _strip("b/" + m.group(2))) if x)
        elif line.startswith(("--- ", "+++ ")):
            p = _strip(line[4:])
            if p:
                paths.add(p)
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            paths.add(line.split(" ", 2)[2].strip())
    if not paths:
        raise PatchError(f"{source}: no file header ('--- a/...', '+++ b/...') found: not a "
                         f"unified diff. Create it with `git diff > file.patch`.")
    for p in paths:
        if p.startswith("/") or ".." in Path(p).parts:
            raise PatchError(f"{source}: path {p!r} is absolute or leaves the repository; "
                             f"patch paths must be relative to the repository root.")
    return sorted(paths)


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
    outside = [x for x in p.paths if not in_scope(x, globs)]
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
        raise PatchError(f"{repo}: not a git repository; code patches need the workload's "
                         f"code in git.") from e


def check_applies(repo: str | Path | git.Repo, patch: Patch | str | Path, *, cwd: str | Path | None = None) -> None:
    """Raise ``PatchError`` if ``patch`` does not apply to the tree at ``cwd`` (default: the repo)."""
    r = _repo(repo)
    p = patch if isinstance(patch, Patch) else Patch.load(patch)
    g = git.Git(str(cwd)) if cwd else r.git
    try:
        g.apply("--check", str(Path(p.path).resolve()))
    except git.GitCommandError as e:
        raise PatchError(f"patch {p.path} does not apply to {cwd or r.working_tree_dir}: "
                         f"{_stderr(e)}. Regenerate it against the base commit.") from None


def _stderr(e: git.GitCommandError) -> str:
    return str(e.stderr).strip().replace("\n", " ")[:400]


def check_conflicts(
    repo: str | Path | git.Repo, patches: Sequence[str | Path | Patch], *, base: str = "HEAD"
) -> None:
    """Raise ``PatchError`` if the patches do not apply, one after another, to ``base``.

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
                raise PatchError(
                    f"patch {p.path} conflicts with {culprits or [a.path for a in applied]} "
                    f"(overlapping paths: {overlap or p.paths}): {_stderr(e)}. "
                    f"Combine them into one patch or pick one."
                ) from None
            applied.append(p)


def _pairwise_culprits(repo: str | Path | git.Repo, earlier: list[Patch], p: Patch, base: str) -> list[str]:
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
    tree = PatchedTree(path=d, base_sha=sha, patches=[p.path for p in ps],
                       paths_touched=sorted({x for p in ps for x in p.paths}))
    g = git.Git(str(d))
    for p in ps:
        try:
            g.apply(str(Path(p.path).resolve()))
        except git.GitCommandError as e:
            remove_worktree(r, d)
            raise PatchError(f"patch {p.path} does not apply at {sha[:12]} after "
                             f"{tree.patches[: tree.patches.index(p.path)]}: {_stderr(e)}.") from None
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
    "check_scope",
    "create_worktree",
    "glob_to_regex",
    "in_scope",
    "patched_worktree",
    "paths_touched",
    "remove_worktree",
]
