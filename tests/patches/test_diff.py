"""``infrarsi.patches.diff``: the paths a unified diff touches, as this package and git read them."""

from __future__ import annotations

from pathlib import Path

import git
import pytest

from infrarsi.errors import PatchError
from infrarsi.patches import (
    Patch,
    paths_touched,
)
from tests.patches.repo_helpers import refused


def test_bad_patch_texts() -> None:
    with pytest.raises(PatchError, match="not a unified diff"):
        paths_touched("hello\n")
    with pytest.raises(PatchError, match="leaves the repository"):
        paths_touched("--- a/../etc/passwd\n+++ b/../etc/passwd\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(PatchError, match="does not exist"):
        Patch.load("/nonexistent.patch")


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
    refused(repo, patch, "leaves the repository (path traversal)", path)
    assert not (Path(repo.working_tree_dir).parent / "evil.py").exists()


def test_a_patch_to_gits_own_files_is_refused(repo: git.Repo, tmp_path: Path) -> None:
    patch = tmp_path / "hook.patch"
    patch.write_text(
        "diff --git a/.git/hooks/pre-commit b/.git/hooks/pre-commit\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/.git/hooks/pre-commit\n@@ -0,0 +1 @@\n+rm -rf ~\n"
    )
    refused(repo, patch, "git's own files", ".git/hooks/pre-commit")
