"""``infrarsi.patches.checkout``: the one way a patch set becomes the tree a trial runs in."""

from __future__ import annotations

import shutil
from pathlib import Path

import git
import pytest

from infrarsi.errors import PatchError
from tests.patches.workload_repo import MODEL, make_repo


def test_patched_code_is_a_temporary_worktree_with_the_patch_and_none_is_the_own_code(
    tmp_path: Path,
) -> None:
    from infrarsi.patches import patched_code

    root = make_repo(tmp_path, ["none", "rope_complex"])
    with patched_code(root, "none") as own:
        assert own.code_dir is None and own.patches == []
    with patched_code(root, "rope_complex") as code:
        tree = Path(str(code.code_dir))
        assert "view_as_complex" in (tree / MODEL).read_text()
        assert code.patches == ["workloads/patches/rope_complex.diff"]
        assert code.extra.patch_base_sha == git.Repo(root).head.commit.hexsha
    assert not tree.exists()  # removed on exit
    assert "view_as_complex" not in (root / MODEL).read_text()
    with pytest.raises(PatchError, match="do not exist"), patched_code(root, "no_such_patch"):
        pass
    plain = tmp_path / "plain"
    shutil.copytree(root / "workloads", plain / "workloads", ignore=shutil.ignore_patterns(".git"))
    with (
        pytest.raises(PatchError, match="not in a git repository"),
        patched_code(plain, "rope_complex"),
    ):
        pass


def test_one_tree_per_patch_sets_content_and_every_tree_removed_at_close(tmp_path: Path) -> None:
    """The same bytes share one worktree (whatever names them); an edited patch file gets a new
    one; the code dir inside is the workload's folder; ``close`` removes every tree."""
    from infrarsi.patches import PatchedTrees, PatchSet, knob_patch_set

    root = make_repo(tmp_path, ["none", "rope_complex"])
    knob = knob_patch_set(root, "rope_complex")
    assert knob is not None and knob.logged == ("workloads/patches/rope_complex.diff",)
    copy = tmp_path / "study" / "proposals" / "patches" / "prop-0001.diff"
    copy.parent.mkdir(parents=True)
    shutil.copyfile(knob.files[0], copy)
    proposal = PatchSet(files=(copy,), logged=("proposals/patches/prop-0001.diff",))
    assert knob.key() == proposal.key() and knob.digests() == proposal.digests()
    with PatchedTrees(globs=["workloads/**"]) as trees:
        assert trees.code_for(root, None).code_dir is None and len(trees) == 0
        a = trees.code_for(root, knob)
        assert trees.code_for(root, proposal).code_dir == a.code_dir and len(trees) == 1
        assert a.patches == ["workloads/patches/rope_complex.diff"]
        assert "view_as_complex" in (Path(str(a.code_dir)) / MODEL).read_text()
        copy.write_text(copy.read_text().replace("view_as_complex", "view_as_complex "))
        b = trees.code_for(root, proposal)
        assert b.code_dir != a.code_dir and len(trees) == 2
        dirs = [Path(str(c.tree.path)) for c in (a, b) if c.tree is not None]
    assert dirs and not any(d.exists() for d in dirs)
    assert "infrarsi-wt-" not in git.Repo(root).git.worktree("list")


def test_a_conflicting_set_is_refused_and_remembered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A set that does not apply together gets no tree; asked again, ``PatchedTrees`` refuses it
    without a new check (the real check, counted)."""
    import infrarsi.patches.checkout as checkout
    from infrarsi.errors import PatchConflictError
    from infrarsi.patches import PatchedTrees, check_out, knob_patch_set
    from tests.patches.workload_repo import conflicting_pair

    root = make_repo(tmp_path, ["none"])
    conflicting_pair(root)
    bad = knob_patch_set(root, "twice+plus_one")
    assert bad is not None
    with pytest.raises(PatchConflictError, match=r"plus_one\.diff conflicts with"):
        check_out(root, bad)
    calls: list[object] = []
    real = checkout.check_conflicts
    monkeypatch.setattr(checkout, "check_conflicts", lambda *a: calls.append(a) or real(*a))
    with PatchedTrees() as trees:
        for _ in range(2):
            with pytest.raises(PatchConflictError, match=r"plus_one\.diff conflicts with"):
                trees.code_for(root, bad)
        assert len(calls) == 1 and len(trees) == 0


def test_a_patch_outside_the_globs_gets_no_tree(tmp_path: Path) -> None:
    from infrarsi.patches import check_out, knob_patch_set

    root = make_repo(tmp_path, ["none", "outside"])
    patches = knob_patch_set(root, "outside")
    assert patches is not None
    with pytest.raises(PatchError, match="outside the contract's editable scope"):
        check_out(root, patches, globs=["workloads/**"])
    assert "infrarsi-wt-" not in git.Repo(root).git.worktree("list")


def test_a_patch_whose_bytes_changed_since_its_candidate_was_measured_is_named(
    tmp_path: Path,
) -> None:
    from infrarsi.patches import digest_mismatch, knob_patch_set

    root = make_repo(tmp_path, ["none", "rope_complex"])
    patches = knob_patch_set(root, "rope_complex")
    assert patches is not None
    paths, now = list(patches.logged), patches.digests()
    assert digest_mismatch(paths, now, None) is None and digest_mismatch(paths, now, now) is None
    other = digest_mismatch(paths, now, [*now, now[0]])
    assert other is not None and "recorded 2 patch(es), this trial would run 1" in str(other)
    changed = digest_mismatch(paths, now, ["0" * 64])
    assert changed is not None and "rope_complex.diff' changed since" in str(changed)
