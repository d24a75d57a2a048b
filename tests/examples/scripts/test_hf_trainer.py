"""The Hugging Face Trainer example: its launch line gives its workload through ``init --script``,
and (where accelerate is installed: the Trainer's way into DeepSpeed) its trials run on 2 CPU ranks
with the trial's micro-batch reaching the Trainer."""

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
def test_the_trainer_script_trains_on_two_cpu_ranks_and_two_configs_train_alike(ray_local):
    """Two CPU ranks (accelerate, which finds no accelerator here, is handed the harness's gloo
    group): the trial's micro-batch reaches the Trainer and DeepSpeed alike, the replicas agree,
    and another split of the same batch (a warm group's next trial) trains the same losses. The
    long check's checkpoint round trip resumes the Trainer script from its step-3 checkpoint on
    the same data and the same losses (accelerate steps the engine once per optimizer step)."""
    pytest.importorskip(
        "accelerate", reason="the Trainer reaches DeepSpeed through accelerate (the hf extra)"
    )
    from infrarsi.execution.runner import TrialRunner

    wl = Workload.from_yaml(EXAMPLE / "hf_trainer.yaml")
    with TrialRunner(wl, address=ray_local) as runner:
        a = runner.run({"zero_stage": 1, "micro_batch_size": 2}, trial_id="hf-a")
        b = runner.run({"zero_stage": 0, "micro_batch_size": 4}, trial_id="hf-b")
        c = runner.run({"micro_batch_size": 4}, trial_id="hf-c", steps=6, checkpoint_step=3)
    for res in (a, b):
        assert res.status == "ok", (res.error or "")[-3000:]
        assert res.optimizer_steps == 5 and res.tokens_per_step == 1024
        assert res.extra.sequences_seen == [16] * 5 and res.extra.param_checksums_agree is True
    assert a.extra.ds_config["train_micro_batch_size_per_gpu"] == 2
    assert b.extra.ds_config["train_micro_batch_size_per_gpu"] == 4 and b.extra.warm is True
    assert max(abs(x - y) for x, y in zip(a.loss, b.loss, strict=True)) < 1e-5
    trip = c.extra.checkpoint_round_trip or {}
    assert c.status == "ok" and not trip["error"] and not trip["skipped"], trip
    assert max(abs(x - y) for x, y in zip(trip["loss"], c.loss[3:], strict=True)) < 1e-6
