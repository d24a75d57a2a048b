"""``infrarsi.patches.worktree``: patched git worktrees beside an untouched checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

import git
import pytest

from infrarsi.errors import PatchError
from infrarsi.patches import (
    check_conflicts,
    create_worktree,
    patched_worktree,
    remove_worktree,
)
from tests.patches.repo_helpers import make_patch


def test_worktree_applies_patch_without_touching_checkout(repo: git.Repo, tmp_path: Path) -> None:
    p = make_patch(repo, "workloads/model.py", "return x", "return x * 2", tmp_path / "a.patch")
    with patched_worktree(repo.working_tree_dir, [p], globs=["workloads/**"]) as tree:
        assert "return x * 2" in (tree.path / "workloads/model.py").read_text()
        assert tree.base_sha == repo.head.commit.hexsha
        assert tree.paths_touched == ["workloads/model.py"]
        wt_path = tree.path
    assert not wt_path.exists()
    assert "return x * 2" not in (Path(repo.working_tree_dir) / "workloads/model.py").read_text()
    assert not repo.is_dirty()
    listed = subprocess.run(
        ["git", "-C", repo.working_tree_dir, "worktree", "list"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(wt_path) not in listed


def test_patch_that_does_not_apply(repo: git.Repo, tmp_path: Path) -> None:
    p = make_patch(repo, "workloads/model.py", "return x", "return x * 2", tmp_path / "a.patch")
    (Path(repo.working_tree_dir) / "workloads/model.py").write_text("def act(x):\n    return -x\n")
    repo.index.add(["workloads/model.py"])
    repo.index.commit("change")
    with pytest.raises(PatchError, match="does not apply"):
        check_conflicts(repo.working_tree_dir, [p])
    with pytest.raises(PatchError, match="does not apply"):
        create_worktree(repo.working_tree_dir, [p])
    tree = create_worktree(repo.working_tree_dir, [p], base="HEAD~1", dest=tmp_path / "wt")
    assert "return x * 2" in (tree.path / "workloads/model.py").read_text()
    remove_worktree(repo.working_tree_dir, tree.path)
    assert not (tmp_path / "wt").exists()
