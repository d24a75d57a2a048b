"""The analytic prior of a data/tensor/pipeline-parallel transformer job (ZeRO, recomputation).

Textbook terms, each computed from nominal hardware figures and then rescaled by a fitted
coefficient (``priors.mean``):

- time: ideal compute (6N + 12Lhs FLOPs per token, Narayanan et al. 2021; full recomputation adds a
  forward pass, selective recomputation re-runs attention; without flash attention the attention
  part runs at half speed), one term per dtype (their ratio differs between GPUs and CPUs, see
  ``JobShape.bf16_speedup``); the efficiency lost by small GEMMs, to first order (a GEMM with
  ``r`` rows, the tokens of a micro-batch, and per-device width ``h / tp`` takes its ideal time
  times ``1 + r0 / r + w0 tp / h``; one term each, so their coefficients are fitted apart); a
  fixed cost per micro-batch and layer (kernel launches, layer-norms and other small kernels); tensor-
  parallel all-reduces (4 per layer and micro-batch); ZeRO gradient/parameter traffic (2 psi per
  step for stages 0-1, reduce-scatter per micro-batch for 2, 3 psi per micro-batch for 3, Rajbhandari
  et al. 2020), partly hidden by ``overlap_comm``; the optimizer step (memory bound) or its CPU
  offload; the pipeline bubble ((pp - 1) / micro-batches); a fixed cost.
- memory: ZeRO model states (2 + 2 + 12 bytes per parameter in mixed precision, partitioned by
  stage, optimizer states gone with offload); activations per Korthikanti et al. 2022 (34 sbh per
  layer, +5as^2b without flash attention or recomputation, 2sbh per layer with full recomputation
  plus one layer's working set; 1F1B keeps L layers' worth on the first stage); fp32 logits, which
  under pipeline parallelism live on the last stage (1 micro-batch of L/pp layers), so the term
  is what that stage holds above the first (the peak is the larger stage's); communication
  buckets (at their configured size); a fixed workspace.

Knobs are read by name (``infrarsi.knob_names``) with neutral defaults, so a space without ``tp``
or ``pp`` works; unknown
knobs are left to the GPs. This module never sees the true model of any backend.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from infrarsi import knob_names as kn
from infrarsi.datasheets import NOMINAL_GPU

TIME_TERMS = (
    "compute_bf16",
    "compute_fp32",
    "short_gemm",
    "narrow_gemm",
    "micro_batch_overhead",
    "tp_comm",
    "dp_comm",
    "optimizer",
    "offload",
    "pipeline_bubble",
    "fixed",
)
MEMORY_TERMS = ("model_states", "activations", "logits", "buffers", "fixed")


@dataclass(frozen=True)
class JobShape:
    """What the prior needs to know about the job and its hardware (nominal figures)."""

    n_layers: int
    """Transformer blocks L."""
    hidden: int
    """Hidden size h."""
    n_heads: int
    """Attention heads a."""
    vocab: int
    """Vocabulary size V."""
    num_params: float
    """Parameters N (all of them; for MoE the active ones drive compute, see ``active_params``)."""
    seq_len: int
    """Tokens per sequence s."""
    global_batch: int
    """Sequences per optimizer step."""
    world_size: int
    """Devices in the job."""
    devices_per_node: int = 8
    """Devices sharing the fast intra-node links."""
    peak_flops: float = NOMINAL_GPU.peak_flops
    """Nominal dense bf16 FLOP/s per device (the fp32 term starts at half of it)."""
    memory_bytes_per_s: float = NOMINAL_GPU.hbm_bytes_per_s
    """Nominal device memory bandwidth, bytes/s."""
    intra_bytes_per_s: float = NOMINAL_GPU.nvlink_bytes_per_s
    """Nominal intra-node collective bandwidth per device, bytes/s."""
    inter_bytes_per_s: float = NOMINAL_GPU.internode_bytes_per_s
    """Nominal inter-node bandwidth per device, bytes/s."""
    host_bytes_per_s: float = NOMINAL_GPU.pcie_bytes_per_s
    """Nominal host<->device bandwidth per device, bytes/s (offload)."""
    cpu_adam_params_per_s: float = 1.5e9
    """Nominal CPU Adam throughput per device's share of cores, parameters/s."""
    fixed_memory_bytes: float = 2.0e9
    """Nominal fixed memory per device (runtime context, allocator slack), bytes."""
    gemm_rows0: float = 512.0
    """GEMM rows (tokens per micro-batch) at which a GEMM takes twice its ideal time: the nominal
    ``r0`` of the first-order efficiency loss ``r0 / r`` (tiles and waves not filled)."""
    gemm_width0: float = 128.0
    """Per-device GEMM width (``hidden / tp``) at which a GEMM takes twice its ideal time: the
    nominal ``w0`` of the loss ``w0 tp / h`` (tensor parallelism narrows every layer's GEMMs)."""
    active_params: float = 0.0
    """Parameters active per token (MoE); 0 means ``num_params``."""
    default_dtype: str = "bf16"
    """dtype when the space has no ``dtype`` knob."""
    bf16_speedup: float = 2.0
    """Nominal speed of bf16 over fp32 compute: 2 on tensor-core GPUs (TF32 vs bf16 peaks); 1 on
    CPUs, where it ranges from far slower (AVX2, no bf16 units) to faster (AMX), so no gain is
    assumed until a bf16 trial has been measured."""


