"""apply: the verified winner goes to a new branch of a real git repo; main is never touched."""

from __future__ import annotations

import json
from pathlib import Path

import git
import pytest
import yaml
from synthetic_study import BEST, make_study

from infrarsi.errors import ApplyError
from infrarsi.stages.apply import apply


def make_repo(root: Path) -> git.Repo:
    repo = git.Repo.init(root, initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "Test")
        cw.set_value("user", "email", "test@example.com")
    (root / "workloads").mkdir(parents=True)
    (root / "workloads/model.py").write_text("def act(x):\n    return x\n")
    repo.index.add(["workloads/model.py"])
    repo.index.commit("baseline code")
    return repo


def make_patch(repo: git.Repo, out: Path) -> Path:
    f = Path(repo.working_tree_dir) / "workloads/model.py"
    before = f.read_text()
    f.write_text(before.replace("return x", "return x * 1.0"))
    out.write_text(repo.git.diff() + "\n")
    f.write_text(before)
    return out


def test_apply_creates_branch_tag_and_commit(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    patch = make_patch(repo, tmp_path / "fuse.patch")
    study = make_study(tmp_path, patches=[str(patch)])
    main_sha = repo.head.commit.hexsha
    res = apply(study, repo.working_tree_dir)
    assert res.branch.startswith("infrarsi/study-") and res.base_sha == main_sha
    assert res.tag == "infrarsi/golden/study" and res.tag_created
    assert repo.tags["infrarsi/golden/study"].commit.hexsha == main_sha
    # main and the user's checkout are untouched.
    assert repo.heads.main.commit.hexsha == main_sha
    assert repo.active_branch.name == "main" and not repo.is_dirty(untracked_files=True)
    commit = repo.commit(res.commit_sha)
    assert commit.parents[0].hexsha == main_sha
    assert repo.heads[res.branch].commit.hexsha == res.commit_sha
    knobs = yaml.safe_load((commit.tree / "infrarsi/study/knobs.yaml").data_stream.read())
    assert knobs["knobs"] == BEST and knobs["speedup"] == 3.03
    ds = json.loads((commit.tree / "infrarsi/study/deepspeed_config.json").data_stream.read())
    assert ds["zero_optimization"]["stage"] == 0 and ds["train_micro_batch_size_per_gpu"] == 8
    assert (commit.tree / "infrarsi/study/patches/fuse.patch").data_stream.read()
    assert b"return x * 1.0" in (commit.tree / "workloads/model.py").data_stream.read()
    assert "workloads/model.py" in res.files
    # Again without force: the branch exists.
    with pytest.raises(ApplyError, match="already exists"):
        apply(study, repo.working_tree_dir)
    # With force it is recreated; the golden tag is not moved.
    (Path(repo.working_tree_dir) / "new.txt").write_text("x")
    repo.index.add(["new.txt"])
    repo.index.commit("later work")
    res2 = apply(study, repo.working_tree_dir, force=True)
    assert not res2.tag_created
    assert repo.tags["infrarsi/golden/study"].commit.hexsha == main_sha


def test_apply_refuses_main_master_and_dirty(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    study = make_study(tmp_path)
    for name in ("main", "master", "refs/heads/main"):
        with pytest.raises(ApplyError, match="never commits to main"):
            apply(study, repo.working_tree_dir, branch=name, force=True)
    (Path(repo.working_tree_dir) / "workloads/model.py").write_text("changed\n")
    with pytest.raises(ApplyError, match="uncommitted changes"):
        apply(study, repo.working_tree_dir, branch="tuned")
    res = apply(study, repo.working_tree_dir, branch="tuned", force=True)
    assert res.branch == "tuned"
    assert (Path(repo.working_tree_dir) / "workloads/model.py").read_text() == "changed\n"
    assert repo.heads.main.commit.hexsha == res.base_sha
    with pytest.raises(ApplyError, match="not a valid git branch"):
        apply(study, repo.working_tree_dir, branch="bad..name", force=True)


def test_apply_refuses_unverified_and_non_repo(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    study = make_study(tmp_path, verified=False)
    with pytest.raises(ApplyError, match="NOT accepted"):
        apply(study, repo.working_tree_dir)
    (study / "verify.json").unlink()
    with pytest.raises(ApplyError, match="infrarsi verify"):
        apply(study, repo.working_tree_dir)
    study2 = make_study(tmp_path, name="s2")
    with pytest.raises(ApplyError, match="not a git repository"):
        apply(study2, tmp_path / "nowhere")
    assert [h.name for h in repo.heads] == ["main"] and not repo.tags


def test_apply_refuses_a_patch_outside_the_editable_scope(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    (Path(repo.working_tree_dir) / "setup.cfg").write_text("[x]\n")
    repo.index.add(["setup.cfg"])
    repo.index.commit("cfg")
    f = Path(repo.working_tree_dir) / "setup.cfg"
    f.write_text("[y]\n")
    bad = tmp_path / "bad.patch"
    bad.write_text(repo.git.diff() + "\n")
    f.write_text("[x]\n")
    study = make_study(tmp_path, patches=[str(bad)])
    with pytest.raises(ApplyError) as e:
        apply(study, repo.working_tree_dir)
    assert "setup.cfg" in str(e.value) and "workloads/**" in str(e.value)
    assert [h.name for h in repo.heads] == ["main"]


def test_apply_refuses_a_patch_writing_through_a_symlink(tmp_path: Path) -> None:
    """A committed link inside the editable scope, to a file outside it: a winner's patch that
    edits the file under the link's name is refused, and no branch is made."""
    repo = make_repo(tmp_path / "repo")
    root = Path(repo.working_tree_dir)
    (root / "setup.cfg").write_text("[x]\n")
    (root / "workloads" / "cfg").symlink_to("../setup.cfg")
    repo.git.add("setup.cfg", "workloads/cfg")
    repo.index.commit("a link")
    patch = tmp_path / "through.patch"
    patch.write_text(
        "diff --git a/workloads/cfg b/workloads/cfg\nindex 1111111..2222222 100644\n"
        "--- a/workloads/cfg\n+++ b/workloads/cfg\n@@ -1 +1 @@\n-[x]\n+[y]\n"
    )
    study = make_study(tmp_path, patches=[str(patch)])
    with pytest.raises(ApplyError, match="through a symbolic link") as e:
        apply(study, repo.working_tree_dir)
    assert "workloads/cfg" in str(e.value) and str(patch) in str(e.value)
    assert [h.name for h in repo.heads] == ["main"] and (root / "setup.cfg").read_text() == "[x]\n"


def test_apply_never_pushes_and_never_moves_main(tmp_path: Path) -> None:
    """With a remote configured, apply (forced, twice) leaves the remote as it was: no branch, no
    tag, main where it was; locally main and master keep their commits."""
    repo = make_repo(tmp_path / "repo")
    remote = git.Repo.init(tmp_path / "remote.git", bare=True, initial_branch="main")
    repo.create_remote("origin", str(tmp_path / "remote.git"))
    repo.git.push("origin", "main")
    repo.git.branch("master")
    before_remote = {r.path: r.commit.hexsha for r in remote.refs}
    main_sha = repo.heads.main.commit.hexsha
    study = make_study(tmp_path)
    res = apply(study, repo.working_tree_dir, branch="tuned", force=True)
    apply(study, repo.working_tree_dir, branch="tuned", force=True)
    assert {r.path: r.commit.hexsha for r in remote.refs} == before_remote
    assert repo.heads.main.commit.hexsha == main_sha == repo.heads.master.commit.hexsha
    assert res.commit_sha != main_sha and repo.heads.tuned.commit.parents[0].hexsha == main_sha
    for name in ("master", "refs/heads/master", "main"):
        with pytest.raises(ApplyError, match="never commits to main"):
            apply(study, repo.working_tree_dir, branch=name, force=True)
    assert repo.heads.master.commit.hexsha == main_sha


def test_a_failed_apply_leaves_no_branch_and_restores_a_forced_one(tmp_path: Path) -> None:
    """A winner's patch that does not apply: the new branch is removed again, and a branch that
    --force was recreating keeps its old commit."""
    repo = make_repo(tmp_path / "repo")
    patch = make_patch(repo, tmp_path / "stale.patch")
    (Path(repo.working_tree_dir) / "workloads/model.py").write_text("def act(x):\n    return -x\n")
    repo.index.add(["workloads/model.py"])
    repo.index.commit("moved on")
    study = make_study(tmp_path, patches=[str(patch)])
    with pytest.raises(ApplyError, match="does not apply"):
        apply(study, repo.working_tree_dir, branch="tuned")
    assert [h.name for h in repo.heads] == ["main"]
    repo.git.branch("tuned", "HEAD~1")
    old = repo.heads.tuned.commit.hexsha
    with pytest.raises(ApplyError, match="does not apply"):
        apply(study, repo.working_tree_dir, branch="tuned", force=True)
    assert repo.heads.tuned.commit.hexsha == old


def test_a_rejected_cheats_patch_never_reaches_the_branch(tmp_path: Path) -> None:
    """The knobs verify accepted also ran, in another trial, with a cheat's patch that broke an
    invariant: apply commits the verified candidate (the knobs, no patch), never the cheat's code,
    and refuses a verify.json edited to claim the cheat's patch."""
    from synthetic_study import BEST, row, write_rows

    from infrarsi.study.candidate import PatchRef, file_sha256

    repo = make_repo(tmp_path / "repo")
    cheat = make_patch(repo, tmp_path / "skip_layers.patch")
    study = make_study(tmp_path)  # BEST verified without a patch
    write_rows(
        study,
        [
            row(
                "run-9",
                "run",
                BEST,
                0.0,
                status="invariant_violation",
                patches=[str(cheat)],
                patch_sha256=[file_sha256(cheat)],
                error="loss left the tolerance at step 3",
            )
        ],
        name="cheat",
    )
    res = apply(study, repo.working_tree_dir, branch="tuned")
    assert "workloads/model.py" not in res.files
    assert "return x * 1.0" not in repo.git.show("tuned:workloads/model.py")
    assert "patches" not in " ".join(res.files)

    verify = json.loads((study / "verify.json").read_text())
    verify["best"]["patches"] = [PatchRef(str(cheat), file_sha256(cheat)).to_dict()]
    (study / "verify.json").write_text(json.dumps(verify))
    with pytest.raises(ApplyError, match="not what verify trial verify-c0 ran"):
        apply(study, repo.working_tree_dir, branch="cheat")
    assert "cheat" not in [h.name for h in repo.heads]


def test_apply_refuses_a_patch_changed_since_verify_and_a_candidate_that_broke_an_invariant(
    tmp_path: Path,
) -> None:
    from synthetic_study import BEST, row, write_rows

    from infrarsi.study.candidate import file_sha256

    repo = make_repo(tmp_path / "repo")
    patch = make_patch(repo, tmp_path / "fuse.patch")
    study = make_study(tmp_path, patches=[str(patch)])
    verified_sha = file_sha256(patch)
    patch.write_text(patch.read_text() + "\n")
    with pytest.raises(
        ApplyError, match=rf"sha256 .* now, {verified_sha[:16]} when verify measured it"
    ):
        apply(study, repo.working_tree_dir)
    patch.write_text(patch.read_text()[:-1])
    # The same candidate (knobs, patch bytes) broke an invariant in one run trial: never promoted.
    write_rows(
        study,
        [
            row(
                "run-9",
                "run",
                BEST,
                0.0,
                status="invariant_violation",
                patches=[str(patch)],
                patch_sha256=[verified_sha],
                error="eval loss differs",
            )
        ],
        name="broke",
    )
    with pytest.raises(ApplyError, match=r"run-9 of this very candidate .* broke an invariant"):
        apply(study, repo.working_tree_dir)
    assert [h.name for h in repo.heads] == ["main"]


def test_apply_needs_a_passed_long_check_of_this_very_candidate_or_says_it_skipped(
    tmp_path: Path,
) -> None:
    from synthetic_study import write_long_check

    repo = make_repo(tmp_path / "repo")
    study = make_study(tmp_path)
    best = json.loads((study / "verify.json").read_text())["best"]
    (study / "long_check.json").unlink()
    with pytest.raises(ApplyError, match="no long check of the verified candidate"):
        apply(study, repo.working_tree_dir)
    write_long_check(study, best, status="failed")
    with pytest.raises(ApplyError, match="long check of this candidate failed: step 14"):
        apply(study, repo.working_tree_dir)
    write_long_check(study, {**best, "config": {**best["config"], "micro_batch_size": 4}})
    with pytest.raises(ApplyError, match="checked another candidate"):
        apply(study, repo.working_tree_dir)
    assert [h.name for h in repo.heads] == ["main"]
    res = apply(study, repo.working_tree_dir, branch="unchecked", skip_long_check=True)
    assert "Long check: SKIPPED" in repo.commit(res.commit_sha).message
    assert json.loads((study / "apply.json").read_text())[-1]["skip_long_check"] is True
    write_long_check(study, best)
    res = apply(study, repo.working_tree_dir, branch="checked")
    msg = repo.commit(res.commit_sha).message
    assert "Long check: passed over 24 optimizer steps (a trial: 10)" in msg
    assert "long_check" in repo.git.show("checked:infrarsi/study/knobs.yaml")
