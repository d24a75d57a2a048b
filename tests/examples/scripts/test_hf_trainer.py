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
def test_the_trainer_script_trains_through_deepspeed_and_a_cpu_pair_fails_naming_why(ray_local):
    """On one CPU rank the trial's micro-batch reaches the Trainer and DeepSpeed alike; on two CPU
    ranks accelerate runs each rank alone, and the trial fails saying so (GPUs: scripts/gpu_check.sh)."""
    pytest.importorskip(
        "accelerate", reason="the Trainer reaches DeepSpeed through accelerate (the hf extra)"
    )
    from infrarsi.execution.runner import TrialRunner

    pair = Workload.from_yaml(EXAMPLE / "hf_trainer.yaml")
    one = pair.model_copy(
        update={
            "resources": pair.resources.model_copy(update={"workers": 1}),
            "tokens_per_step": pair.tokens_per_step // 2,
        }
    )
    for wl, trial in ((one, "hf-1"), (pair, "hf-2")):
        runner = TrialRunner(wl, address=ray_local)
        try:
            res = runner.run({"zero_stage": 1, "micro_batch_size": 2}, trial_id=trial)
        finally:
            runner.close()
        if wl is one:
            assert res.status == "ok", (res.error or "")[-3000:]
            assert res.optimizer_steps == 5 and res.tokens_per_step == 512
            assert (
                res.extra.sequences_seen == [8] * 5
            )  # the Trainer fed micro-batches of 2, 4 times per step
            assert res.extra.ds_config["train_micro_batch_size_per_gpu"] == 2
        else:
            assert (
                res.status == "failed"
                and "the Trainer sees 1 process(es) where the trial has 2 ranks"
                in (res.error or "")
            )
