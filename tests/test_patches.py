"""``infrarsi.patches`` as a whole: the names its callers import, and one patch followed from its
scope check to a patched worktree through them (each module has its own tests in tests/patches/)."""

from __future__ import annotations

import importlib
from pathlib import Path

import infrarsi.patches
from infrarsi.patches import check_conflicts, check_scope, patched_worktree
from tests.patches.repo_helpers import make_patch, make_repo

MODULES = ("apply", "checkout", "conflicts", "diff", "knob", "scope", "worktree")
"""The package's modules (one concept each)."""


def test_every_exported_name_comes_from_exactly_one_module_of_the_package() -> None:
    homes: dict[str, list[str]] = {}
    for mod in MODULES:
        m = importlib.import_module(f"infrarsi.patches.{mod}")
        for name in m.__all__:
            homes.setdefault(name, []).append(mod)
            assert getattr(m, name) is getattr(infrarsi.patches, name, None) or (
                name not in infrarsi.patches.__all__
            ), (mod, name)
    assert sorted(homes) == sorted(infrarsi.patches.__all__)
    assert {n: h for n, h in homes.items() if len(h) > 1} == {}


def test_a_patch_from_scope_check_to_worktree(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    p = make_patch(repo, "workloads/model.py", "return x", "return x * 2", tmp_path / "a.patch")
    assert check_scope(p, ["workloads/**"]) == ["workloads/model.py"]
    check_conflicts(repo.working_tree_dir, [p])
    with patched_worktree(repo.working_tree_dir, [p], globs=["workloads/**"]) as tree:
        assert "return x * 2" in (tree.path / "workloads/model.py").read_text()
    assert not repo.is_dirty(untracked_files=True)
