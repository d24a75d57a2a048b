"""The ``code_patch`` knob: patches scope- and apply-checked at init, and a real patched trial.

Each test builds its own git repository holding a copy of the workload code (``workloads/``)
and a search space with a ``code_patch`` knob, so the patches apply to a committed tree whatever
the state of this checkout. The real trial runs through ``StudyExecutor`` -> ``TrialRunner`` on
2 gloo ranks.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import git
import pytest
import yaml

from infrarsi.errors import KnobError, PatchError
from infrarsi.execution.knobs.code_patch import PATCH_KNOB, code_patch, patch_names
from infrarsi.execution.knobs.registry import KNOB_HANDLERS, KnobContext, TrialBuild
from infrarsi.stages.init import init_stage

ROOT = Path(__file__).resolve().parents[3]
MODEL = "workloads/models/dense/model.py"
FAST = {"zero_stage": 0, "micro_batch_size": 8, "activation_checkpointing": "none", "dtype": "fp32"}


def _commit(repo: git.Repo, msg: str) -> None:
    repo.git.add("-A")
    repo.git.commit("-q", "-m", msg, "--no-verify")


def _diff_patch(repo: git.Repo, name: str, old: str, new: str, path: str = MODEL) -> None:
    """Write workloads/patches/<name>.diff with `git diff` of an edit, then undo the edit."""
    f = Path(str(repo.working_tree_dir)) / path
    text = f.read_text() if f.exists() else ""
    assert old in text
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(text.replace(old, new, 1) if old else new)
    out = Path(str(repo.working_tree_dir)) / "workloads/patches" / f"{name}.diff"
    if not text:
        repo.git.add("-N", path)
    out.write_text(repo.git.diff(path) + "\n")
    if text:
        repo.git.checkout("--", path)
    else:
        repo.git.rm("--cached", "-q", path)
        f.unlink()


def make_repo(tmp: Path, values: list[str], *, steps: tuple[int, int] = (1, 3)) -> Path:
    """A git repo with the workload code, ``workloads/dense_debug.yaml`` (short) and a space whose
    ``code_patch`` knob takes ``values``; the patches ``boom`` and ``outside`` are generated."""
    root = tmp / "repo"
    shutil.copytree(
        ROOT / "workloads", root / "workloads", ignore=shutil.ignore_patterns("__pycache__")
    )
    (root / "search_spaces").mkdir()
    space = yaml.safe_load((ROOT / "search_spaces/deepspeed_dense.yaml").read_text())
    space["knobs"] = [k for k in space["knobs"] if k["name"] != PATCH_KNOB]
    space["knobs"].append({"name": PATCH_KNOB, "type": "choice", "values": values})
    (root / "search_spaces/deepspeed_dense.yaml").write_text(yaml.safe_dump(space, sort_keys=False))
    wl = yaml.safe_load((ROOT / "workloads/dense_debug.yaml").read_text())
    wl["steps"] = {"warmup": steps[0], "measured": steps[1]}
    (root / "workloads/dense_debug.yaml").write_text(yaml.safe_dump(wl, sort_keys=False))
    repo = git.Repo.init(root)
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "test")
        cw.set_value("user", "email", "test@example.com")
    _commit(repo, "workload")
    _diff_patch(
        repo,
        "boom",
        "    c, s = cos[: x.shape[-2]], sin[: x.shape[-2]]\n",
        '    raise RuntimeError("boom patch is applied")\n',
    )
    _diff_patch(repo, "outside", "", "print('not workload code')\n", path="infrarsi_hack.py")
    _commit(repo, "patches")
    return root


def test_handler_records_and_checks_the_name() -> None:
    assert KNOB_HANDLERS[PATCH_KNOB] is code_patch
    ctx = KnobContext(
        world_size=2,
        num_params=1,
        hidden_size=1,
        global_batch_size=16,
        seq_len=128,
        device="cpu",
        config={},
    )
    build = TrialBuild()
    code_patch("rope_complex", build, ctx)
    assert build.runtime == {PATCH_KNOB: "rope_complex"} and not build.ds_config and not build.env
    for bad in ("../etc/passwd", "a/b", "x.diff", ""):
        with pytest.raises(KnobError, match="not a patch name"):
            code_patch(bad, build, ctx)


def test_shipped_patch_is_a_git_diff_of_the_dense_model() -> None:
    text = (ROOT / "workloads/patches/rope_complex.diff").read_text()
    assert text.startswith(f"diff --git a/{MODEL} b/{MODEL}\n")
    assert "+    xc = torch.view_as_complex(" in text


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
    _commit(repo, "the model moved on")
    with pytest.raises(PatchError, match="does not apply"):
        init_stage(root / "workloads/dense_debug.yaml", tmp_path / "study")


@pytest.mark.integration
def test_patched_trial_runs_the_patched_code_with_the_same_loss(
    tmp_path: Path, ray_local: str
) -> None:
    from infrarsi.stages.executor import StudyExecutor
    from infrarsi.study.trial_log import read_trials

    root = make_repo(tmp_path, ["none", "rope_complex", "boom"])
    study = tmp_path / "study"
    init_stage(root / "workloads/dense_debug.yaml", study)
    ex = StudyExecutor(study, address=ray_local, check=False)
    try:
        base = ex.run_trial({**FAST, PATCH_KNOB: "none"}, "run")
        patched = ex.run_trial({**FAST, PATCH_KNOB: "rope_complex"}, "run")
        boom = ex.run_trial({**FAST, PATCH_KNOB: "boom"}, "run")
        tree = ex._trees["rope_complex"].path
        assert "view_as_complex" in (tree / MODEL).read_text()
        assert "view_as_complex" not in (root / MODEL).read_text()  # the user's tree is untouched
    finally:
        ex.close()
    assert not tree.exists()  # worktrees are removed at close
    assert base["status"] == "ok" and base["patches"] == []
    assert patched["status"] == "ok", patched["error"][-2000:]
    assert patched["patches"] == ["workloads/patches/rope_complex.diff"]
    assert patched["extra"]["patch_base_sha"] == git.Repo(root).head.commit.hexsha
    assert len(patched["loss"]) == len(base["loss"]) == 4
    assert max(abs(a - b) for a, b in zip(patched["loss"], base["loss"], strict=True)) <= 1e-4
    # The trial really ran the worktree's code: the broken patch fails in the ranks.
    assert boom["status"] == "failed" and "boom patch is applied" in boom["error"]
    assert boom["patches"] == ["workloads/patches/boom.diff"]
    logged = {r["trial_id"]: r for r in read_trials(study).to_pylist()}
    assert list(logged[patched["trial_id"]]["patches"]) == ["workloads/patches/rope_complex.diff"]
    print(f"step_time_s none={base['step_time_s']:.4f} rope_complex={patched['step_time_s']:.4f}")


def test_apply_puts_the_winners_patch_on_the_branch(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from synthetic_study import row, write_rows, write_verified

    from infrarsi.stages.apply import apply
    from infrarsi.stages.common import load_space
    from infrarsi.study.candidate import file_sha256
    from infrarsi.study.contract import Contract

    root = make_repo(tmp_path, ["none", "rope_complex"])
    study = tmp_path / "study"
    contract = init_stage(root / "workloads/dense_debug.yaml", study)
    space = load_space(Contract.load(study), study)
    base = space.validate(dict(contract.workload_model().baseline))
    best = space.validate({**FAST, PATCH_KNOB: "rope_complex"})
    rel = ["workloads/patches/rope_complex.diff"]
    sha = [file_sha256(root / p) for p in rel]
    write_rows(
        study,
        [
            row("doctor-0", "doctor", base, 0.0, step=2.0),
            row("run-0", "run", best, 30.0, step=0.6, patches=rel, patch_sha256=sha),
        ],
    )
    write_verified(study, [row("v", "verify", best, 60.0, step=0.6, patches=rel, patch_sha256=sha)])
    res = apply(study, root, branch="tuned")
    assert MODEL in res.files
    repo = git.Repo(root)
    assert "view_as_complex" in repo.git.show(f"tuned:{MODEL}")
    assert "view_as_complex" not in (root / MODEL).read_text()  # the checkout is untouched
    assert PATCH_KNOB in repo.git.show(f"tuned:infrarsi/{contract.study}/knobs.yaml")


def _conflicting_pair(root: Path) -> None:
    """Patches ``twice`` and ``plus_one`` edit the same line of the model (each applies alone),
    and ``ident`` an unrelated line."""
    repo = git.Repo(root)
    line = "    out = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)\n"
    _diff_patch(repo, "twice", line, line.replace(".flatten(-2)", ".flatten(-2) * 2"))
    _diff_patch(repo, "plus_one", line, line.replace(".flatten(-2)", ".flatten(-2) + 1"))
    _diff_patch(repo, "ident", "class RMSNorm(nn.Module):\n", "class RMSNorm(nn.Module):  # norm\n")
    _commit(repo, "more patches")


def test_patch_set_syntax() -> None:
    from infrarsi.execution.knobs.code_patch import patch_relpaths, patch_set

    assert patch_set("none") == [] and patch_set("a") == ["a"]
    assert patch_set("rope_complex+moe_batched_experts") == ["rope_complex", "moe_batched_experts"]
    assert patch_relpaths("a+b") == ["workloads/patches/a.diff", "workloads/patches/b.diff"]
    for bad in ("a+a", "a+", "+a", "a+none", "a+b.diff", "a+../b"):
        with pytest.raises(KnobError, match="not a patch name or set"):
            patch_set(bad)


def test_a_conflicting_set_in_the_space_is_refused_at_init_and_a_compatible_one_is_kept(
    tmp_path: Path,
) -> None:
    from infrarsi.errors import PatchConflictError
    from infrarsi.execution.knobs.code_patch import check_space_patches, set_conflicts

    root = make_repo(
        tmp_path, ["none", "twice", "plus_one", "ident", "twice+ident", "twice+plus_one"]
    )
    _conflicting_pair(root)
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


def test_a_conflicting_set_reaching_the_executor_is_failed_without_a_trial(tmp_path: Path) -> None:
    """A set that conflicts (here the space's check at init was bypassed) is refused before any
    rank starts: a ``failed`` row with ``patch_conflict``, no device time, both patches named;
    a set that applies runs on one worktree holding both patches."""
    from infrarsi.stages.common import copy_space
    from infrarsi.stages.executor import StudyExecutor
    from infrarsi.study.contract import Contract
    from infrarsi.study.trial_log import read_trials

    root = make_repo(
        tmp_path, ["none", "twice", "plus_one", "ident", "twice+ident", "twice+plus_one"]
    )
    _conflicting_pair(root)
    study = tmp_path / "study"
    contract = Contract.create(
        root / "workloads/dense_debug.yaml",
        study_dir=study,
        search_space=root / "search_spaces/deepspeed_dense.yaml",
        memory_capacity_bytes=1 << 30,
    )
    contract.save(study)
    copy_space(contract, study)
    ex = StudyExecutor(study, check=False)
    ran: list[dict] = []

    def fake_run(config: dict, **kw: object) -> object:  # no Ray: record what would have run
        from infrarsi.result import TrialResult

        ran.append({"config": config, **kw})
        return TrialResult(
            trial_id=str(kw["trial_id"]),
            stage=str(kw["stage"]),
            config=config,
            status="ok",
            patches=list(kw["patches"]),
            world_size=2,
            device_seconds=1.0,
        )

    ex.runner.run = fake_run  # type: ignore[method-assign]
    try:
        bad = ex.run_trial({**FAST, PATCH_KNOB: "twice+plus_one"}, "run")
        again = ex.run_trial({**FAST, PATCH_KNOB: "twice+plus_one"}, "run")
        good = ex.run_trial({**FAST, PATCH_KNOB: "twice+ident"}, "run")
        tree = ex._trees["twice+ident"].path
        text = (tree / MODEL).read_text()
        assert ".flatten(-2) * 2" in text and "class RMSNorm(nn.Module):  # norm" in text
        assert "twice+plus_one" not in ex._trees
    finally:
        ex.close()
    for row in (bad, again):
        assert row["status"] == "failed" and row["device_seconds"] == 0.0
        assert "plus_one.diff conflicts with" in row["extra"]["patch_conflict"]
        assert row["patches"] == ["workloads/patches/twice.diff", "workloads/patches/plus_one.diff"]
    assert [r["config"][PATCH_KNOB] for r in ran] == [
        "twice+ident"
    ]  # the conflict never reached the runner
    assert good["status"] == "ok"
    assert good["patches"] == ["workloads/patches/twice.diff", "workloads/patches/ident.diff"]
    assert ran[0]["code_dir"] == str(tree)
    logged = {r["trial_id"]: r for r in read_trials(study).to_pylist()}
    assert logged[bad["trial_id"]]["status"] == "failed"


def test_apply_puts_every_patch_of_the_winners_set_on_the_branch(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from synthetic_study import row, write_rows, write_verified

    from infrarsi.stages.apply import apply
    from infrarsi.stages.common import load_space
    from infrarsi.study.candidate import file_sha256
    from infrarsi.study.contract import Contract

    root = make_repo(tmp_path, ["none", "rope_complex", "sdpa_gqa", "rope_complex+sdpa_gqa"])
    study = tmp_path / "study"
    contract = init_stage(root / "workloads/dense_debug.yaml", study)
    space = load_space(Contract.load(study), study)
    base = space.validate(dict(contract.workload_model().baseline))
    best = space.validate({**FAST, PATCH_KNOB: "rope_complex+sdpa_gqa"})
    rel = ["workloads/patches/rope_complex.diff", "workloads/patches/sdpa_gqa.diff"]
    sha = [file_sha256(root / p) for p in rel]
    write_rows(
        study,
        [row("doctor-0", "doctor", base, 0.0, step=2.0), row("run-0", "run", best, 30.0, step=0.6)],
    )
    write_verified(study, [row("v", "verify", best, 60.0, step=0.6, patches=rel, patch_sha256=sha)])
    apply(study, root, branch="tuned")
    text = git.Repo(root).git.show(f"tuned:{MODEL}")
    assert "view_as_complex" in text and "enable_gqa=" in text


def test_patched_code_is_a_temporary_worktree_with_the_patch_and_none_is_the_own_code(
    tmp_path: Path,
) -> None:
    from infrarsi.execution.knobs.code_patch import patched_code

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


@pytest.mark.integration
def test_infrarsi_trial_runs_a_code_patch_in_a_worktree(tmp_path: Path, ray_local: str) -> None:
    """``infrarsi trial --set code_patch=NAME`` runs the patched code (it used to record the patch
    in the config and run the untouched code): the broken patch fails in the ranks."""
    import subprocess
    import sys

    from infrarsi.study.trial_log import read_trials, rows

    root = make_repo(tmp_path, ["none", "boom"])
    study = tmp_path / "log"
    exe = Path(sys.executable).with_name("infrarsi")
    proc = subprocess.run(
        [
            str(exe),
            "trial",
            "workloads/dense_debug.yaml",
            "--set",
            "code_patch=boom",
            "--set",
            "zero_stage=0",
            "--log",
            str(study),
            "--address",
            ray_local,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the trial is not ok
    (row,) = rows(read_trials(study))
    assert row.status == "failed" and "boom patch is applied" in row.error, row.error[-2000:]
    assert row.patches == ["workloads/patches/boom.diff"]
    assert row.extra.patch_base_sha == git.Repo(root).head.commit.hexsha
    assert [
        p for p in git.Repo(root).git.worktree("list").splitlines() if "infrarsi-wt-" in p
    ] == []
