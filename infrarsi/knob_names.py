"""The names of the built-in knobs, declared once for every layer that reads a config by name.

The knob handlers (``infrarsi.execution.knobs``) register under these names, and the pure core
(``infrarsi.search.priors``) and the surrogate model read configs with them, so a rename is one
edit and a typo is a ``NameError`` rather than a silent default. The module imports nothing: the
core may use it without reaching the Ray side.
"""

from __future__ import annotations

ZERO_STAGE = "zero_stage"
"""ZeRO stage 0-3."""
MICRO_BATCH_SIZE = "micro_batch_size"
"""Sequences per rank per forward."""
ACTIVATION_CHECKPOINTING = "activation_checkpointing"
"""Recomputation: none, selective or full."""
DTYPE = "dtype"
"""Compute dtype: fp32 or bf16."""
OFFLOAD_OPTIMIZER = "offload_optimizer"
"""ZeRO-Offload of the optimizer state to CPU."""
OFFLOAD_PARAM = "offload_param"
"""ZeRO-3 parameter offload to CPU."""
OVERLAP_COMM = "overlap_comm"
"""Overlap of gradient reduction with backward."""
REDUCE_BUCKET_SIZE = "reduce_bucket_size"
"""Elements per gradient-reduction bucket, or auto."""
ALLGATHER_BUCKET_SIZE = "allgather_bucket_size"
"""Elements per ZeRO-1/2 parameter all-gather bucket, or auto."""
OPTIMIZER_IMPL = "optimizer_impl"
"""Implementation of the harness's AdamW."""
THREADS_PER_WORKER = "threads_per_worker"
"""Intra-op CPU threads per rank."""
EXPERT_PARALLEL = "expert_parallel"
"""MoE expert parallelism over all ranks."""
CODE_PATCH = "code_patch"
"""A code patch (or patch set) the trial runs with."""
LOSS_CHUNK_TOKENS = "loss_chunk_tokens"
"""Tokens per chunk of the harness's cross-entropy."""
FUSED_LOSS_TOKENS = "fused_loss_tokens"
"""Tokens per chunk of the fused output projection and cross-entropy (the logits never whole)."""
ATTENTION_BACKEND = "attention_backend"
"""The kernel scaled-dot-product attention runs: auto, flash, efficient, cudnn or math."""
FLOAT8_LINEAR = "float8_linear"
"""The large linear layers' matmuls in float8 (another arithmetic: allowed by name only)."""
TP = "tp"
"""Tensor-parallel degree (surrogate only)."""
PP = "pp"
"""Pipeline-parallel degree (surrogate only)."""
FLASH_ATTENTION = "flash_attention"
"""Flash attention on or off (surrogate only)."""

BUILTIN_KNOBS = (
    ZERO_STAGE,
    MICRO_BATCH_SIZE,
    ACTIVATION_CHECKPOINTING,
    DTYPE,
    OFFLOAD_OPTIMIZER,
    OFFLOAD_PARAM,
    OVERLAP_COMM,
    REDUCE_BUCKET_SIZE,
    ALLGATHER_BUCKET_SIZE,
    OPTIMIZER_IMPL,
    THREADS_PER_WORKER,
    EXPERT_PARALLEL,
    CODE_PATCH,
    LOSS_CHUNK_TOKENS,
    FUSED_LOSS_TOKENS,
    ATTENTION_BACKEND,
    FLOAT8_LINEAR,
    TP,
    PP,
    FLASH_ATTENTION,
)
"""Every name above, each registered by exactly one handler once ``infrarsi.execution.knobs`` and
the surrogate backend are imported."""

__all__ = [
    "ACTIVATION_CHECKPOINTING",
    "ALLGATHER_BUCKET_SIZE",
    "ATTENTION_BACKEND",
    "BUILTIN_KNOBS",
    "CODE_PATCH",
    "DTYPE",
    "EXPERT_PARALLEL",
    "FLASH_ATTENTION",
    "FLOAT8_LINEAR",
    "FUSED_LOSS_TOKENS",
    "LOSS_CHUNK_TOKENS",
    "MICRO_BATCH_SIZE",
    "OFFLOAD_OPTIMIZER",
    "OFFLOAD_PARAM",
    "OPTIMIZER_IMPL",
    "OVERLAP_COMM",
    "PP",
    "REDUCE_BUCKET_SIZE",
    "THREADS_PER_WORKER",
    "TP",
    "ZERO_STAGE",
]
