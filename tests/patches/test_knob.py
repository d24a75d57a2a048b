"""``infrarsi.patches.knob``: ``code_patch`` values (names and sets), and init's checks of the
patches a space names, against a real git repository holding the workload code."""

from __future__ import annotations

from pathlib import Path

import git
import pytest
import yaml

from infrarsi.errors import KnobError, PatchError
from infrarsi.patches import patch_names
from infrarsi.stages.init import init_stage
from tests.patches.workload_repo import MODEL, commit, conflicting_pair, make_repo


def test_patch_set_syntax() -> None:
    from infrarsi.patches import patch_relpaths, patch_set

    assert patch_set("none") == [] and patch_set("a") == ["a"]
    assert patch_set("rope_complex+moe_batched_experts") == ["rope_complex", "moe_batched_experts"]
    assert patch_relpaths("a+b") == ["workloads/patches/a.diff", "workloads/patches/b.diff"]
    for bad in ("a+a", "a+", "+a", "a+none", "a+b.diff", "a+../b"):
        with pytest.raises(KnobError, match="not a patch name or set"):
            patch_set(bad)


def test_patch_outside_the_editable_scope_is_refused_at_init(tmp_path: Path) -> None:
    root = make_repo(tmp_path, ["none", "rope_complex", "outside"])
    space = root / "search_spaces/deepspeed_dense.yaml"
    assert patch_names(space) == ["rope_complex", "outside"]
    with pytest.raises(PatchError) as e:
        init_stage(root / "workloads/dense_debug.yaml", tmp_path / "study")
    msg = str(e.value)
    assert "outside.diff" in msg and "infrarsi_hack.py" in msg and "workloads/**" in msg
    assert not (tmp_path / "study" / "contract.yaml").exists()
    # A narrower scope refuses the model patch too; a missing patch file is named.
    root2 = make_repo(tmp_path / "2", ["none", "rope_complex"])
    with pytest.raises(PatchError, match=r"rope_complex.diff.*workloads/models/moe/\*\*"):
        init_stage(
            root2 / "workloads/dense_debug.yaml",
            tmp_path / "s2",
            editable_globs=["workloads/models/moe/**"],
        )
    (root2 / "workloads/patches/rope_complex.diff").unlink()
    with pytest.raises(PatchError, match=r"rope_complex\.diff does not exist"):
        init_stage(root2 / "workloads/dense_debug.yaml", tmp_path / "s3")


def test_patch_that_does_not_apply_to_head_is_refused_at_init(tmp_path: Path) -> None:
    root = make_repo(tmp_path, ["none", "rope_complex"])
    repo = git.Repo(root)
    model = root / MODEL
    model.write_text(model.read_text().replace('"""Rotate ``x``', '"""Rotates ``x``'))
    commit(repo, "the model moved on")
    with pytest.raises(PatchError, match="does not apply"):
        init_stage(root / "workloads/dense_debug.yaml", tmp_path / "study")


def test_a_conflicting_set_in_the_space_is_refused_at_init_and_a_compatible_one_is_kept(
    tmp_path: Path,
) -> None:
    from infrarsi.errors import PatchConflictError
    from infrarsi.patches import check_space_patches, set_conflicts

    root = make_repo(
        tmp_path, ["none", "twice", "plus_one", "ident", "twice+ident", "twice+plus_one"]
    )
    conflicting_pair(root)
    assert set(set_conflicts(root, ["twice+ident", "twice+plus_one", "plus_one+twice"])) == {
        "twice+plus_one",
        "plus_one+twice",
    }
    space = root / "search_spaces/deepspeed_dense.yaml"
    with pytest.raises(PatchConflictError) as e:
        init_stage(root / "workloads/dense_debug.yaml", tmp_path / "study")
    msg = str(e.value)
    assert (
        "twice+plus_one" in msg
        and "plus_one.diff conflicts with" in msg
        and "twice+ident'" not in msg
    )
    assert not (tmp_path / "study" / "contract.yaml").exists()
    # Without the conflicting set the space passes; each patch file is returned once.
    data = yaml.safe_load(space.read_text())
    data["knobs"][-1]["values"] = ["none", "twice", "ident", "twice+ident"]
    files = check_space_patches(data, root, ["workloads/**"])
    assert [Path(f).name for f in files] == ["twice.diff", "ident.diff"]
