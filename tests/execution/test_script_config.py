"""The script path's pure parts: the DeepSpeed config a script brings, the trial's knobs merged
into it, ``auto`` resolved, the launcher's argv, and the knobs a script cannot honour."""

from __future__ import annotations

import argparse
import json

import pytest

from infrarsi.errors import WorkloadError
from infrarsi.execution.knobs.deepspeed import auto_bucket_elements, build_trial
from infrarsi.execution.script_config import (
    merge_trial_config,
    pinned_knobs,
    resolve_auto,
    script_ds_config,
)
from infrarsi.execution.script_preflight import config_arg
from infrarsi.workload import Workload

SCRIPT_CFG = {
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
    "steps_per_print": 7,
    "zero_optimization": {
        "stage": 0,
        "contiguous_gradients": True,
        "offload_optimizer": {"device": "cpu"},
    },
    "fp16": {"enabled": True},
}


def _wl() -> Workload:
    return Workload.from_dict(
        {
            "name": "s",
            "model": {"family": "dense"},
            "tokens_per_step": 1024,
            "data": {"seq_len": 64},
            "search_space": "x.yaml",
        }
    )


def test_merge_takes_the_knobs_keys_and_keeps_the_scripts_own():
    config = {"zero_stage": 2, "micro_batch_size": 2, "dtype": "fp32", "overlap_comm": True}
    trial = build_trial(_wl(), config, 2, 1_000, 64).ds_config
    out = merge_trial_config(
        SCRIPT_CFG, trial, list(config), num_params=1_000, hidden_size=64, client_optimizer=True
    )
    assert (
        out["zero_optimization"]["stage"] == 2 and out["zero_optimization"]["overlap_comm"] is True
    )
    assert (
        "offload_optimizer" not in out["zero_optimization"]
    )  # the knob (off) owns it, not the script
    assert (
        out["zero_optimization"]["contiguous_gradients"] is True
    )  # the script's own ZeRO key stays
    assert (
        out["train_batch_size"],
        out["train_micro_batch_size_per_gpu"],
        out["gradient_accumulation_steps"],
    ) == (16, 2, 4)
    assert (
        out["gradient_clipping"] == 1.0 and out["steps_per_print"] == 7
    )  # not the harness's defaults
    assert "fp16" not in out and "bf16" not in out  # dtype knob fp32 owns the precision
    assert out["zero_allow_untested_optimizer"] is True
    assert SCRIPT_CFG["zero_optimization"]["stage"] == 0  # the script's dict is not modified


def test_without_the_dtype_knob_the_scripts_precision_stays():
    trial = build_trial(_wl(), {"zero_stage": 1}, 2, 1_000, 64).ds_config
    out = merge_trial_config(
        SCRIPT_CFG, trial, ["zero_stage"], num_params=1_000, hidden_size=64, client_optimizer=False
    )
    assert out["fp16"] == {"enabled": True}
    assert "zero_allow_untested_optimizer" not in out


def test_auto_is_resolved_or_named():
    cfg = {
        "zero_optimization": {
            "reduce_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
        },
        "bf16": {"enabled": "auto"},
    }
    out = resolve_auto(cfg, num_params=3_000_000, hidden_size=128)
    assert out["zero_optimization"]["reduce_bucket_size"] == auto_bucket_elements(3_000_000)
    assert out["zero_optimization"]["stage3_param_persistence_threshold"] == 1280
    assert out["bf16"]["enabled"] is False
    with pytest.raises(WorkloadError, match=r"'scheduler.params.warmup_num_steps' is 'auto'"):
        resolve_auto(
            {"scheduler": {"params": {"warmup_num_steps": "auto"}}}, num_params=1, hidden_size=1
        )


def test_script_config_from_args_file_or_dict(tmp_path):
    (tmp_path / "ds.json").write_text(json.dumps(SCRIPT_CFG))
    args = argparse.Namespace(deepspeed_config="ds.json")
    assert script_ds_config(args, None, None, cwd=tmp_path) == SCRIPT_CFG
    assert script_ds_config(None, {"a": 1}, None) == {"a": 1}
    assert script_ds_config(None, None, {"b": 2}) == {"b": 2}
    with pytest.raises(WorkloadError, match="both"):
        script_ds_config(args, {"a": 1}, None, cwd=tmp_path)
    with pytest.raises(WorkloadError, match="no DeepSpeed config"):
        script_ds_config(argparse.Namespace(deepspeed_config=None), None, None)
    with pytest.raises(WorkloadError, match="cannot be read as JSON"):
        script_ds_config(
            argparse.Namespace(deepspeed_config="missing.json"), None, None, cwd=tmp_path
        )


def test_config_arg():
    assert config_arg(["--deepspeed", "--deepspeed_config", "ds.json"]) == "ds.json"
    assert config_arg(["--deepspeed", "hf.json"]) == "hf.json"
    assert config_arg(["--deepspeed_config=a.json"]) == "a.json"
    assert config_arg(["--deepspeed"]) is None


def test_knobs_a_script_cannot_honour_are_named():
    pins = pinned_knobs(
        ["zero_stage", "activation_checkpointing", "micro_batch_size", "optimizer_impl"]
    )
    assert set(pins) == {"activation_checkpointing", "optimizer_impl"}
    assert "own model" in pins["activation_checkpointing"]
