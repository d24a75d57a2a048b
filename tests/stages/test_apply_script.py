"""apply of a script workload, on real git: the winner goes into the script's own DeepSpeed config
(the merge the trial made) and its launch line; main is never touched."""

from __future__ import annotations

import importlib
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import git
import pytest
from synthetic_study import GIB, ROOT, row, write_verified

from infrarsi.errors import ApplyError
from infrarsi.execution.knobs.deepspeed import build_trial
from infrarsi.execution.script_config import merge_trial_config
from infrarsi.execution.script_hf import trainer_ds_config, trainer_overrides
from infrarsi.result import TrialExtra
from infrarsi.stages.apply import apply
from infrarsi.stages.apply_script import check_ran, set_option
from infrarsi.stages.init_script import arg_value, parse_launch_line
from infrarsi.study.contract import Contract

EXAMPLE = ROOT / "examples/scripts"
NUM_PARAMS, HIDDEN = 120_000, 64


def script_repo(tmp: Path, files: tuple[str, ...]) -> tuple[git.Repo, Path]:
    """A git repo whose ``job/`` holds the example's files, committed on main."""
    root = tmp / "repo"
    repo = git.Repo.init(root, initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "Test")
        cw.set_value("user", "email", "test@example.com")
    (root / "job").mkdir(parents=True)
    for f in files:
        shutil.copy(EXAMPLE / f, root / "job" / f)
    repo.git.add("job")
    repo.index.commit("the user's job")
    return repo, root / "job"


def script_study(
    tmp: Path, workload: Path, changes: dict[str, Any], engine: Any
) -> tuple[Path, dict[str, Any]]:
    """A study of ``workload`` whose verify accepted the baseline with ``changes``; its verify
    trials log the engine config ``engine(contract, config)`` gives. Returns (DIR, engine config)."""
    d = tmp / "study"
    c = Contract.create(
        workload, study_dir=d, request="faster", memory_capacity_bytes=GIB, trials=4
    ).with_calibration(loss_atol=1e-4, reason="doctor: 3 baseline trials")
    c.save(d)
    sp = c.search_space(d)
    base = {**{k.name: k.default for k in sp.knobs}, **c.workload.get("baseline", {})}
    win = sp.resolve({**base, **changes})
    ran = engine(c, win)
    t = time.time() - 600
    rows = [
        row(
            "v",
            "verify",
            win,
            t + 20 * i,
            step=0.5,
            extra=TrialExtra(ds_config=ran, num_params=NUM_PARAMS),
        )
        for i in range(3)
    ]
    write_verified(d, rows)
    return d, ran


