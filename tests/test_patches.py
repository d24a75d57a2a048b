"""Code patches against a real git repository: paths, scope, conflicts, worktrees."""

from __future__ import annotations

import re
import shutil
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
    listed = subprocess.run(
        ["git", "-C", repo.working_tree_dir, "worktree", "list"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
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


# --------------------------------------------------------------------------- scope and security
def _git(repo: git.Repo, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo.working_tree_dir), *args], capture_output=True, text=True, check=True
    ).stdout


def _staged_patch(repo: git.Repo, out: Path, *diff_args: str) -> Path:
    """The staged change as a patch file (``git diff --cached``), then the change undone."""
    out.write_text(_git(repo, "diff", "--cached", *diff_args))
    _git(repo, "reset", "-q", "--hard", "HEAD")
    return out


def _refused(
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
    before = _git(repo, "worktree", "list")
    with pytest.raises(PatchError, match=re.escape(rule)):
        create_worktree(repo.working_tree_dir, [patch], globs=globs)
    if "rename" not in rule and "copy" not in rule:  # without a scope too (a trial's own check)
        with pytest.raises(PatchError, match=re.escape(rule)):
            create_worktree(repo.working_tree_dir, [patch])
    assert _git(repo, "worktree", "list") == before
    assert not repo.is_dirty(untracked_files=True)


@pytest.mark.parametrize(
    ("header", "path"),
    [
        ("--- a/../evil.py\n+++ b/../evil.py\n", "../evil.py"),
        (
            "diff --git a/x b/x\nnew file mode 100644\n--- /dev/null\n+++ /tmp/evil.py\n",
            "/tmp/evil.py",
        ),
        (
            'diff --git "a/workloads/\\056\\056/setup.cfg" "b/workloads/\\056\\056/setup.cfg"\n'
            '--- "a/workloads/\\056\\056/setup.cfg"\n+++ "b/workloads/\\056\\056/setup.cfg"\n',
            "workloads/../setup.cfg",
        ),
    ],
)
def test_path_traversal_is_refused(repo: git.Repo, tmp_path: Path, header: str, path: str) -> None:
    """A path that is absolute or climbs out with '..' (also spelled as C-quoted octal escapes,
    which ``git apply`` decodes) is refused, whatever the editable globs."""
    patch = tmp_path / "traversal.patch"
    patch.write_text(header + "@@ -0,0 +1 @@\n+import os\n")
    _refused(repo, patch, "leaves the repository (path traversal)", path)
    assert not (Path(repo.working_tree_dir).parent / "evil.py").exists()


def test_a_patch_to_gits_own_files_is_refused(repo: git.Repo, tmp_path: Path) -> None:
    patch = tmp_path / "hook.patch"
    patch.write_text(
        "diff --git a/.git/hooks/pre-commit b/.git/hooks/pre-commit\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/.git/hooks/pre-commit\n@@ -0,0 +1 @@\n+rm -rf ~\n"
    )
    _refused(repo, patch, "git's own files", ".git/hooks/pre-commit")


def test_a_patch_creating_a_symlink_is_refused(repo: git.Repo, tmp_path: Path) -> None:
    """A link made inside the scope that points outside it: `git apply` itself takes it."""
    root = Path(repo.working_tree_dir)
    (root / "workloads" / "passwd").symlink_to("/etc/passwd")
    _git(repo, "add", "workloads/passwd")
    patch = _staged_patch(repo, tmp_path / "link.patch")
    subprocess.run(
        ["git", "-C", str(root), "apply", "--check", str(patch)], check=True
    )  # git would apply it
    _refused(repo, patch, "symbolic links", "workloads/passwd", globs=["workloads/**"])


def test_a_patch_writing_through_an_existing_symlink_is_refused(
    repo: git.Repo, tmp_path: Path
) -> None:
    """A committed link inside the scope, to a file outside it: a patch that edits the link (as
    a text file through it, or retargets it) or writes below a linked folder is refused."""
    root = Path(repo.working_tree_dir)
    (root / "workloads" / "cfg").symlink_to("../setup.cfg")
    (root / "workloads" / "outside").symlink_to(tmp_path)
    _git(repo, "add", "workloads/cfg", "workloads/outside")
    _git(repo, "commit", "-qm", "links")
    through = tmp_path / "through.patch"  # edits setup.cfg's content under the link's name
    through.write_text(
        "diff --git a/workloads/cfg b/workloads/cfg\nindex 1111111..2222222 100644\n"
        "--- a/workloads/cfg\n+++ b/workloads/cfg\n@@ -1 +1 @@\n-[x]\n+[y]\n"
    )
    below = tmp_path / "below.patch"
    below.write_text(
        "diff --git a/workloads/outside/pwned.py b/workloads/outside/pwned.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/workloads/outside/pwned.py\n@@ -0,0 +1 @@\n+x = 1\n"
    )
    for patch, link in ((through, "workloads/cfg"), (below, "workloads/outside")):
        assert check_scope(patch, ["workloads/**"])  # regular text edits inside the scope...
        with pytest.raises(PatchError) as e:  # ...but the tree has a link on the way
            create_worktree(root, [patch], globs=["workloads/**"])
        msg = str(e.value)
        assert str(patch) in msg and link in msg and "through a symbolic link" in msg, msg
        with pytest.raises(PatchError, match="through a symbolic link"):
            check_conflicts(root, [patch])
    assert not (tmp_path / "pwned.py").exists() and (root / "setup.cfg").read_text() == "[x]\n"
    retarget = tmp_path / "retarget.patch"
    (root / "workloads" / "cfg").unlink()
    (root / "workloads" / "cfg").symlink_to("/etc/shadow")
    _git(repo, "add", "workloads/cfg")
    _staged_patch(repo, retarget)
    _refused(repo, retarget, "symbolic links", "workloads/cfg")


def test_a_binary_patch_is_refused(repo: git.Repo, tmp_path: Path) -> None:
    root = Path(repo.working_tree_dir)
    (root / "workloads" / "blob.bin").write_bytes(bytes(range(256)) * 4)
    _git(repo, "add", "workloads/blob.bin")
    _git(repo, "commit", "-qm", "blob")
    (root / "workloads" / "blob.bin").write_bytes(bytes(range(255, -1, -1)) * 4)
    _git(repo, "add", "workloads/blob.bin")
    patch = _staged_patch(repo, tmp_path / "bin.patch", "--binary")
    assert "GIT binary patch" in patch.read_text()
    _refused(repo, patch, "binary patches are refused", "workloads/blob.bin")
    (root / "workloads" / "blob.bin").write_bytes(b"\x00\x01")
    _git(repo, "add", "workloads/blob.bin")
    plain = _staged_patch(repo, tmp_path / "plain.patch")
    assert "Binary files" in plain.read_text()
    _refused(repo, plain, "binary patches are refused", "workloads/blob.bin")


def test_renames_and_copies_out_of_scope_are_refused(repo: git.Repo, tmp_path: Path) -> None:
    """Moving or copying a file from outside the scope into it (or out of it) is refused, naming
    the outside side; a rename inside the scope applies."""
    _git(repo, "mv", "setup.cfg", "workloads/setup.cfg")
    inward = _staged_patch(repo, tmp_path / "inward.patch", "-M")
    assert "rename from setup.cfg" in inward.read_text()
    _refused(
        repo,
        inward,
        "a rename must stay inside the contract's editable scope",
        "setup.cfg",
        globs=["workloads/**"],
    )
    _git(repo, "mv", "workloads/model.py", "model.py")
    outward = _staged_patch(repo, tmp_path / "outward.patch", "-M")
    with pytest.raises(PatchError, match=r"outside the contract's editable scope") as e:
        check_scope(outward, ["workloads/**"])
    assert "'model.py'" in str(e.value) or "['model.py']" in str(e.value)
    shutil.copy(
        Path(repo.working_tree_dir) / "setup.cfg",
        Path(repo.working_tree_dir) / "workloads" / "copied.cfg",
    )
    _git(repo, "add", "workloads/copied.cfg")
    copy = _staged_patch(repo, tmp_path / "copy.patch", "-C", "--find-copies-harder")
    assert "copy from setup.cfg" in copy.read_text()
    _refused(
        repo,
        copy,
        "a copy must stay inside the contract's editable scope",
        "setup.cfg",
        globs=["workloads/**"],
    )
    _git(repo, "mv", "workloads/model.py", "workloads/model2.py")
    inside = _staged_patch(repo, tmp_path / "inside.patch", "-M")
    with patched_worktree(repo.working_tree_dir, [inside], globs=["workloads/**"]) as tree:
        assert (tree.path / "workloads/model2.py").is_file() and not (
            tree.path / "workloads/model.py"
        ).exists()


def test_mode_changes_are_refused(repo: git.Repo, tmp_path: Path) -> None:
    """Making a file executable, or adding an executable file, is refused."""
    root = Path(repo.working_tree_dir)
    (root / "workloads" / "model.py").chmod(0o755)
    _git(repo, "add", "workloads/model.py")
    chmod = _staged_patch(repo, tmp_path / "chmod.patch")
    assert "new mode 100755" in chmod.read_text()
    subprocess.run(
        ["git", "-C", str(root), "apply", "--check", str(chmod)], check=True
    )  # git would apply it
    _refused(repo, chmod, "may not change a file's mode", "workloads/model.py")
    (root / "workloads" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "workloads" / "run.sh").chmod(0o755)
    _git(repo, "add", "workloads/run.sh")
    new_exec = _staged_patch(repo, tmp_path / "new_exec.patch")
    _refused(repo, new_exec, "a new file must be a regular file, mode 100644", "workloads/run.sh")


def test_a_plain_in_scope_patch_still_applies(repo: git.Repo, tmp_path: Path) -> None:
    """The checks refuse nothing a plain `git diff` of text files in scope holds (new file too)."""
    root = Path(repo.working_tree_dir)
    (root / "workloads" / "model.py").write_text(
        (root / "workloads" / "model.py").read_text() + "X = 2\n"
    )
    (root / "workloads" / "new.py").write_text("Y = 3\n")
    _git(repo, "add", "-A")
    patch = _staged_patch(repo, tmp_path / "ok.patch")
    assert sorted(check_scope(patch, ["workloads/**"])) == [
        "workloads/model.py",
        "workloads/new.py",
    ]
    with patched_worktree(root, [patch], globs=["workloads/**"]) as tree:
        assert (tree.path / "workloads/new.py").read_text() == "Y = 3\n"
    assert not repo.is_dirty(untracked_files=True)
