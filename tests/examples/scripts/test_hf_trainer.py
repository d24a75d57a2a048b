"""The Hugging Face Trainer example: its launch line gives its workload through ``init --script``,
and (where accelerate is installed: the Trainer's way into DeepSpeed) one trial of it runs on 2 CPU
ranks with the trial's micro-batch reaching the Trainer."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from infrarsi.execution.script_source import read_script
from infrarsi.stages.init_script import parse_launch_line, script_workload
from infrarsi.workload import Workload

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "scripts"


def _line() -> str:
    wl = yaml.safe_load((EXAMPLE / "hf_trainer.yaml").read_text())
    return "deepspeed --num_gpus 2 hf_trainer.py " + " ".join(wl["script"]["args"])


def test_the_launch_line_gives_the_examples_workload(tmp_path):
    assert read_script(EXAMPLE / "hf_trainer.py").kind == "hf_trainer"
    for f in ("hf_trainer.py", "hf_ds.json"):
        shutil.copy(EXAMPLE / f, tmp_path / f)
    sw = script_workload(parse_launch_line(_line()), cwd=tmp_path)
    hand = Workload.from_yaml(EXAMPLE / "hf_trainer.yaml")
    assert sw.kind == "hf_trainer" and sw.workload["script"] == hand.script.model_dump()
    assert (
        sw.workload["tokens_per_step"] == hand.tokens_per_step
        and sw.workload["data"]["seq_len"] == 64
    )
    assert {k: sw.workload["baseline"][k] for k in hand.baseline} == hand.baseline


@pytest.mark.integration
def test_one_trial_of_the_trainer_script_runs_on_two_cpu_ranks(ray_local):
    pytest.importorskip(
        "accelerate", reason="the Trainer reaches DeepSpeed through accelerate, not installed here"
    )
    from infrarsi.execution.runner import TrialRunner

    runner = TrialRunner(Workload.from_yaml(EXAMPLE / "hf_trainer.yaml"), address=ray_local)
    try:
        res = runner.run({"zero_stage": 1, "micro_batch_size": 2}, trial_id="hf-1")
    finally:
        runner.close()
    assert res.status == "ok", res.error[-3000:]
    assert res.optimizer_steps == 5 and res.tokens_per_step == 1024
    assert (
        res.extra["sequences_seen"] == [16] * 5
    )  # the Trainer fed micro-batches of 2, 4 times per step
    assert res.extra["ds_config"]["train_micro_batch_size_per_gpu"] == 2
