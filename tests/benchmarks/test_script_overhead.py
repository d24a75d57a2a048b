"""The script-overhead benchmark compares like with like: one model, data and config, two modes."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch

from benchmarks.script_overhead import CONFIG, workloads, write
from infrarsi.job import JobContext


def test_both_workloads_train_the_same_model_on_the_same_data(tmp_path: Path) -> None:
    wls = workloads(tmp_path, dim=32, layers=1, measured=5)
    script, entry = wls["script"], wls["entry"]
    assert script.script is not None and entry.model is not None
    assert (script.tokens_per_step, script.steps, script.resources) == (
        entry.tokens_per_step,
        entry.steps,
        entry.resources,
    )
    assert script.script.args[-4:] == ["--dim", "32", "--layers", "1"]
    sys.path.insert(0, str(tmp_path))
    try:
        job_mod = importlib.import_module("tiny_lm_job")
        ds_train = importlib.import_module("ds_train")
        ctx = JobContext(
            args=entry.model.args, options={}, device="cpu", rank=0, world_size=2, seq_len=64
        )
        job = job_mod.make_job(ctx)
        torch.manual_seed(0)
        mine = job.build_model()
        torch.manual_seed(0)
        theirs = ds_train.TinyLM(512, 32, 1, heads=4, seq_len=64)
        assert all(
            torch.equal(a, b) for a, b in zip(mine.parameters(), theirs.parameters(), strict=True)
        )
        x, _ = ds_train.global_batch(3, 16, 64, 512, 1234)
        assert torch.equal(job.global_batch(3, 16).inputs, x)
    finally:
        sys.path.remove(str(tmp_path))
        for m in ("tiny_lm_job", "ds_train"):
            sys.modules.pop(m, None)


def test_the_summary_names_the_command_each_round_and_the_verdict(tmp_path: Path) -> None:
    pair = {"entry": {"step_time_s": 0.05}, "script": {"step_time_s": 0.051}, "ratio": 1.02}
    result = {
        "config": CONFIG,
        "model": {"dim": 64, "layers": 2, "vocab": 512, "seq_len": 64},
        "tokens_per_step": 1024,
        "measured_steps": 20,
        "rounds": 1,
        "pairs": [{"round": 0, **pair}],
        "ratio_median": 1.02,
        "ratio_min": 1.02,
        "ratio_max": 1.02,
        "target_ratio": 1.05,
        "meets_target": True,
        "how_measured": "by test",
        "when": "now",
    }
    write(result, tmp_path)
    md = (tmp_path / "script_overhead.md").read_text()
    assert "--rounds 1 --measured 20 --dim 64 --layers 2" in md
    assert "| 0 | 0.0500 | 0.0510 | 1.020 |" in md and "target <= 1.05: met" in md
