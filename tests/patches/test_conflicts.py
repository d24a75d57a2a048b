"""``infrarsi.patches.conflicts``: a patch set that does not apply together names the culprits."""

from __future__ import annotations

from pathlib import Path

import git
import pytest

from infrarsi.errors import PatchError
from infrarsi.patches import (
    check_conflicts,
)
from tests.patches.repo_helpers import make_patch


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