def _get(config: Mapping[str, Any], name: str, default: Any) -> Any:
    v = config.get(name, default)
    return default if v is None else v


class TransformerPrior:
    """``PriorMean`` of a transformer job (module docstring)."""

    kind: str = "transformer"
    time_names: tuple[str, ...] = TIME_TERMS
    memory_names: tuple[str, ...] = MEMORY_TERMS

    def __init__(self, shape: JobShape) -> None:
        self.shape = shape

    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self.shape)}

    @classmethod
    def from_spec(cls, raw: dict[str, Any]) -> TransformerPrior:
        fields = {k: v for k, v in raw.items() if k != "kind"}
        return cls(JobShape(**fields))

    def terms(self, configs: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        t = np.zeros((len(configs), len(TIME_TERMS)))
        m = np.zeros((len(configs), len(MEMORY_TERMS)))
        for i, c in enumerate(configs):
            t[i], m[i] = self._one(c)
        return t, m

    def _one(self, c: Mapping[str, Any]) -> tuple[list[float], list[float]]:
        j = self.shape
        zero = int(_get(c, kn.ZERO_STAGE, 0))
        mbs = max(1, int(_get(c, kn.MICRO_BATCH_SIZE, 1)))
        ckpt = str(_get(c, kn.ACTIVATION_CHECKPOINTING, "none"))
        tp = max(1, int(_get(c, kn.TP, 1)))
        pp = max(1, int(_get(c, kn.PP, 1)))
        dtype = str(_get(c, kn.DTYPE, j.default_dtype))
        offload = bool(_get(c, kn.OFFLOAD_OPTIMIZER, False)) and zero >= 1
        offload_param = bool(_get(c, kn.OFFLOAD_PARAM, False)) and zero == 3
        overlap = bool(_get(c, kn.OVERLAP_COMM, False)) and zero >= 1
        flash = bool(_get(c, kn.FLASH_ATTENTION, True))
        bucket = _get(c, kn.REDUCE_BUCKET_SIZE, "auto")
        s, h, L, a, V = j.seq_len, j.hidden, j.n_layers, j.n_heads, j.vocab
        ws = j.world_size
        dp = max(1, ws // (tp * pp))
        gas = max(1.0, j.global_batch / (dp * mbs))
        fp32 = dtype == "fp32"
        elem = 4 if fp32 else 2
        shard = j.num_params / (tp * pp)

        # ---- time (seconds per optimizer step, per device) ----
        n_act = j.active_params or j.num_params
        dense = 6.0 * n_act
        attn = 12.0 * L * h * s * (1.0 if flash else 2.0)
        if ckpt == "full":
            dense, attn = dense * 4 / 3, attn * 4 / 3
        elif ckpt == "selective":
            attn = attn * 4 / 3
        tokens = j.global_batch * s
        compute = tokens * (dense + attn) / (ws * j.peak_flops)
        compute_bf16, compute_fp32 = (0.0, j.bf16_speedup * compute) if fp32 else (compute, 0.0)
        ideal = compute_bf16 + compute_fp32
        short_gemm = ideal * j.gemm_rows0 / (mbs * s)
        narrow_gemm = ideal * j.gemm_width0 * tp / h
        mb_overhead = gas * (L / pp) * 1e-3
        tp_comm = 0.0
        if tp > 1:
            vol = gas * (L / pp) * 4 * 2 * (tp - 1) / tp * mbs * s * h * elem
            tp_comm = vol / j.intra_bytes_per_s * (1.5 if ckpt == "full" else 1.0)
        grad_bytes = shard * elem
        bw = j.intra_bytes_per_s if ws <= j.devices_per_node else j.inter_bytes_per_s
        r = (dp - 1) / dp
        if zero <= 1:
            per_step, per_mb = 2 * r * grad_bytes, 0.0
        elif zero == 2:
            per_step, per_mb = r * grad_bytes, r * grad_bytes
        else:
            per_step, per_mb = 0.0, (4 if ckpt == "full" else 3) * r * grad_bytes
        dp_comm = (per_step + gas * per_mb * (0.4 if overlap else 1.0)) / bw
        local = shard / (dp if zero >= 1 else 1)
        optimizer = 0.0 if offload else local * 32 / j.memory_bytes_per_s
        off = (
            local / j.cpu_adam_params_per_s + local * (elem + 2) / j.host_bytes_per_s
            if offload
            else 0.0
        )
        if offload_param:
            off += gas * 2 * shard * elem / dp / j.host_bytes_per_s
        bubble = (
            (pp - 1) / gas * (ideal + short_gemm + narrow_gemm + mb_overhead) if pp > 1 else 0.0
        )
        time = [
            compute_bf16,
            compute_fp32,
            short_gemm,
            narrow_gemm,
            mb_overhead,
            tp_comm,
            dp_comm,
            optimizer,
            off,
            bubble,
            0.02,
        ]

        # ---- memory (bytes per device) ----
        p_b, g_b, o_b = (4, 4, 8) if fp32 else (2, 2, 12)
        if offload:
            o_b = 0
        if zero == 0:
            states = shard * (p_b + g_b + o_b)
        elif zero == 1:
            states = shard * (p_b + g_b + o_b / dp)
        elif zero == 2:
            states = shard * (p_b + (g_b + o_b) / dp)
        else:
            states = (
                shard * ((0 if offload_param else p_b) + g_b + o_b) / dp
                + 2 * shard / (L / pp) * elem
            )
        f = elem / 2
        full_layer = s * mbs * h * (34 + (0 if flash else 5 * a * s / h)) / tp * f
        if ckpt == "full":
            stored, working = 2 * s * mbs * h / tp * f * L, full_layer
        elif ckpt == "selective":
            stored, working = s * mbs * h * 34 / tp * f * L, 0.0
        else:
            stored, working = full_layer * L, 0.0
        acts = stored + working
        logits = s * mbs * V * 6 / tp
        if pp > 1:  # the logits live on the last stage, which keeps 1/pp of the first's layers
            logits = max(0.0, logits - stored * (1 - 1 / pp))
        # ZeRO-1/2 allocate their gradient buckets at the configured size, however small the model
        # (a 5e7-element bucket OOMed a 5M-parameter job on CPU); "auto" is infrarsi's rule
        # (one bucket for the whole model, between 1e6 and 5e8 elements).
        elems = min(5e8, max(j.num_params, 1e6)) if bucket == "auto" else float(bucket)
        buffers = (
            elems * 4 * (2 if overlap else 1)
            if zero >= 1
            else (min(5e8, shard) * elem if dp > 1 else 0.0)
        )
        memory = [states, acts, logits, buffers, j.fixed_memory_bytes]
        return time, memory


def transformer_shape(
    *,
    n_layers: int,
    hidden: int,
    n_heads: int,
    vocab: int,
    seq_len: int,
    global_batch: int,
    world_size: int,
    num_params: float | None = None,
    ffn_hidden: int | None = None,
    **hardware: Any,
) -> JobShape:
    """A ``JobShape``; ``num_params`` defaults to the Llama-style count (SwiGLU, untied embeddings)."""
    if num_params is None:
        ffn = ffn_hidden or int(8 * hidden / 3)
        num_params = float(
            n_layers * (4 * hidden * hidden + 3 * hidden * ffn + 2 * hidden) + 2 * vocab * hidden
        )
    if not all(
        v > 0 for v in (n_layers, hidden, n_heads, vocab, seq_len, global_batch, world_size)
    ) or not math.isfinite(num_params):
        raise ValueError("transformer_shape: every size must be > 0")
    return JobShape(
        n_layers=n_layers,
        hidden=hidden,
        n_heads=n_heads,
        vocab=vocab,
        num_params=float(num_params),
        seq_len=seq_len,
        global_batch=global_batch,
        world_size=world_size,
        **hardware,
    )
