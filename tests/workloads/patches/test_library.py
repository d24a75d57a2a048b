"""The patch library as shipped: every patch has an equivalence test here, and every shipped
search space's ``code_patch`` values (patches and sets) pass init's checks against this
repository's HEAD (present, inside ``workloads/**``, applying alone and together)."""

from __future__ import annotations

from pathlib import Path

import git
import pytest

from infrarsi.execution.knobs.code_patch import check_space_patches, patch_names, patch_set
from tests.workloads.patches.helpers import ROOT

SPACES = sorted((ROOT / "search_spaces").glob("*.yaml"))


def test_every_patch_has_an_equivalence_test() -> None:
    names = sorted(p.stem for p in (ROOT / "workloads/patches").glob("*.diff"))
    assert names, "no patches shipped"
    here = Path(__file__).parent
    assert [n for n in names if not (here / f"test_{n}.py").is_file()] == []


def test_the_spaces_name_shipped_patches_and_sets() -> None:
    named = {n for s in SPACES for v in patch_names(s) for n in patch_set(v)}
    assert named == {p.stem for p in (ROOT / "workloads/patches").glob("*.diff")}
    assert any("+" in v for s in SPACES for v in patch_names(s))  # at least one set is searched


@pytest.mark.parametrize("space", [s for s in SPACES if patch_names(s)], ids=lambda p: p.name)
def test_shipped_space_patches_pass_init_checks(space: Path) -> None:
    try:
        git.Repo(ROOT)
    except git.InvalidGitRepositoryError:
        pytest.skip("not a git checkout")
    files = check_space_patches(space, ROOT, ["workloads/**"])
    assert len(files) == len({n for v in patch_names(space) for n in patch_set(v)})
