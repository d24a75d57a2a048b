"""A Hugging Face ``Trainer`` script's trial: the knobs reach ``TrainingArguments``, so Trainer and DeepSpeed agree.

A ``Trainer`` script (``--deepspeed ds.json`` handed to ``TrainingArguments``) reaches DeepSpeed
through accelerate: ``TrainingArguments.__post_init__`` reads the DeepSpeed config into
``HfTrainerDeepSpeedConfig`` and fills its ``"auto"`` values from the arguments
(``trainer_config_process``: ``train_micro_batch_size_per_gpu`` <- ``per_device_train_batch_size``,
``gradient_accumulation_steps``, ``train_batch_size`` = world x both, ``bf16.enabled`` <-
``bf16``...), a number that differs from the argument is a mismatch error, and the Trainer's own
data loader and accumulation loop run from the arguments, not from the DeepSpeed config. Merging
the trial's keys only at ``deepspeed.initialize`` would leave the Trainer feeding its old batch to
an engine built for another: the DeepSpeed autotuner's known failure (it overwrote
``per_device_train_batch_size`` and broke gradient accumulation, transformers#27830,
accelerate#1830).

So, while a Trainer script runs as a trial, ``patched_post_init`` wraps
``TrainingArguments.__post_init__``: before transformers reads anything, ``apply_to_args`` sets
the trial's ``per_device_train_batch_size`` and ``gradient_accumulation_steps`` (the contract's
tokens per step split by ``micro_batch_size``), ``bf16``/``fp16`` (the ``dtype`` knob),
``gradient_checkpointing`` (``activation_checkpointing``: ``none`` off, ``full`` on; ``selective``
has no Trainer equivalent and fails the trial naming why), turns ``auto_find_batch_size`` off (it
changes the batch on its own), and hands ``deepspeed`` the script's config with the same numbers
in its batch and precision keys (``trainer_ds_config``); every other ``"auto"`` stays for
transformers to resolve as it always does. The ZeRO keys are merged later, at
``deepspeed.initialize`` (``script_config.merge_trial_config``), where the model is known.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from infrarsi.errors import WorkloadError


@dataclass(frozen=True)
class TrainerOverrides:
    """The ``TrainingArguments`` fields a trial sets (None: the script's own value stays)."""

    per_device_train_batch_size: int
    """Sequences per rank per forward: the trial's micro-batch."""
    gradient_accumulation_steps: int
    """Micro-batches per optimizer step: the contract's global batch / (micro-batch x world)."""
    world_size: int
    """Ranks: DeepSpeed's ``train_batch_size`` = world x micro-batch x accumulation."""
    bf16: bool | None = None
    """``dtype`` knob: bf16 on (fp16 off) or off; None when the space has no ``dtype`` knob."""
    gradient_checkpointing: bool | None = None
    """``activation_checkpointing`` knob: ``full`` on, ``none`` off; None when the space has none."""
    ddp_backend: str | None = None
    """The process group's backend, set where accelerate would find none (``gloo`` on a machine
    without an accelerator: accelerate then joins the ranks instead of running each alone);
    None: the script's own value stays."""


def trainer_overrides(
    trial_ds: dict[str, Any],
    config: dict[str, Any],
    world_size: int,
    *,
    ddp_backend: str | None = None,
) -> TrainerOverrides:
    """The overrides of a trial: ``trial_ds`` is its DeepSpeed config (``build_trial(...).ds_config``:
    the batch keys), ``config`` its knob values. ``WorkloadError`` for a value a Trainer cannot take."""
    ckpt = config.get("activation_checkpointing")
    if ckpt not in (None, "none", "full"):
        raise WorkloadError(
            f"script: knob 'activation_checkpointing'={ckpt!r}: rule: a Trainer script turns gradient "
            f"checkpointing on or off for the whole model (TrainingArguments.gradient_checkpointing), so only "
            f"'none' and 'full' reach it. Fix: pin the knob (init pins it for scripts) or search [none, full]"
        )
    dtype = config.get("dtype")
    return TrainerOverrides(
        per_device_train_batch_size=int(trial_ds["train_micro_batch_size_per_gpu"]),
        gradient_accumulation_steps=int(trial_ds["gradient_accumulation_steps"]),
        world_size=int(world_size),
        bf16=None if dtype is None else dtype == "bf16",
        gradient_checkpointing=None if ckpt is None else ckpt == "full",
        ddp_backend=ddp_backend,
    )


def trainer_ds_config(script_cfg: dict[str, Any], ov: TrainerOverrides) -> dict[str, Any]:
    """The script's DeepSpeed config with the trial's numbers in the keys transformers matches
    against ``TrainingArguments`` (batch keys; ``bf16``/``fp16`` ``enabled`` when the trial sets the
    precision), so ``trainer_config_process`` finds no mismatch; other keys as the script has them."""
    out = copy.deepcopy(script_cfg)
    out["train_micro_batch_size_per_gpu"] = ov.per_device_train_batch_size
    out["gradient_accumulation_steps"] = ov.gradient_accumulation_steps
    out["train_batch_size"] = (
        ov.per_device_train_batch_size * ov.gradient_accumulation_steps * ov.world_size
    )
    if ov.bf16 is not None:
        out["bf16"] = {**(out.get("bf16") or {}), "enabled": ov.bf16}
        if "fp16" in out or ov.bf16:
            out["fp16"] = {**(out.get("fp16") or {}), "enabled": False}
    return out


def apply_to_args(
    args: Any, ov: TrainerOverrides, read_config: Callable[[Any], dict[str, Any]]
) -> None:
    """Set the trial's fields on a ``TrainingArguments`` before its ``__post_init__`` runs;
    ``read_config`` reads the script's ``deepspeed`` value (a path or a dict) as a dict."""
    args.per_device_train_batch_size = ov.per_device_train_batch_size
    args.gradient_accumulation_steps = ov.gradient_accumulation_steps
    if getattr(args, "auto_find_batch_size", False):
        args.auto_find_batch_size = False
    if ov.bf16 is not None:
        args.bf16 = ov.bf16
        if ov.bf16 or getattr(args, "fp16", False):
            args.fp16 = False
    if ov.gradient_checkpointing is not None:
        args.gradient_checkpointing = ov.gradient_checkpointing
    if ov.ddp_backend is not None:
        join_ranks(args, ov.ddp_backend)
    if getattr(args, "deepspeed", None):
        args.deepspeed = trainer_ds_config(read_config(args.deepspeed), ov)


def join_ranks(args: Any, backend: str) -> None:
    """Make accelerate join the trial's ranks where it finds no accelerator (a CPU machine).

    With a DeepSpeed config, ``TrainingArguments`` builds accelerate's ``PartialState`` without a
    backend, and on a machine without an accelerator accelerate then runs each rank alone. So the
    state is built here first, for DeepSpeed, on the harness's process group (``backend``), and
    the arguments are told to use it (``accelerator_config.use_configured_state``); the trial's
    cleanup resets it (``reset_accelerate``)."""
    import os

    try:
        from accelerate.state import PartialState
    except ImportError as e:
        raise WorkloadError(
            f"script: a Trainer script reaches DeepSpeed through accelerate, which cannot be imported "
            f"here ({e}). Fix: pip install 'infrarsi[hf]'"
        ) from None

    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    PartialState(backend=backend)
    ac = getattr(args, "accelerator_config", None)
    if ac is None:
        args.accelerator_config = {"use_configured_state": True}
    elif isinstance(ac, dict):
        args.accelerator_config = {**ac, "use_configured_state": True}
    elif hasattr(ac, "use_configured_state"):
        ac.use_configured_state = True
    else:  # a JSON file's path: read as transformers does, then flagged
        import json

        with open(str(ac)) as f:
            args.accelerator_config = {**json.load(f), "use_configured_state": True}


def reset_accelerate() -> None:
    """Forget accelerate's process-wide state (a warm worker's next trial starts clean)."""
    import os
    import sys

    state = sys.modules.get("accelerate.state")
    if state is not None:
        state.AcceleratorState._reset_state(reset_partial_state=True)
    os.environ.pop("ACCELERATE_USE_DEEPSPEED", None)


def check_world(trainer_world: Any, ranks: int) -> None:
    """``WorkloadError`` unless the Trainer counts as many processes as the trial has ranks.

    Left alone, accelerate (the Trainer's way into DeepSpeed) runs each rank as a lone process on
    a machine without an accelerator (``DistributedType.NO``; ``join_ranks`` prevents it), so the
    Trainer would size its batch for 1 rank and DeepSpeed for all of them (transformers then fails
    on the mismatch of ``train_batch_size``, far from the cause)."""
    if isinstance(trainer_world, int) and trainer_world != ranks:
        raise WorkloadError(
            f"script: the Trainer sees {trainer_world} process(es) where the trial has {ranks} ranks: rule: "
            f"a Trainer script's ranks must form one accelerate group (the harness joins them, also on "
            f"CPUs); something in the script set up accelerate's state its own way. Fix: let "
            f"TrainingArguments build it (no PartialState or Accelerator made before it), or run on "
            f"one rank (resources.workers: 1)"
        )


@contextlib.contextmanager
def patched_post_init(
    cls: Any,
    overrides: Callable[[], TrainerOverrides],
    read_config: Callable[[Any], dict[str, Any]],
) -> Iterator[None]:
    """``cls.__post_init__`` (``TrainingArguments``) runs ``apply_to_args`` first, inside the
    block; restored after it. ``overrides`` is called per construction (the trial's values)."""
    real = cls.__dict__.get("__post_init__")
    if real is None:
        raise WorkloadError(
            f"script: {cls.__name__} has no __post_init__ to reach; this transformers version is "
            f"not supported for Trainer scripts"
        )

    @functools.wraps(real)
    def post_init(self: Any, *a: Any, **k: Any) -> Any:
        ov = overrides()
        apply_to_args(self, ov, read_config)
        out = real(self, *a, **k)
        check_world(getattr(self, "world_size", ov.world_size), ov.world_size)
        return out

    cls.__post_init__ = post_init
    try:
        yield
    finally:
        cls.__post_init__ = real


__all__ = [
    "TrainerOverrides",
    "apply_to_args",
    "check_world",
    "join_ranks",
    "patched_post_init",
    "reset_accelerate",
    "trainer_ds_config",
    "trainer_overrides",
]