def _build(c: Contract, win: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    wl = c.workload_model()
    return wl, build_trial(wl, win, wl.world_size, NUM_PARAMS, HIDDEN).ds_config


def ds_engine(c: Contract, win: dict[str, Any]) -> dict[str, Any]:
    """What ds_train.py's trial builds its engine from (script_job: the merge into ds.json)."""
    _, trial = _build(c, win)
    script = json.loads((EXAMPLE / "ds.json").read_text())
    return merge_trial_config(
        script, trial, list(win), num_params=NUM_PARAMS, hidden_size=HIDDEN, client_optimizer=True
    )


def hf_engine(c: Contract, win: dict[str, Any]) -> dict[str, Any]:
    """What a Trainer trial builds its engine from: the trial's numbers in hf_ds.json
    (``trainer_ds_config``), transformers' own ``"auto"`` filled, then the merge."""
    wl, trial = _build(c, win)
    cfg = trainer_ds_config(
        json.loads((EXAMPLE / "hf_ds.json").read_text()),
        trainer_overrides(trial, win, wl.world_size),
    )
    cfg["gradient_clipping"] = 1.0  # TrainingArguments.max_grad_norm
    cfg["steps_per_print"] = float("inf")  # accelerate's DeepSpeedPlugin, whatever the file says
    return merge_trial_config(
        cfg, trial, list(win), num_params=NUM_PARAMS, hidden_size=HIDDEN, client_optimizer=True
    )


def run_launch(repo: git.Repo, tmp: Path) -> tuple[str, str, list[str]]:
    """Run the branch's launch.sh (checked out apart) with a stand-in ``deepspeed`` on PATH that
    records its environment, folder and arguments; the folder is mapped back to the user's repo."""
    out = tmp / "checkout"
    repo.git.worktree("add", str(out), "tuned")
    stub = tmp / "bin"
    stub.mkdir()
    (stub / "deepspeed").write_text(
        '#!/bin/sh\nprintf "%s\\n" "$OMP_NUM_THREADS" "$PWD" "$@" > "$RECORD"\n'
    )
    (stub / "deepspeed").chmod(0o755)
    record = tmp / "record.txt"
    env = {"PATH": f"{stub}:/usr/bin:/bin", "RECORD": str(record)}
    subprocess.run([str(out / "infrarsi/study/launch.sh")], env=env, check=True)
    repo.git.worktree("remove", "--force", str(out))
    threads, cwd, *args = record.read_text().splitlines()
    return threads, str(Path(repo.working_tree_dir) / Path(cwd).relative_to(out.resolve())), args


def test_a_deepspeed_script_gets_the_winning_config_in_its_own_ds_json(tmp_path: Path) -> None:
    repo, job = script_repo(tmp_path, ("ds_train.py", "ds.json", "ds_train.yaml"))
    main_sha = repo.head.commit.hexsha
    changes = {
        "zero_stage": 2,
        "micro_batch_size": 4,
        "overlap_comm": True,
        "threads_per_worker": 2,
    }
    d, ran = script_study(tmp_path, job / "ds_train.yaml", changes, ds_engine)
    res = apply(d, repo.working_tree_dir, branch="tuned")
    assert "job/ds.json" in res.files and "infrarsi/study/launch.sh" in res.files
    text = (repo.heads.tuned.commit.tree / "job/ds.json").data_stream.read().decode()
    ds = json.loads(text)
    assert ds == ran  # exactly the config the winning trial built its engine from
    user = json.loads((EXAMPLE / "ds.json").read_text())
    assert ds["gradient_clipping"] == user["gradient_clipping"] == 1.0
    assert ds["zero_optimization"]["contiguous_gradients"] is True
    assert ds["zero_optimization"]["stage"] == 2 and ds["zero_optimization"]["overlap_comm"]
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (4, 2)
    assert list(ds)[: len(user)] == list(user)  # the user's keys in their order, new ones after
    assert text.startswith("{\n  ") and text.endswith("}\n")  # readable JSON
    # main, its ds.json and the user's checkout are untouched.
    assert repo.heads.main.commit.hexsha == main_sha and repo.active_branch.name == "main"
    assert json.loads(repo.git.show("main:job/ds.json")) == user
    assert not repo.is_dirty(untracked_files=True)
    # The launch line: the workload's own, from its folder, with the knobs' environment.
    sh = repo.git.show("tuned:infrarsi/study/launch.sh")
    command = (
        "deepspeed --num_gpus 2 ds_train.py --deepspeed --deepspeed_config ds.json --steps 1000"
    )
    line = f"OMP_NUM_THREADS=2 {command}"
    assert f"exec {command} " in sh and "export OMP_NUM_THREADS=2\n" in sh
    assert 'cd "$(dirname "$0")/../../job"' in sh
    assert run_launch(repo, tmp_path) == ("2", str(job), command.split()[1:])
    mode = repo.commit(res.commit_sha).tree["infrarsi/study/launch.sh"].mode
    assert mode == 0o100755
    readme = repo.git.show("tuned:infrarsi/study/README.md")
    assert "`job/ds.json`" in readme and line in readme and "arguments unchanged" in readme
    msg = repo.commit(res.commit_sha).message
    assert "Script: job/ds.json: the winning DeepSpeed keys merged in" in msg
    assert "launch.sh" in msg and "knobs.yaml" in " ".join(res.files)


def test_a_trainer_script_keeps_auto_and_gets_the_winning_arguments(tmp_path: Path) -> None:
    repo, job = script_repo(tmp_path, ("hf_trainer.py", "hf_ds.json", "hf_trainer.yaml"))
    changes = {"zero_stage": 1, "micro_batch_size": 2, "dtype": "bf16", "overlap_comm": True}
    d, ran = script_study(tmp_path, job / "hf_trainer.yaml", changes, hf_engine)
    apply(d, repo.working_tree_dir, branch="tuned")
    ds = json.loads(repo.git.show("tuned:job/hf_ds.json"))
    for key in (
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
    ):
        assert ds[key] == "auto"  # the Trainer fills them from the line's arguments
    assert ds["gradient_clipping"] == "auto" and ds["bf16"] == {"enabled": "auto"}
    zero = ds["zero_optimization"]
    assert zero["stage"] == 1 and zero["overlap_comm"] is True
    assert zero["reduce_bucket_size"] == ran["zero_optimization"]["reduce_bucket_size"]
    assert check_ran(ds, ran, trainer=True) == []
    sh = repo.git.show("tuned:infrarsi/study/launch.sh")
    exec_line = next(x for x in sh.splitlines() if x.startswith("exec "))
    line = parse_launch_line(
        shlex.join(shlex.split(exec_line)[1:-1])
    )  # as `init --script` reads it
    assert "export OMP_NUM_THREADS=1" in sh  # threads_per_worker at its baseline value
    assert (line.launcher, line.workers, line.script) == ("deepspeed", 2, "hf_trainer.py")
    assert arg_value(line.args, ("per_device_train_batch_size",)) == "2"
    assert arg_value(line.args, ("gradient_accumulation_steps",)) == "4"
    assert arg_value(line.args, ("bf16",)) == "true" and arg_value(line.args, ("deepspeed",)) == (
        "hf_ds.json"
    )
    assert arg_value(line.args, ("max_steps",)) == "1000"  # the user's other arguments kept
    assert line.args.index("--per_device_train_batch_size") == 2  # set in place, not appended
    msg = repo.commit(repo.heads.tuned.commit).message
    assert "--per_device_train_batch_size 2, --gradient_accumulation_steps 4, --bf16" in msg
    assert "--per_device_train_batch_size 2" in repo.git.show("tuned:infrarsi/study/README.md")


def test_a_config_changed_since_the_study_is_refused_and_no_branch_is_left(tmp_path: Path) -> None:
    repo, job = script_repo(tmp_path, ("ds_train.py", "ds.json", "ds_train.yaml"))
    d, _ = script_study(tmp_path, job / "ds_train.yaml", {"zero_stage": 1}, ds_engine)
    cfg = json.loads((job / "ds.json").read_text())
    (job / "ds.json").write_text(json.dumps({**cfg, "gradient_clipping": 0.5}))
    repo.git.add("job/ds.json")
    repo.index.commit("the user moved on")
    with pytest.raises(
        ApplyError, match=r"job/ds.json .* gradient_clipping: 0.5 here, 1.0 in the trial"
    ):
        apply(d, repo.working_tree_dir, branch="tuned")
    assert [h.name for h in repo.heads] == ["main"]


@pytest.mark.parametrize(
    ("args", "name", "value", "default", "want"),
    [
        (["--a", "1", "--mb", "4"], "mb", 2, None, ["--a", "1", "--mb", "2"]),
        (["--mb=4", "--a"], "mb", 2, None, ["--mb", "2", "--a"]),
        (["--a"], "mb", 2, None, ["--a", "--mb", "2"]),
        (["--bf16", "--a", "1"], "bf16", False, None, ["--a", "1"]),
        (["--a"], "bf16", False, True, ["--a", "--bf16", "false"]),
        (["--bf16", "false", "--a"], "bf16", True, None, ["--bf16", "--a"]),
        (
            ["--per-device-train-batch-size", "4"],
            "per_device_train_batch_size",
            2,
            None,
            ["--per-device-train-batch-size", "2"],
        ),
    ],
)
def test_set_option_sets_in_place_keeps_the_spelling_and_drops_a_false_flag(
    args: list[str], name: str, value: Any, default: Any, want: list[str]
) -> None:
    assert set_option(args, name, value, default) == want


@pytest.mark.integration
def test_the_trainer_reads_the_branch_into_the_winning_trials_engine_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers itself parses the branch's launch line and resolves its hf_ds.json: the
    micro-batch, accumulation, precision and ZeRO keys are the winning trial's (one process here:
    its train_batch_size is the trial's over the 2 ranks)."""
    transformers = pytest.importorskip("transformers")
    repo, job = script_repo(tmp_path, ("hf_trainer.py", "hf_ds.json", "hf_trainer.yaml"))
    changes = {"zero_stage": 1, "micro_batch_size": 2, "dtype": "bf16", "overlap_comm": True}
    d, ran = script_study(tmp_path, job / "hf_trainer.yaml", changes, hf_engine)
    apply(d, repo.working_tree_dir, branch="tuned")
    out = tmp_path / "checkout"
    repo.git.worktree("add", str(out), "tuned")
    sh = (out / "infrarsi/study/launch.sh").read_text()
    args = shlex.split(next(x for x in sh.splitlines() if x.startswith("exec ")))[5:-1]
    monkeypatch.chdir(out / "job")
    monkeypatch.syspath_prepend(str(out / "job"))
    try:
        hf_trainer = importlib.import_module("hf_trainer")  # the branch's copy
        parser = transformers.HfArgumentParser(
            (hf_trainer.ModelArguments, transformers.TrainingArguments)
        )
        _, targs = parser.parse_args_into_dataclasses([*args, "--use_cpu"])  # bf16 on CPU needs it
        hf = targs.hf_deepspeed_config
        hf.trainer_config_process(targs)
    finally:
        sys.modules.pop("hf_trainer", None)
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(
            reset_partial_state=True
        )  # the process-wide CPU state it made
    assert (targs.per_device_train_batch_size, targs.gradient_accumulation_steps) == (2, 4)
    for key in (
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "bf16",
        "gradient_clipping",
    ):
        assert hf.config[key] == ran[key]
    assert hf.config["zero_optimization"] == ran["zero_optimization"]
    assert hf.config["train_batch_size"] * 2 == ran["train_batch_size"]


def test_a_script_naming_no_config_file_gets_the_launch_line_and_a_pointer(tmp_path: Path) -> None:
    """A script that builds its DeepSpeed config in code: no file of its is edited; the README
    says where the winning keys are."""
    repo, job = script_repo(tmp_path, ("ds_train.py", "ds.json", "ds_train.yaml"))
    wl = (job / "ds_train.yaml").read_text().replace('"--deepspeed_config", "ds.json", ', "")
    (job / "ds_train.yaml").write_text(wl)
    repo.git.add("job")
    repo.index.commit("config in code")
    d, _ = script_study(tmp_path, job / "ds_train.yaml", {"zero_stage": 1}, ds_engine)
    res = apply(d, repo.working_tree_dir, branch="tuned")
    assert "job/ds.json" not in res.files and "infrarsi/study/launch.sh" in res.files
    readme = repo.git.show("tuned:infrarsi/study/README.md")
    assert "merge `deepspeed_config.json`'s keys where your script builds its config" in readme
    assert "no DeepSpeed config file on the line" in repo.heads.tuned.commit.message


@pytest.mark.parametrize(
    ("launcher", "workers", "nodes", "want"),
    [
        ("deepspeed", 2, 1, "deepspeed --num_gpus 2 train.py --x 'a b'"),
        ("deepspeed", 8, 2, "deepspeed --num_gpus 4 --num_nodes 2 train.py --x 'a b'"),
        ("torchrun", 4, 2, "torchrun --nproc_per_node 2 --nnodes 2 train.py --x 'a b'"),
        ("python", 1, 1, "python train.py --x 'a b'"),
    ],
)
def test_the_launch_command_gives_the_launcher_the_workloads_ranks(
    launcher: str, workers: int, nodes: int, want: str
) -> None:
    from infrarsi.stages.apply_script import launch_command
    from infrarsi.workload import Workload

    wl = Workload.from_dict(
        {
            "name": "s",
            "script": {"path": "train.py", "launcher": launcher},
            "tokens_per_step": 1024,
            "data": {"seq_len": 64},
            "resources": {"workers": workers, "nodes": nodes},
            "search_space": "x.yaml",
        }
    )
    assert launch_command(wl, ["--x", "a b"]) == want
    assert parse_launch_line(want).workers == workers  # `init --script` reads the same world back


WASTE = (
    "    for step in range(args.steps):\n",
    "    for step in range(args.steps):\n        time.sleep(0.15)  # a wait the team forgot\n",
)


@pytest.mark.integration
def test_an_agents_patch_to_the_script_is_run_verified_and_applied(tmp_path: Path) -> None:
    """The whole path on a user's script, through the CLI: init from the launch line (code
    patches may touch the script's folder), doctor, an agent's patch proposed (it removes a wait
    in the script's loop), run, verify, the long check (its checkpoint round trip resumes the
    patched script), apply. The branch holds the patched script and the winning ds.json; the
    patch verify measured is the one applied."""
    import os
    import subprocess

    from infrarsi.study.candidate import file_sha256

    repo, job = script_repo(tmp_path, ("ds_train.py", "ds.json"))
    script = job / "ds_train.py"
    text = script.read_text()
    assert WASTE[0] in text
    script.write_text(
        text.replace("import argparse\n", "import argparse\nimport time\n").replace(*WASTE)
    )
    repo.git.add("job")
    repo.index.commit("the team's script, with its wait")
    script.write_text(script.read_text().replace(WASTE[1], WASTE[0]))
    patch = tmp_path / "no_wait.diff"
    patch.write_text(repo.git.diff() + "\n")
    repo.git.checkout("--", "job/ds_train.py")

    exe = Path(sys.executable).parent / "infrarsi"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    study = tmp_path / "study"

    def cli(*args: str) -> str:
        out = subprocess.run(
            [str(exe), *args], capture_output=True, text=True, timeout=400, env=env, cwd=job
        )
        assert out.returncode == 0, (args, out.stdout[-3000:], out.stderr[-3000:])
        return out.stdout

    line = "deepspeed --num_gpus 2 ds_train.py --deepspeed --deepspeed_config ds.json --steps 1000"
    cli("init", "--script", line, "--study", str(study), "--bank", "off", "--no-analytic-prior")
    assert Contract.load(study).editable.globs == ["job/**"]
    cli("doctor", str(study), "--repeats", "2", "--no-honest-change")
    cli(
        "propose",
        str(study),
        "--config",
        "{}",
        "--patch",
        str(patch),
        "--why",
        "the wait does nothing",
    )
    cli("run", str(study), "--trials", "1", "--concurrency", "1")
    cli("verify", str(study), "--top-k", "1", "--pairs", "3", "--rounds", "2")
    verified = json.loads((study / "verify.json").read_text())
    best = verified["best"]
    assert best is not None and best["accepted"], verified
    assert [p["sha256"] for p in best["patches"]] == [file_sha256(patch)]
    cli("long-check", str(study), "--horizon-factor", "2", "--budget", "120s")
    long = json.loads((study / "long_check.json").read_text())
    assert long["status"] == "passed" and long["checkpoint"]["status"] == "passed", long
    cli("apply", str(study), "--repo", str(repo.working_tree_dir), "--branch", "tuned")
    tuned = repo.git.show("tuned:job/ds_train.py")
    assert "time.sleep(0.15)" not in tuned and "import time" in tuned  # the patch, applied
    assert "time.sleep(0.15)" in script.read_text()  # main untouched
    assert json.loads(repo.git.show("tuned:job/ds.json"))["train_batch_size"] == 16
