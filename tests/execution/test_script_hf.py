"""A Trainer script's trial: its ``TrainingArguments`` get the trial's batch, accumulation, precision
and checkpointing before transformers reads them, and the DeepSpeed config handed to it carries the
same numbers, so transformers' ``auto`` matching finds no mismatch (the autotuner's failure,
transformers#27830, was a Trainer batch that disagreed with DeepSpeed's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from infrarsi.errors import WorkloadError
from infrarsi.execution.script_hf import (
    TrainerOverrides,
    apply_to_args,
    check_world,
    patched_post_init,
    trainer_ds_config,
    trainer_overrides,
)

TRIAL_DS = {
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
}
"""A trial's batch keys (``build_trial``): global batch 16 over 2 ranks at micro-batch 4."""

SCRIPT_DS = {
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": "auto",
    "bf16": {"enabled": "auto"},
    "gradient_clipping": "auto",
    "zero_optimization": {"stage": 2},
}
"""A Trainer script's ds.json: numbers for the batch it ships, ``auto`` elsewhere."""


@dataclass
class StandInArgs:
    """The ``TrainingArguments`` fields the override touches (transformers needs accelerate to build the
    real class, which this venv lacks); ``__post_init__`` records what transformers' would read."""

    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    bf16: bool = False
    fp16: bool = False
    gradient_checkpointing: bool = False
    auto_find_batch_size: bool = False
    deepspeed: Any = None
    seen: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.seen = {
            "mbs": self.per_device_train_batch_size,
            "gas": self.gradient_accumulation_steps,
            "bf16": self.bf16,
            "deepspeed": self.deepspeed,
        }


def hf_mismatches(cfg: dict[str, Any], args: StandInArgs, world: int) -> list[str]:
    """The comparisons transformers' ``HfTrainerDeepSpeedConfig.trainer_config_process`` makes
    (transformers 5.25, integrations/deepspeed.py: ``fill_match`` of the batch keys and precision):
    a number that is not ``auto`` and differs from the argument is a mismatch."""
    pairs = [
        (
            "train_micro_batch_size_per_gpu",
            cfg.get("train_micro_batch_size_per_gpu"),
            args.per_device_train_batch_size,
        ),
        (
            "gradient_accumulation_steps",
            cfg.get("gradient_accumulation_steps"),
            args.gradient_accumulation_steps,
        ),
        (
            "train_batch_size",
            cfg.get("train_batch_size"),
            world * args.per_device_train_batch_size * args.gradient_accumulation_steps,
        ),
        ("bf16.enabled", (cfg.get("bf16") or {}).get("enabled"), args.bf16),
        ("fp16.enabled", (cfg.get("fp16") or {}).get("enabled"), args.fp16),
    ]
    return [k for k, ds, hf in pairs if ds not in (None, "auto") and ds != hf]


def test_the_trials_batch_precision_and_checkpointing_become_trainer_fields():
    ov = trainer_overrides(
        TRIAL_DS, {"micro_batch_size": 4, "dtype": "bf16", "activation_checkpointing": "full"}, 2
    )
    assert ov == TrainerOverrides(4, 2, 2, bf16=True, gradient_checkpointing=True)
    ov = trainer_overrides(TRIAL_DS, {"micro_batch_size": 4}, 2)
    assert (
        ov.bf16 is None and ov.gradient_checkpointing is None
    )  # knobs the space lacks: the script's own
    with pytest.raises(WorkloadError, match=r"'selective'.*only 'none' and 'full' reach it"):
        trainer_overrides(TRIAL_DS, {"activation_checkpointing": "selective"}, 2)


def test_trainer_and_deepspeed_agree_where_a_late_merge_would_not():
    ov = trainer_overrides(TRIAL_DS, {"micro_batch_size": 4, "dtype": "bf16"}, 2)
    args = StandInArgs(
        per_device_train_batch_size=8, auto_find_batch_size=True, deepspeed="ds.json"
    )
    assert hf_mismatches(
        {**SCRIPT_DS, **TRIAL_DS}, args, 2
    )  # only DeepSpeed told: the Trainer feeds 8s
    apply_to_args(args, ov, lambda value: dict(SCRIPT_DS) if value == "ds.json" else {})
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps, args.bf16) == (
        4,
        2,
        True,
    )
    assert args.auto_find_batch_size is False and args.fp16 is False
    assert hf_mismatches(args.deepspeed, args, 2) == []
    assert args.deepspeed["gradient_clipping"] == "auto" and args.deepspeed[
        "zero_optimization"
    ] == {"stage": 2}
    cfg = trainer_ds_config(
        {"fp16": {"enabled": True, "loss_scale": 0}}, TrainerOverrides(4, 2, 2, bf16=False)
    )
    assert cfg["fp16"] == {"enabled": False, "loss_scale": 0} and cfg["bf16"] == {"enabled": False}


def test_post_init_sees_the_trials_fields_inside_the_block_only():
    ov = TrainerOverrides(2, 4, 2, bf16=False, gradient_checkpointing=False)
    with patched_post_init(StandInArgs, lambda: ov, lambda value: dict(SCRIPT_DS)):
        args = StandInArgs(per_device_train_batch_size=8, bf16=True, deepspeed="ds.json")
    assert args.seen["mbs"] == 2 and args.seen["gas"] == 4 and args.seen["bf16"] is False
    assert (
        args.seen["deepspeed"]["train_batch_size"] == 16
        and hf_mismatches(args.deepspeed, args, 2) == []
    )
    assert StandInArgs(per_device_train_batch_size=8).seen["mbs"] == 8  # restored
    with (
        pytest.raises(WorkloadError, match="no __post_init__"),
        patched_post_init(TrainerOverrides, lambda: ov, dict),
    ):
        pass


def test_a_trainer_that_counts_other_processes_than_the_trial_fails_naming_the_fix():
    check_world(2, 2)
    check_world(None, 2)  # an arguments object with no world_size: nothing to compare
    with pytest.raises(
        WorkloadError,
        match=r"sees 1 process\(es\) where the trial has 2 ranks.*resources.workers: 1",
    ):
        check_world(1, 2)
