"""A synthetic memory-cliff problem over search_spaces/deepspeed_dense.yaml (for tests only).

Step time and peak memory follow the rough shape of a ZeRO job on 8 devices: larger micro-batches
and no checkpointing are faster but hungrier, bf16 is faster and smaller, ZeRO stages and
offloading save memory and cost communication. The capacity cuts the fastest corner off.
``SyntheticPrior`` is a rough analytic prior of it (registered as kind ``synthetic_test``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from infrarsi.search.priors.registry import PRIORS
from infrarsi.search.settings import OptimizerSettings

ROOT = Path(__file__).resolve().parents[2]
DENSE = ROOT / "search_spaces" / "deepspeed_dense.yaml"
GB = 1e9
CAPACITY = 24 * GB
CHEAP = OptimizerSettings(
    time_gp_iters=(15, 6, 3),
    memory_gp_iters=(15, 6, 3),
    prior_fit_iters=10,
    design_pool=64,
    batch_choices=16,
    pair_source_scan=16,
    n_init=3,
)
"""Few L-BFGS iterations and small pools: tests that exercise code paths, not the fit."""


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
    act = (
        2.2
        * GB
        * c["micro_batch_size"]
        * {"none": 1.0, "selective": 0.45, "full": 0.12}[c["activation_checkpointing"]]
    )
    act *= 0.55 if c["dtype"] == "bf16" else 1.0
    bucket = (
        {"auto": 0.3, 500000: 0.05, 5000000: 0.2, 50000000: 1.2}[c["reduce_bucket_size"]] * GB
        if z >= 1
        else 0.0
    )
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


def dense_optimizer(settings: OptimizerSettings | None = None) -> Any:
    """An optimizer over ``DENSE`` with the synthetic prior, seed 0 and ``BASELINE``."""
    from infrarsi.search import Optimizer, SearchSpace

    return Optimizer(
        SearchSpace.from_yaml(DENSE),
        memory_capacity=CAPACITY,
        seed=0,
        baseline=BASELINE,
        prior=SyntheticPrior(),
        settings=settings,
    )


TINY = """
name: tiny
knobs:
  - name: stage
    type: choice
    values: [0, 1, 2]
    memory: saver
  - name: mbs
    type: int
    values: [1, 2, 4, 8]
    memory: hungry
  - name: ckpt
    type: bool
    memory: saver
"""
"""A three-knob space for the optimizer's unit tests (``tiny_run`` is its truth)."""
TINY_CAP = 10.0


def tiny_run(c: dict[str, Any]):
    from infrarsi.search import Outcome

    mem = (6.0 - 2.0 * c["stage"]) + c["mbs"] * (0.4 if c["ckpt"] else 1.2)
    if mem > TINY_CAP:
        return Outcome(status="oom")
    t = (1.0 + 1.5 / c["mbs"]) * (1.3 if c["ckpt"] else 1.0) * (1.0 + 0.15 * c["stage"])
    return Outcome(status="ok", step_time=t, peak_memory=mem)


BASELINE = {
    "zero_stage": 3,
    "micro_batch_size": 1,
    "activation_checkpointing": "full",
    "dtype": "fp32",
}


class SyntheticPrior:
    """A rough prior of ``search_synthetic``: model states and activations, without its buckets,
    with activation sizes off by a factor (so the fitted coefficients have work to do)."""

    kind = "synthetic_test"
    time_names = ("compute", "comm", "offload")
    memory_names = ("states", "activations", "fixed")

    def terms(self, configs: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        T, M = [], []
        for c in configs:
            p = 1.5e9
            pb = 2 if c["dtype"] == "bf16" else 4
            z = c["zero_stage"]
            states = p * pb * (1 / 8 if z >= 3 else 1) + p * pb * (1 / 8 if z >= 2 else 1)
            states += 0 if c["offload_optimizer"] else p * 12 / (8 if z >= 1 else 1)
            act = (
                1.0
                * GB
                * c["micro_batch_size"]
                * {"none": 1.0, "selective": 0.5, "full": 0.1}[c["activation_checkpointing"]]
            )
            M.append([states, act, 1.0 * GB])
            T.append(
                [
                    10.0 * (1 + 1 / c["micro_batch_size"]),
                    1.0 * (z > 0),
                    4.0 * c["offload_optimizer"],
                ]
            )
        return np.array(T), np.array(M)

    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind}


PRIORS["synthetic_test"] = lambda raw: SyntheticPrior()


def synthetic_source(cfgs: list[dict[str, Any]], times: list[float], name: str = "src") -> Any:
    """A bank ``SourceStudy`` of this problem: ``cfgs`` measured at ``times`` seconds, their peaks
    as ``memory_bytes`` says, on a card of ``CAPACITY``, with ``SyntheticPrior`` as its prior."""
    from infrarsi.search.transfer import SourceStudy

    return SourceStudy(
        name=name,
        similarity=1.0,
        configs=tuple(cfgs),
        source_configs=tuple(cfgs),
        step_times_s=tuple(times),
        peak_memory_bytes=tuple(memory_bytes(c) for c in cfgs),
        memory_censored=tuple(False for _ in cfgs),
        memory_capacity_bytes=CAPACITY,
        prior=SyntheticPrior(),
    )
