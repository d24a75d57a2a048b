"""Code patches against a real git repository: paths, scope, conflicts, worktrees."""

from __future__ import annotations

import subprocess
from pathlib import Path

import git
import pytest

from infrarsi.errors import PatchError
from infrarsi.patches import (
    Patch,
    check_conflicts,
    check_scope,
    create_worktree,
    in_scope,
    patched_worktree,
    paths_touched,
    remove_worktree,
)


def make_repo(root: Path) -> git.Repo:
    repo = git.Repo.init(root, initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "Test")
        cw.set_value("user", "email", "test@example.com")
    (root / "workloads").mkdir()
    filler = "".join(f"# line {i}\n" for i in range(12))
    (root / "workloads/model.py").write_text(f"def act(x):\n    return x\n\n{filler}\nSCALE = 1.0\n")
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


@pytest.fixture
def repo(tmp_path: Path) -> git.Repo:
    return make_repo(tmp_path / "repo")


def test_paths_touched_and_scope(repo: git.Repo, tmp_path: Path) -> None:
    p = make_patch(repo, "workloads/model.py", "return x", "return x * 2", tmp_path / "a.patch")
    assert paths_touched(p.read_text()) == ["workloads/model.py"]
    assert check_scope(p, ["workloads/**"]) == ["workloads/model.py"]
    bad = make_patch(repo, "setup.cfg", "[x]", "[y]", tmp_path / "b.patch")
    with pytest.raises(PatchError) as e:
        check_scope(bad, ["workloads/**"])
    assert "setup.cfg" in str(e.value) and "workloads/**" in str(e.value)


def test_glob_semantics() -> None:
    assert in_scope("workloads/a/b/c.py", ["workloads/**"])
    assert in_scope("workloads/c.py", ["workloads/*.py"])
    assert not in_scope("workloads/a/c.py", ["workloads/*.py"])
    assert in_scope("src/x/kernels/k.py", ["src/**/kernels/*.py"])
    assert in_scope("src/kernels/k.py", ["src/**/kernels/*.py"])
    assert not in_scope("setup.cfg", ["workloads/**"])


def test_bad_patch_texts() -> None:
    with pytest.raises(PatchError, match="not a unified diff"):
        paths_touched("hello\n")
    with pytest.raises(PatchError, match="leaves the repository"):
        paths_touched("--- a/../etc/passwd\n+++ b/../etc/passwd\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(PatchError, match="does not exist"):
        Patch.load("/nonexistent.patch")


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
    listed = subprocess.run(["git", "-C", repo.working_tree_dir, "worktree", "list"],
                            capture_output=True, text=True, check=True).stdout
    assert str(wt_path) not in listed


def test_conflicting_patches_are_named(repo: git.Repo, tmp_path: Path) -> None:
    a = make_patch(repo, "workloads/model.py", "return x", "return x * 2", tmp_path / "a.patch")
    b = make_patch(repo, "workloads/model.py", "return x", "return x + 1", tmp_path / "b.patch")
    c = make_patch(repo, "workloads/model.py", "SCALE = 1.0", "SCALE = 2.0", tmp_path / "c.patch")
    check_conflicts(repo.working_tree_dir, [a, c])  # disjoint hunks in one file: fine
    with pytest.raises(PatchError) as e:
        check_conflicts(repo.working_tree_dir, [a, c, b])
    msg = str(e.value)
    assert "b.patch conflicts with" in msg and "a.patch" in msg
    assert "c.patch']" not in msg.split("conflicts with")[1].split("(")[0]


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
