"""A user's own DeepSpeed script, unchanged, tuned through the real stack: 2 CPU ranks (gloo),
real Ray actors, real DeepSpeed (``examples/scripts/ds_train.py``).

- the example workload gives an ``ok`` row whose step times, tokens, optimizer steps and loss per
  step were taken by the harness through ``deepspeed.initialize``;
- two configs (ZeRO 1 / micro-batch 1 vs ZeRO 2 / micro-batch 2, fixed tokens per step) really
  change the engine the script got (the script reports its engine) and train the same losses;
- a script that crashes, exits, or never builds an engine ends ``failed`` with its own
  traceback, never a hang;
- the long check's checkpoint round trip: the script saved at step S, launched again, resumed
  from the checkpoint on the same data, trains the same losses; a script whose data order does
  not resume (a fresh random seed per launch) is caught, with the step where the data parted.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from infrarsi.execution.runner import TrialRunner
from infrarsi.workload import Workload

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "scripts"
STEPS = 1 + 4  # the example's warm-up + measured steps


def _tmp_workload(tmp: Path, args: list[str], script: str = "ds_train.py") -> Workload:
    """A copy of the example (its own folder: the script lies inside it) with other args."""
    tmp.mkdir(parents=True, exist_ok=True)
    for f in ("ds_train.py", "ds.json"):
        shutil.copy(EXAMPLE / f, tmp / f)
    d = yaml.safe_load((EXAMPLE / "ds_train.yaml").read_text())
    d["search_space"] = str(ROOT / "search_spaces" / "deepspeed_dense.yaml")
    d["script"]["path"] = script
    d["script"]["args"] = args
    p = tmp / "wl.yaml"
    p.write_text(yaml.safe_dump(d))
    return Workload.from_yaml(p)


@pytest.fixture
def example_runner(ray_local) -> Iterator[TrialRunner]:
    """The example's runner, closed after the test (its group holds both CPUs of the test Ray)."""
    runner = TrialRunner(Workload.from_yaml(EXAMPLE / "ds_train.yaml"), address=ray_local)
    yield runner
    runner.close()


def test_the_example_script_gives_an_ok_row_measured_by_the_harness(example_runner):
    res = example_runner.run({"zero_stage": 0, "micro_batch_size": 8}, trial_id="script-base")
    assert res.status == "ok", res.error[-3000:]
    assert len(res.step_time_samples_s) == 4 and res.step_time_s is not None and res.step_time_s > 0
    assert res.tokens_per_step == 1024 and res.optimizer_steps == STEPS
    assert res.extra.sequences_seen == [16] * STEPS
    assert len(res.loss) == STEPS and all(3.0 < x < 8.0 for x in res.loss)  # ~log(512) at the start
    assert res.extra.param_checksums_agree is True
    assert res.extra.ds_config["gradient_clipping"] == 1.0  # the script's own key kept
    assert res.peak_memory_bytes is not None and res.peak_memory_bytes > 0
    # the warm group runs the next trial: the harness's process group and patches survived
    again = example_runner.run({"zero_stage": 0, "micro_batch_size": 8}, trial_id="script-again")
    assert again.status == "ok", again.error[-3000:]
    assert again.loss == res.loss and again.extra.warm is True


