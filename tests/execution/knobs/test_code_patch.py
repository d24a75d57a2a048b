"""The ``code_patch`` knob: its handler, and a patched trial followed through the executor,
``infrarsi trial`` and ``apply`` (the values and init's checks: tests/patches/test_knob.py).

Each test builds its own git repository holding a copy of the workload code (``workloads/``)
and a search space with a ``code_patch`` knob, so the patches apply to a committed tree whatever
the state of this checkout. The real trial runs through ``StudyExecutor`` -> ``TrialRunner`` on
2 gloo ranks.
"""

from __future__ import annotations

from pathlib import Path

import git
import pytest

from infrarsi.errors import KnobError
from infrarsi.execution.knobs.code_patch import code_patch
from infrarsi.execution.knobs.registry import KNOB_HANDLERS, TrialBuild
from infrarsi.patches import PATCH_KNOB, knob_patch_set
from infrarsi.stages.init import init_stage
from tests.patches.workload_repo import FAST, MODEL, ROOT, conflicting_pair, make_repo


def test_handler_records_and_checks_the_name(knob_ctx) -> None:
    assert KNOB_HANDLERS[PATCH_KNOB] is code_patch
    ctx = knob_ctx
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


@pytest.mark.integration
def test_patched_trial_runs_the_patched_code_with_the_same_loss(
    tmp_path: Path, ray_local: str
) -> None:
    from infrarsi.orchestration.executor import StudyExecutor
    from infrarsi.study.trial_log import read_trials

    root = make_repo(tmp_path, ["none", "rope_complex", "boom"])
    study = tmp_path / "study"
    init_stage(root / "workloads/dense_debug.yaml", study)
    ex = StudyExecutor(study, address=ray_local, check=False)
    try:
        base = ex.run_trial({**FAST, PATCH_KNOB: "none"}, "run")
        patched = ex.run_trial({**FAST, PATCH_KNOB: "rope_complex"}, "run")
        boom = ex.run_trial({**FAST, PATCH_KNOB: "boom"}, "run")
        # the tree it ran in: asked again, the study's trees give the same one (not a new one)
        code = ex._trees.code_for(ex.runner.code_dir, knob_patch_set(root, "rope_complex"))
        assert len(ex._trees) == 2 and code.tree is not None
        tree = code.tree.path
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

    from infrarsi.orchestration.common import load_space
    from infrarsi.stages.apply import apply
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


def test_a_conflicting_set_reaching_the_executor_is_failed_without_a_trial(tmp_path: Path) -> None:
    """A set that conflicts (here the space's check at init was bypassed) is refused before any
    rank starts: a ``failed`` row with ``patch_conflict``, no device time, both patches named;
    a set that applies runs on one worktree holding both patches."""
    from infrarsi.orchestration.common import copy_space
    from infrarsi.orchestration.executor import StudyExecutor
    from infrarsi.study.contract import Contract
    from infrarsi.study.trial_log import read_trials

    root = make_repo(
        tmp_path, ["none", "twice", "plus_one", "ident", "twice+ident", "twice+plus_one"]
    )
    conflicting_pair(root)
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
        tree = Path(str(ran[0]["code_dir"]))
        text = (tree / MODEL).read_text()
        assert ".flatten(-2) * 2" in text and "class RMSNorm(nn.Module):  # norm" in text
        assert len(ex._trees) == 1  # the conflicting set got no worktree
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
    assert not tree.exists()  # removed at close
    logged = {r["trial_id"]: r for r in read_trials(study).to_pylist()}
    assert logged[bad["trial_id"]]["status"] == "failed"


def test_apply_puts_every_patch_of_the_winners_set_on_the_branch(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from synthetic_study import row, write_rows, write_verified

    from infrarsi.orchestration.common import load_space
    from infrarsi.stages.apply import apply
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
