"""Shared set-up of the ``infrarsi.patches`` tests: a small real git repository and patches
made from real edits of it (``git diff``), no mocks."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import git
import pytest

from infrarsi.errors import PatchError
from infrarsi.patches import check_scope, create_worktree


def make_repo(root: Path) -> git.Repo:
    repo = git.Repo.init(root, initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "Test")
        cw.set_value("user", "email", "test@example.com")
    (root / "workloads").mkdir()
    filler = "".join(f"# line {i}\n" for i in range(12))
    (root / "workloads/model.py").write_text(
        f"def act(x):\n    return x\n\n{filler}\nSCALE = 1.0\n"
    )
    (root / "setup.cfg").write_text("[x]\n")
    repo.index.add(["workloads/model.py", "setup.cfg"])
    repo.index.commit("base")
    return repo


def make_patch(repo: git.Repo, rel: str, old: str, new: str, out: Path) -> Path:
    f = Path(repo.working_tree_dir) / rel
    before = f.read_text()
    f.write_text(before.replace(old, new))
    out.write_text(repo.git.diff("--", rel) + "\n")
    f.write_text(before)
    return out


def git_run(repo: git.Repo, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo.working_tree_dir), *args], capture_output=True, text=True, check=True
    ).stdout


def staged_patch(repo: git.Repo, out: Path, *diff_args: str) -> Path:
    """The staged change as a patch file (``git diff --cached``), then the change undone."""
    out.write_text(git_run(repo, "diff", "--cached", *diff_args))
    git_run(repo, "reset", "-q", "--hard", "HEAD")
    return out


def refused(
    repo: git.Repo, patch: Path, rule: str, path: str, globs: list[str] | None = None
) -> None:
    """``check_scope`` (init, apply) and ``create_worktree`` (every trial) refuse the patch with a
    message naming the patch file, the path and the rule, even with the widest scope; the
    checkout is untouched and no worktree is left behind."""
    globs = globs or ["**"]
    with pytest.raises(PatchError) as e:
        check_scope(patch, globs)
    for needle in (str(patch), path, rule):
        assert needle in str(e.value), (needle, str(e.value))
    before = git_run(repo, "worktree", "list")
    with pytest.raises(PatchError, match=re.escape(rule)):
        create_worktree(repo.working_tree_dir, [patch], globs=globs)
    if "rename" not in rule and "copy" not in rule:  # without a scope too (a trial's own check)
        with pytest.raises(PatchError, match=re.escape(rule)):
            create_worktree(repo.working_tree_dir, [patch])
    assert git_run(repo, "worktree", "list") == before
    assert not repo.is_dirty(untracked_files=True)