def test_two_configs_change_the_engine_the_script_got(ray_local, tmp_path):
    report = tmp_path / "engine"
    wl = _tmp_workload(
        tmp_path / "job",
        [
            "--deepspeed",
            "--deepspeed_config",
            "ds.json",
            "--steps",
            "100",
            "--report_engine",
            str(report),
        ],
    )
    got = {}
    with TrialRunner(wl, address=ray_local) as runner:
        for name, cfg in {
            "z1_m1": {"zero_stage": 1, "micro_batch_size": 1},
            "z2_m2": {"zero_stage": 2, "micro_batch_size": 2},
        }.items():
            res = runner.run(cfg, trial_id=f"script-{name}")
            assert res.status == "ok", (name, res.error[-3000:])
            engines = [json.loads(Path(f"{report}.{r}.json").read_text()) for r in (0, 1)]
            got[name] = (res, engines)
        trip_row = runner.run(
            {"zero_stage": 1, "micro_batch_size": 2}, trial_id="trip", steps=6, checkpoint_step=3
        )
    trip = trip_row.extra.checkpoint_round_trip or {}
    assert trip_row.status == "ok" and trip["step"] == 3 and not trip["error"], trip
    assert max(abs(x - y) for x, y in zip(trip["loss"], trip_row.loss[3:], strict=True)) < 1e-6
    assert trip["checkpoint_bytes"] > 0
    (r1, e1), (r2, e2) = got["z1_m1"], got["z2_m2"]
    assert all(
        e
        == {
            "zero_stage": 1,
            "micro_batch_size": 1,
            "gradient_accumulation_steps": 8,
            "train_batch_size": 16,
        }
        for e in e1
    ), e1
    assert all(
        e
        == {
            "zero_stage": 2,
            "micro_batch_size": 2,
            "gradient_accumulation_steps": 4,
            "train_batch_size": 16,
        }
        for e in e2
    ), e2
    assert r1.extra.micro_batch_size == 1 and r2.extra.grad_accum_steps == 4
    for r in (r1, r2):
        assert r.tokens_per_step == 1024 and r.optimizer_steps == STEPS
    assert max(abs(a - b) for a, b in zip(r1.loss, r2.loss, strict=True)) < 1e-5, (r1.loss, r2.loss)
    # the same sequences in the same steps, split otherwise: the same per-step data digests
    assert (
        r1.extra.data_digests == r2.extra.data_digests and len(r1.extra.data_digests or []) == STEPS
    )


def test_a_crash_an_exit_and_no_engine_are_failed_rows_with_the_scripts_traceback(
    ray_local, tmp_path
):
    crash = _tmp_workload(
        tmp_path / "crash", ["--deepspeed", "--deepspeed_config", "ds.json", "--crash_at_step", "2"]
    )
    with TrialRunner(crash, address=ray_local) as runner:
        res = runner.run({"zero_stage": 0, "micro_batch_size": 8}, trial_id="script-crash")
    assert res.status == "failed"
    assert (
        "deliberate crash at step 2" in res.error
        and "ds_train.py" in res.error
        and "Traceback" in res.error
    )
    assert res.step_time_s is None

    exits = _tmp_workload(
        tmp_path / "exit", ["--deepspeed", "--deepspeed_config", "ds.json", "--exit_at_step", "1"]
    )
    with TrialRunner(exits, address=ray_local) as runner:
        res = runner.run({"zero_stage": 0, "micro_batch_size": 8}, trial_id="script-exit")
        assert res.status == "failed" and "SystemExit code 3" in res.error, res.error[-2000:]
        noinit = tmp_path / "exit" / "no_engine.py"
        noinit.write_text("import sys\nprint('training without DeepSpeed', sys.argv)\n")
    plain = _tmp_workload(tmp_path / "exit", ["--x"], script="no_engine.py")
    with TrialRunner(plain, address=ray_local) as runner:
        res = runner.run({"zero_stage": 0, "micro_batch_size": 8}, trial_id="script-noinit")
    assert res.status == "failed" and "without calling deepspeed.initialize" in res.error, (
        res.error[-2000:]
    )


