"""The analytic prior of a workload: the model shape, batch and device that the prior's formulas need.

The analytic prior (``infrarsi.search.priors.transformer``) of a workload: its model shape, batch,
world size and nominal hardware figures.

- ``surrogate`` backend: the model and GPU kinds named by the workload (shapes and datasheet
  figures only; the prior's formulas are its own, it never calls the surrogate's model).
- ``deepspeed`` backend: the model flavour of ``workloads.models`` (dense or MoE), with nominal
  figures for the device kind (``cuda``: H100-class datasheet values; ``cpu``: rough figures for
  one core per rank). Nominal figures only set the starting point: each term's coefficient is
  refitted on the study's own trials.

``prior_for_workload`` returns None when the shape is unknown (the optimizer then runs without a
prior, as before) or when it is turned off: a study passes its contract's
``switches.analytic_prior``; other callers get ``$INFRARSI_PRIOR`` (on when unset), parsed by
``infrarsi.study.switches``.
"""

from __future__ import annotations

from typing import Any

from infrarsi.datasheets import GPUS, NOMINAL_GPU
from infrarsi.search.priors.transformer import TransformerPrior, transformer_shape
from infrarsi.structlog_config import get_logger
from infrarsi.study.switches import prior_from_environment
from infrarsi.workload import Workload

log = get_logger(__name__)

CPU_NOMINAL: dict[str, float] = {
    "peak_flops": 5e10,
    "memory_bytes_per_s": 1e10,
    "intra_bytes_per_s": 2e9,
    "inter_bytes_per_s": 1e9,
    "host_bytes_per_s": 1e10,
    "cpu_adam_params_per_s": 2e8,
    "fixed_memory_bytes": 8 * 2**20,
    "bf16_speedup": 1.0,
}
"""Rough per-rank figures of a CPU job (gloo over loopback, one core per rank). bf16 is assumed no
faster than fp32 (with 2, as on GPUs, the demo's first run tried bf16 four times on an AVX2 CPU
where it is ~70x slower and breaks the loss tolerance)."""
CUDA_NOMINAL: dict[str, float] = {
    "peak_flops": NOMINAL_GPU.peak_flops,
    "memory_bytes_per_s": NOMINAL_GPU.hbm_bytes_per_s,
    "intra_bytes_per_s": NOMINAL_GPU.nvlink_bytes_per_s,
    "inter_bytes_per_s": NOMINAL_GPU.internode_bytes_per_s,
    "host_bytes_per_s": NOMINAL_GPU.pcie_bytes_per_s,
    "cpu_adam_params_per_s": 1.5e9,
    "fixed_memory_bytes": 2e9,
}
"""The catalogue's nominal GPU (``infrarsi.datasheets``) plus the host-side figures of a cuda job."""


def prior_for_workload(wl: Workload, *, enabled: bool | None = None) -> TransformerPrior | None:
    """The workload's analytic prior, or None (unknown shape, or turned off). ``enabled``: the
    study's ``switches.analytic_prior``; None (no study) reads ``$INFRARSI_PRIOR``."""
    if not (prior_from_environment() if enabled is None else enabled):
        return None
    try:
        shape = _shape(wl)
    except Exception as e:  # an unknown flavour must not stop a study: run without the prior
        log.warning("prior.unavailable", workload=wl.name, error=str(e))
        return None
    return None if shape is None else TransformerPrior(shape)


def _model_args(wl: Workload) -> Any:
    """The workload's model architecture from the ``workloads`` package next to its YAML (the
    directory trials run their code from), importing it as the workers do."""
    import sys

    from infrarsi.execution.runner import default_code_dir

    code_dir = default_code_dir(wl)
    if code_dir not in sys.path:
        sys.path.insert(0, code_dir)
    from workloads.models import model_args

    m = wl.job_model()
    return model_args(str(m.family), m.size, m.overrides)


