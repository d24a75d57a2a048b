"""What a rank sets up before its timed steps: where the model is built, the planned batches, the optimizer.

Shared by the entry-point loop (``rank_loop``) and the pieces of the script path that build a
reference model the same way.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn


def make_optimizer(impl: str, params: list[nn.Parameter], optim: Any) -> torch.optim.Optimizer:
    """The harness's torch AdamW (``adamw`` loop, ``adamw_foreach``, ``adamw_fused``)."""
    kw: dict[str, Any] = {
        "lr": optim.lr,
        "betas": tuple(optim.betas),
        "weight_decay": optim.weight_decay,
    }
    if impl == "adamw":
        kw["foreach"] = False
    elif impl == "adamw_foreach":
        kw["foreach"] = True
    elif impl == "adamw_fused":
        kw["fused"] = True
    return torch.optim.AdamW(params, **kw)


def build_context(
    device: str, ds_config: dict[str, Any], *, partitioned: bool = True
) -> contextlib.AbstractContextManager[Any]:
    """Where the trial's model is built: on the rank's own device (``torch.device``: the GPU on
    ``cuda``, so initialisation runs there and nothing passes through host memory), or, under
    ZeRO-3 when ``partitioned``, inside ``deepspeed.zero.Init`` with the trial's DeepSpeed config
    (each module's parameters are created on the device and partitioned over the ranks as soon
    as that module is built, so no rank ever holds the whole model). The model code must draw
    its weights inside each module's own ``__init__`` for both to start from the same values
    (see ``workloads/models/dense/model.py``)."""
    zero = ds_config.get("zero_optimization") or {}
    if partitioned and int(zero.get("stage", 0)) == 3:
        import deepspeed

        return deepspeed.zero.Init(config_dict_or_path=ds_config)  # type: ignore[no-any-return]
    if device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def plan_batches(
    source: Any,
    steps: int,
    global_batch_size: int,
    rank: int,
    world: int,
    micro_batch_size: int,
    device: torch.device | str,
) -> list[list[Any]]:
    """This rank's micro-batches of every training step, generated now (before the timed steps),
    in pinned host memory on ``cuda`` so the per-step copy to the device is asynchronous."""
    pin = torch.device(device).type == "cuda"
    out = []
    for step in range(steps):
        mbs = source.rank_micro_batches(step, global_batch_size, rank, world, micro_batch_size)
        if pin:
            mbs = [type(b)(b.inputs.pin_memory(), b.targets.pin_memory()) for b in mbs]
        out.append(mbs)
    return out