def test_infrarsi_tune_runs_the_example_script_end_to_end(tmp_path):
    """The whole CLI on the unchanged script: init (the pinned knobs), doctor, run, verify,
    report; every trial row is the harness's own measurement of the script."""
    import os
    import subprocess
    import sys

    from infrarsi.study.trial_log import read_trials

    study = tmp_path / "study"
    exe = Path(sys.executable).parent / "infrarsi"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(
        [
            str(exe),
            "tune",
            str(EXAMPLE / "ds_train.yaml"),
            "--study",
            str(study),
            "--trials",
            "3",
            "--top-k",
            "1",
            "--no-long-check",
            "--bank",
            "off",
            "--no-analytic-prior",
            "--concurrency",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    rows = read_trials(study).to_pylist()
    stages = {r["stage"] for r in rows}
    assert {"doctor", "run", "verify"} <= stages, stages
    # a candidate whose loss leaves the doctor's tolerance (bf16, ZeRO-3 reductions) is stopped by the
    # loss guard through the tap: invariant_violation, a legitimate outcome; nothing fails or hangs
    assert all(r["status"] in ("ok", "invariant_violation") for r in rows), [
        (r["trial_id"], r["status"], r["error"][-500:]) for r in rows
    ]
    ok = [r for r in rows if r["status"] == "ok"]
    assert all(r["status"] == "ok" for r in rows if r["stage"] in ("doctor", "verify")) and ok
    assert all(r["tokens_per_step"] == 1024 and r["optimizer_steps"] == STEPS for r in ok)
    assert (study / "report.md").exists() and (study / "verify.json").exists()
    editable = yaml.safe_load((study / "contract.yaml").read_text())["editable"]["knobs"]
    assert (
        "zero_stage" in editable
        and "activation_checkpointing" not in editable
        and "optimizer_impl" not in editable
    )


def test_a_script_whose_data_does_not_resume_fails_the_round_trip(ray_local, tmp_path):
    wl = _tmp_workload(
        tmp_path / "job",
        ["--deepspeed", "--deepspeed_config", "ds.json", "--steps", "100", "--data_seed", "-1"],
    )
    with TrialRunner(wl, address=ray_local) as runner:
        res = runner.run({"micro_batch_size": 2}, trial_id="trip", steps=5, checkpoint_step=2)
    trip = res.extra.checkpoint_round_trip or {}
    assert res.status == "ok", res.error[-3000:]  # the uninterrupted run was measured in full
    assert "was fed other tokens at step 2" in trip["error"], trip


SCRIPT_CHEATS = {
    # half of every sequence fed: faster, and the tap counts the tokens the model really saw
    "fewer_tokens": (
        "        inputs, targets = inputs[mine].to(engine.device), targets[mine].to(engine.device)\n",
        "        inputs, targets = inputs[mine].to(engine.device), targets[mine].to(engine.device)\n"
        "        inputs, targets = inputs[:, : args.seq_len // 2], targets[:, : args.seq_len // 2]\n",
        "tokens",
    ),
    # the optimizer never really steps: the tap counts the steps the torch optimizer took
    "skip_optimizer_steps": (
        "    engine, _, _, _ = deepspeed.initialize(",
        "    optimizer.step = lambda closure=None: None\n    engine, _, _, _ = deepspeed.initialize(",
        "optimizer",
    ),
}


def test_a_cheating_script_is_an_invariant_violation_that_names_it(ray_local, tmp_path):
    """The harness measures a script itself: a script changed to feed fewer tokens, or to skip its
    optimizer's steps, still ends ``ok`` as a run, and the contract's invariants name the cheat."""
    from infrarsi.stages.init import init_stage
    from infrarsi.study.contract import Contract
    from infrarsi.study.invariants import check_invariants

    args = ["--deepspeed", "--deepspeed_config", "ds.json", "--steps", "100"]
    job = tmp_path / "job"
    wl = _tmp_workload(job, args)
    init_stage(job / "wl.yaml", tmp_path / "study", bank="off")
    contract = Contract.load(tmp_path / "study")
    honest = (job / "ds_train.py").read_text()
    rows = {}
    with TrialRunner(wl, address=ray_local) as runner:
        rows["honest"] = runner.run({"micro_batch_size": 4}, trial_id="honest")
        for name, (old, new, _) in SCRIPT_CHEATS.items():
            assert old in honest
            (job / "ds_train.py").write_text(honest.replace(old, new))
            rows[name] = runner.run({"micro_batch_size": 4}, trial_id=name)
    ref = rows.pop("honest")
    assert ref.status == "ok" and check_invariants(ref, ref, contract) == (True, [])
    for name, row in rows.items():
        assert row.status == "ok", (name, row.error[-2000:])
        ok, reasons = check_invariants(row, ref, contract)
        assert not ok and SCRIPT_CHEATS[name][2] in " ".join(reasons).lower(), (name, reasons)
