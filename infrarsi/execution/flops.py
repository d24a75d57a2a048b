"""Model FLOPs per token, measured peak FLOP/s, and MFU.

FLOPs per token (Narayanan et al. 2021, "Efficient large-scale language model training on GPU
clusters", eq. 3, without the recomputation term): ``6 * N_active + 12 * n_layers * dim * seq``,
where ``N_active`` counts every matmul parameter a token passes through (all non-embedding
parameters plus the output projection; for an MoE only ``top_k / num_experts`` of the expert
parameters) and the second term is attention's score and value matmuls (forward + backward).

Peak FLOP/s per device: on CPU a probe (achieved FLOP/s of a large fp32 matmul with the rank's
thread count); on GPU a table of dense bf16 peaks by device name, falling back to a bf16 matmul
probe. ``MFU = flops_per_token * tokens_per_s / (world_size * peak_flops_per_s)``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from infrarsi.datasheets import DENSE_BF16_PEAK_BY_DEVICE_NAME

GPU_PEAK_BF16_FLOPS = DENSE_BF16_PEAK_BY_DEVICE_NAME
"""Dense bf16 tensor-core peak by substring of ``torch.cuda.get_device_name()`` (the catalogue's)."""


def active_params(args: Any, num_params: int) -> int:
    """Matmul parameters a token passes through: everything but the input embedding, and for
    an MoE only ``top_k / num_experts`` of the expert weights."""
    n = num_params - args.vocab_size * args.dim  # input embedding is a lookup, not a matmul
    if getattr(args, "num_experts", 0):
        expert = args.n_layers * args.num_experts * 3 * args.dim * args.expert_hidden
        n -= expert - expert * args.top_k // args.num_experts
    return int(n)


def flops_per_token(args: Any, num_params: int, seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token of a model with architecture ``args``."""
    return float(6 * active_params(args, num_params) + 12 * args.n_layers * args.dim * seq_len)


def cpu_matmul_peak_flops(threads: int | None = None, n: int = 1024, reps: int = 5) -> float:
    """Best achieved fp32 FLOP/s of an ``n x n`` matmul with ``threads`` intra-op threads."""
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t)
        return 2.0 * n**3 / best
    finally:
        torch.set_num_threads(old)


def gpu_peak_flops(n: int = 8192, reps: int = 5) -> float:
    """Table value for a known GPU, else a bf16 matmul probe."""
    name = torch.cuda.get_device_name()
    for key, val in GPU_PEAK_BF16_FLOPS.items():
        if key in name:
            return val
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    torch.mm(a, b)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        torch.mm(a, b)
    end.record()
    torch.cuda.synchronize()
    return 2.0 * n**3 * reps / (start.elapsed_time(end) / 1000.0)


def peak_flops_per_s(device: str, threads: int | None = None) -> float:
    """Peak FLOP/s of one device of kind ``device`` (``cpu`` probes with ``threads``)."""
    return gpu_peak_flops() if device == "cuda" else cpu_matmul_peak_flops(threads)


def mfu(
    flops_per_token_: float, tokens_per_s: float, world_size: int, peak_per_device: float
) -> float:
    """Model FLOPs utilisation in [0, 1] (can exceed 1 only if the peak was under-measured)."""
    if peak_per_device <= 0 or world_size <= 0:
        raise ValueError(f"peak ({peak_per_device}) and world_size ({world_size}) must be > 0")
    return flops_per_token_ * tokens_per_s / (world_size * peak_per_device)
