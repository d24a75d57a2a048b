"""Tiny stand-in rank entries for testing the group/pool logic (not the training itself).

Workers import this module as ``standins`` because tests pass this folder as the trial's
``code_dir`` (the worker puts it on ``sys.path``).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist


def _result(spec: dict[str, Any], status: str = "ok", error: str = "") -> dict[str, Any]:
    rank = dist.get_rank()
    steps = spec["workload"]["steps"]
    n = steps["warmup"] + steps["measured"]
    times, losses = [], []
    for step in range(n):
        t0 = time.perf_counter()
        x = torch.tensor([float(rank + step)])
        dist.all_reduce(x)
        times.append(time.perf_counter() - t0)
        losses.append(float(x.item()))
    return {
        "rank": rank,
        "status": status,
        "error": error,
        "step_times_s": times,
        "warmup_steps": steps["warmup"],
        "phase_times_s": {},
        "loss": losses,
        "eval_loss": None,
        "tokens_seen": [spec["workload"]["tokens_per_step"]] * n,
        "optimizer_steps": n,
        "peak_memory_bytes": 1000 * (rank + 1),
        "memory_censored": status == "oom",
        "memory_measure": "standin",
        "setup_time_s": 0.0,
        "param_checksum": 1.0,
        "flops_per_token": 6.0,
        "num_params": 1,
        "telemetry": {},
        "pid": os.getpid(),
    }


def allreduce(spec: dict[str, Any]) -> dict[str, Any]:
    """Every rank all-reduces once per step; rank 1 reports oom when the trial id says so."""
    if "oom" in spec["trial_id"] and dist.get_rank() == 1:
        return _result(spec, "oom", "stand-in: over capacity")
    return _result(spec)


def hang(spec: dict[str, Any]) -> dict[str, Any]:
    """Rank 1 sleeps forever; rank 0 waits for it in a collective."""
    if dist.get_rank() == 1:
        while True:
            time.sleep(1)
    x = torch.ones(1)
    dist.all_reduce(x)
    return _result(spec)


def boom(spec: dict[str, Any]) -> dict[str, Any]:
    """Rank 0 raises; rank 1 returns ok."""
    if dist.get_rank() == 0:
        raise RuntimeError("stand-in exploded")
    return {"rank": 1, "status": "ok", "step_times_s": [], "warmup_steps": 0}


def skip_collective(spec: dict[str, Any]) -> dict[str, Any]:
    """Rank 1 skips the all-reduce and returns ok at once; rank 0 waits in it for ever."""
    if dist.get_rank() == 1:
        return {
            "rank": 1,
            "status": "ok",
            "error": "",
            "step_times_s": [],
            "warmup_steps": 0,
            "pid": os.getpid(),
        }
    x = torch.ones(1)
    dist.all_reduce(x)
    return _result(spec)