def _job_shape(wl: Workload) -> Any:
    """The prior's shape of a user job: its ``ModelShape``, and its parameters counted on a
    meta-device build (no memory, no weights) in this process."""
    import torch

    from infrarsi.execution.job_loader import load_job
    from infrarsi.execution.runner import default_code_dir
    from infrarsi.job import JobContext

    entry, args = wl.job_model().entry()
    ctx = JobContext(
        args=args,
        options={},
        device=wl.resources.device,
        rank=0,
        world_size=wl.world_size,
        seq_len=wl.data.seq_len,
        reference=True,
    )
    job = load_job(default_code_dir(wl), entry, ctx)
    with torch.device("meta"):
        n = float(sum(p.numel() for p in job.build_model().parameters()))
    s = job.shape
    active = n
    if s.num_experts:
        expert = s.n_layers * s.num_experts * 3 * s.dim * s.expert_hidden
        active = n - expert + expert * s.top_k / s.num_experts
    hw: dict[str, Any] = dict(CUDA_NOMINAL if wl.resources.device == "cuda" else CPU_NOMINAL)
    return transformer_shape(
        n_layers=s.n_layers,
        hidden=s.dim,
        n_heads=s.n_heads or max(1, s.dim // 128),
        vocab=s.vocab_size,
        seq_len=wl.data.seq_len,
        global_batch=max(1, wl.tokens_per_step // wl.data.seq_len),
        world_size=wl.world_size,
        num_params=n,
        active_params=active,
        devices_per_node=max(1, wl.world_size // wl.resources.nodes),
        **hw,
    )


def _shape(wl: Workload) -> Any:
    if wl.script is not None:  # a script's model is known only once it runs: no prior yet
        return None
    seq = wl.data.seq_len
    batch = max(1, wl.tokens_per_step // seq)
    if wl.backend == "surrogate":
        from infrarsi.execution.surrogate.model import MODELS

        m = MODELS[str(wl.surrogate.get("model", wl.job_model().size))]
        g = GPUS[str(wl.surrogate.get("gpu", "h100_sxm"))]
        hw: dict[str, Any] = {
            **CUDA_NOMINAL,
            "peak_flops": g.peak_flops,
            "memory_bytes_per_s": g.hbm_bytes_per_s,
            "intra_bytes_per_s": g.nvlink_bytes_per_s,
            "inter_bytes_per_s": g.internode_bytes_per_s,
            "host_bytes_per_s": g.pcie_bytes_per_s,
        }
        return transformer_shape(
            n_layers=m.n_layers,
            hidden=m.hidden,
            n_heads=m.n_heads,
            vocab=m.vocab,
            seq_len=seq,
            global_batch=batch,
            world_size=wl.world_size,
            num_params=m.num_params,
            devices_per_node=int(wl.surrogate.get("gpus_per_node", 8)),
            **hw,
        )
    if wl.job_model().entry_point is not None:
        return _job_shape(wl)
    a = _model_args(wl)
    kv = a.n_kv_heads or a.n_heads
    attn = 2 * a.dim * a.dim + 2 * a.dim * (a.dim * kv // a.n_heads)
    if a.num_experts:
        ffn, active_ffn = (
            a.num_experts * 3 * a.dim * a.expert_hidden,
            a.top_k * 3 * a.dim * a.expert_hidden,
        )
    else:
        ffn = active_ffn = 3 * a.dim * a.ffn_hidden
    emb = 2 * a.vocab_size * a.dim
    n = a.n_layers * (attn + ffn + 2 * a.dim) + emb
    active = a.n_layers * (attn + active_ffn + 2 * a.dim) + emb
    hw2: dict[str, Any] = dict(CUDA_NOMINAL if wl.resources.device == "cuda" else CPU_NOMINAL)
    per_node = max(1, wl.world_size // wl.resources.nodes)
    return transformer_shape(
        n_layers=a.n_layers,
        hidden=a.dim,
        n_heads=a.n_heads,
        vocab=a.vocab_size,
        seq_len=seq,
        global_batch=batch,
        world_size=wl.world_size,
        num_params=float(n),
        active_params=float(active),
        devices_per_node=per_node,
        default_dtype="fp32" if wl.resources.device == "cpu" else "bf16",
        **hw2,
    )
