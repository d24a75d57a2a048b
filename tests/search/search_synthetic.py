"""A synthetic memory-cliff problem over search_spaces/deepspeed_dense.yaml (for tests only).

Step time and peak memory follow the rough shape of a ZeRO job on 8 devices: larger micro-batches
and no checkpointing are faster but hungrier, bf16 is faster and smaller, ZeRO stages and
offloading save memory and cost communication. The capacity cuts the fastest corner off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DENSE = ROOT / "search_spaces" / "deepspeed_dense.yaml"
GB = 1e9
CAPACITY = 24 * GB


def memory_bytes(c: dict[str, Any]) -> float:
    n = 8
    params = 1.5e9
    p_bytes = 2 if c["dtype"] == "bf16" else 4
    weights, grads, optim = params * p_bytes, params * p_bytes, params * 12
    z = c["zero_stage"]
    if z >= 1:
        optim /= n
    if z >= 2:
        grads /= n
    if z >= 3:
        weights /= n
    if c["offload_optimizer"]:
        optim = 0.0
    if c["offload_param"]:
        weights = 0.0
    act = 2.2 * GB * c["micro_batch_size"] * {"none": 1.0, "selective": 0.45, "full": 0.12}[c["activation_checkpointing"]]
    act *= 0.55 if c["dtype"] == "bf16" else 1.0
    bucket = {"auto": 0.3, 500000: 0.05, 5000000: 0.2, 50000000: 1.2}[c["reduce_bucket_size"]] * GB if z >= 1 else 0.0
    return weights + grads + optim + act + bucket + 1.0 * GB


def step_time_s(c: dict[str, Any]) -> float:
    mbs = c["micro_batch_size"]
    t = 10.0 * (1 + 0.9 / mbs)
    t *= {"none": 1.0, "selective": 1.12, "full": 1.38}[c["activation_checkpointing"]]
    t *= 0.62 if c["dtype"] == "bf16" else 1.0
    z = c["zero_stage"]
    comm = {0: 0.0, 1: 0.4, 2: 0.6, 3: 2.5}[z] * (1 + 2.0 / mbs)
    if z >= 1 and c["overlap_comm"]:
        comm *= 0.5
    if z >= 1:
        comm *= {"auto": 1.0, 500000: 1.6, 5000000: 1.1, 50000000: 0.95}[c["reduce_bucket_size"]]
    t += comm
    if c["offload_optimizer"]:
        t += 4.0
    if c["offload_param"]:
        t += 6.0
    t *= {"adamw": 1.0, "adamw_foreach": 0.98, "adamw_fused": 0.97}[c["optimizer_impl"]]
    t *= 1.0 if c["threads_per_worker"] == 1 else 1.04
    return t


def run(c: dict[str, Any]):
    from infrarsi.search import Outcome

    mem = memory_bytes(c)
    if mem > CAPACITY:
        return Outcome(status="oom")
    return Outcome(status="ok", step_time=step_time_s(c), peak_memory=mem)


BASELINE = {"zero_stage": 3, "micro_batch_size": 1, "activation_checkpointing": "full", "dtype": "fp32"}
