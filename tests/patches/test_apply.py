"""``infrarsi.patches.apply``: no patch writes through a symbolic link of the checked-out tree."""

from __future__ import annotations

from pathlib import Path

import git
import pytest

from infrarsi.errors import PatchError
from infrarsi.patches import (
    check_conflicts,
    check_scope,
    create_worktree,
)
from tests.patches.repo_helpers import git_run, make_patch, refused, staged_patch


def test_a_patch_writing_through_an_existing_symlink_is_refused(
    repo: git.Repo, tmp_path: Path
) -> None:
    """A committed link inside the scope, to a file outside it: a patch that edits the link (as
    a text file through it, or retargets it) or writes below a linked folder is refused."""
    root = Path(repo.working_tree_dir)
    (root / "workloads" / "cfg").symlink_to("../setup.cfg")
    (root / "workloads" / "outside").symlink_to(tmp_path)
    git_run(repo, "add", "workloads/cfg", "workloads/outside")
    git_run(repo, "commit", "-qm", "links")
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
    git_run(repo, "add", "workloads/cfg")
    staged_patch(repo, retarget)
    refused(repo, retarget, "symbolic links", "workloads/cfg")


def test_apply_patches_applies_in_order_and_stages_with_index(
    repo: git.Repo, tmp_path: Path
) -> None:
    """A set applied in order (staged with ``index``: what ``apply`` commits); a patch that does
    not apply is named with the ones before it."""
    from infrarsi.patches import Patch, apply_patches

    root = Path(str(repo.working_tree_dir))
    a = make_patch(repo, "workloads/model.py", "return x", "return x * 2", tmp_path / "a.patch")
    c = make_patch(repo, "workloads/model.py", "SCALE = 1.0", "SCALE = 2.0", tmp_path / "c.patch")
    b = make_patch(repo, "workloads/model.py", "return x", "return x + 1", tmp_path / "b.patch")
    git_run(repo, "update-index", "--refresh")  # make_patch rewrote the file: restat it
    apply_patches(root, [Patch.load(a), Patch.load(c)], index=True)
    text = (root / "workloads/model.py").read_text()
    assert "return x * 2" in text and "SCALE = 2.0" in text
    assert git_run(repo, "diff", "--cached", "--name-only").split() == ["workloads/model.py"]
    git_run(repo, "reset", "-q", "--hard", "HEAD")
    with pytest.raises(PatchError) as e:
        apply_patches(root, [Patch.load(a), Patch.load(b)], base=repo.head.commit.hexsha)
    msg = str(e.value)
    assert "b.patch does not apply at" in msg and "a.patch" in msg.split("after")[1]
