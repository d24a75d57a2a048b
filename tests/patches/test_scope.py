"""``infrarsi.patches.scope``: editable globs, and the plain-text-edit rules, on real git patches."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import git
import pytest

from infrarsi.errors import PatchError
from infrarsi.patches import (
    check_scope,
    in_scope,
    patched_worktree,
    paths_touched,
)
from tests.patches.repo_helpers import git_run, make_patch, refused, staged_patch


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


def test_a_patch_creating_a_symlink_is_refused(repo: git.Repo, tmp_path: Path) -> None:
    """A link made inside the scope that points outside it: `git apply` itself takes it."""
    root = Path(repo.working_tree_dir)
    (root / "workloads" / "passwd").symlink_to("/etc/passwd")
    git_run(repo, "add", "workloads/passwd")
    patch = staged_patch(repo, tmp_path / "link.patch")
    subprocess.run(
        ["git", "-C", str(root), "apply", "--check", str(patch)], check=True
    )  # git would apply it
    refused(repo, patch, "symbolic links", "workloads/passwd", globs=["workloads/**"])


def test_a_binary_patch_is_refused(repo: git.Repo, tmp_path: Path) -> None:
    root = Path(repo.working_tree_dir)
    (root / "workloads" / "blob.bin").write_bytes(bytes(range(256)) * 4)
    git_run(repo, "add", "workloads/blob.bin")
    git_run(repo, "commit", "-qm", "blob")
    (root / "workloads" / "blob.bin").write_bytes(bytes(range(255, -1, -1)) * 4)
    git_run(repo, "add", "workloads/blob.bin")
    patch = staged_patch(repo, tmp_path / "bin.patch", "--binary")
    assert "GIT binary patch" in patch.read_text()
    refused(repo, patch, "binary patches are refused", "workloads/blob.bin")
    (root / "workloads" / "blob.bin").write_bytes(b"\x00\x01")
    git_run(repo, "add", "workloads/blob.bin")
    plain = staged_patch(repo, tmp_path / "plain.patch")
    assert "Binary files" in plain.read_text()
    refused(repo, plain, "binary patches are refused", "workloads/blob.bin")


def test_renames_and_copies_out_of_scope_are_refused(repo: git.Repo, tmp_path: Path) -> None:
    """Moving or copying a file from outside the scope into it (or out of it) is refused, naming
    the outside side; a rename inside the scope applies."""
    git_run(repo, "mv", "setup.cfg", "workloads/setup.cfg")
    inward = staged_patch(repo, tmp_path / "inward.patch", "-M")
    assert "rename from setup.cfg" in inward.read_text()
    refused(
        repo,
        inward,
        "a rename must stay inside the contract's editable scope",
        "setup.cfg",
        globs=["workloads/**"],
    )
    git_run(repo, "mv", "workloads/model.py", "model.py")
    outward = staged_patch(repo, tmp_path / "outward.patch", "-M")
    with pytest.raises(PatchError, match=r"outside the contract's editable scope") as e:
        check_scope(outward, ["workloads/**"])
    assert "'model.py'" in str(e.value) or "['model.py']" in str(e.value)
    shutil.copy(
        Path(repo.working_tree_dir) / "setup.cfg",
        Path(repo.working_tree_dir) / "workloads" / "copied.cfg",
    )
    git_run(repo, "add", "workloads/copied.cfg")
    copy = staged_patch(repo, tmp_path / "copy.patch", "-C", "--find-copies-harder")
    assert "copy from setup.cfg" in copy.read_text()
    refused(
        repo,
        copy,
        "a copy must stay inside the contract's editable scope",
        "setup.cfg",
        globs=["workloads/**"],
    )
    git_run(repo, "mv", "workloads/model.py", "workloads/model2.py")
    inside = staged_patch(repo, tmp_path / "inside.patch", "-M")
    with patched_worktree(repo.working_tree_dir, [inside], globs=["workloads/**"]) as tree:
        assert (tree.path / "workloads/model2.py").is_file() and not (
            tree.path / "workloads/model.py"
        ).exists()


def test_mode_changes_are_refused(repo: git.Repo, tmp_path: Path) -> None:
    """Making a file executable, or adding an executable file, is refused."""
    root = Path(repo.working_tree_dir)
    (root / "workloads" / "model.py").chmod(0o755)
    git_run(repo, "add", "workloads/model.py")
    chmod = staged_patch(repo, tmp_path / "chmod.patch")
    assert "new mode 100755" in chmod.read_text()
    subprocess.run(
        ["git", "-C", str(root), "apply", "--check", str(chmod)], check=True
    )  # git would apply it
    refused(repo, chmod, "may not change a file's mode", "workloads/model.py")
    (root / "workloads" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "workloads" / "run.sh").chmod(0o755)
    git_run(repo, "add", "workloads/run.sh")
    new_exec = staged_patch(repo, tmp_path / "new_exec.patch")
    refused(repo, new_exec, "a new file must be a regular file, mode 100644", "workloads/run.sh")


def test_a_plain_in_scope_patch_still_applies(repo: git.Repo, tmp_path: Path) -> None:
    """The checks refuse nothing a plain `git diff` of text files in scope holds (new file too)."""
    root = Path(repo.working_tree_dir)
    (root / "workloads" / "model.py").write_text(
        (root / "workloads" / "model.py").read_text() + "X = 2\n"
    )
    (root / "workloads" / "new.py").write_text("Y = 3\n")
    git_run(repo, "add", "-A")
    patch = staged_patch(repo, tmp_path / "ok.patch")
    assert sorted(check_scope(patch, ["workloads/**"])) == [
        "workloads/model.py",
        "workloads/new.py",
    ]
    with patched_worktree(root, [patch], globs=["workloads/**"]) as tree:
        assert (tree.path / "workloads/new.py").read_text() == "Y = 3\n"
    assert not repo.is_dirty(untracked_files=True)
