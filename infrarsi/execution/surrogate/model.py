"""The analytic model behind the ``surrogate`` backend: step time and peak memory of a large GPU job.

The analytic model behind the ``surrogate`` backend: step time and peak memory of a large
GPU training job (Llama-style dense transformer, DeepSpeed ZeRO + Megatron-style TP/PP).

Pure and noiseless: ``evaluate(problem, config)`` is a deterministic function of its inputs.
Noise, stragglers and crashes are added by ``infrarsi.execution.surrogate.backend``.

Sources of the formulas:
- FLOPs: Narayanan et al. 2021 ("Efficient large-scale language model training on GPU clusters
  using Megatron-LM"): 6N per token for the dense weights plus 12*L*h*s per token for attention
  scores; full recomputation adds one more forward pass (a third of the model FLOPs).
- Model states: Rajbhandari et al. 2020 (ZeRO): 2 (bf16 params) + 2 (bf16 grads) + 12 (fp32
  master, momentum, variance) bytes per parameter, partitioned over data parallel by stage.
- Activations: Korthikanti et al. 2022 ("Reducing activation recomputation"): s*b*h*(34 +
  5*a*s/h) bytes per layer, divided by tp (sequence parallel on); selective recomputation or
  flash attention drop the 5*a*s/h term; full recomputation keeps 2*s*b*h per layer plus one
  layer's working set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from infrarsi import knob_names as kn
from infrarsi.datasheets import GPUS, GpuSpec
from infrarsi.errors import WorkloadError


@dataclass(frozen=True)
class ModelShape:
    """Shape of a Llama-style dense transformer."""

    n_layers: int
    """Transformer blocks L."""
    hidden: int
    """Hidden size h."""
    n_heads: int
    """Attention heads a."""
    ffn_hidden: int
    """SwiGLU inner size."""
    vocab: int
    """Vocabulary size V."""
    n_kv_heads: int = 0
    """Key/value heads (grouped-query attention); 0 means ``n_heads``."""

    @property
    def num_params(self) -> float:
        h, kv = self.hidden, (self.n_kv_heads or self.n_heads)
        attn = h * h * 2 + 2 * h * (h * kv // self.n_heads)
        mlp = 3 * h * self.ffn_hidden
        return float(self.n_layers * (attn + mlp + 2 * h) + 2 * self.vocab * h + h)


MODELS: dict[str, ModelShape] = {
    "1b": ModelShape(16, 2048, 32, 8192, 128256, 8),
    "8b": ModelShape(32, 4096, 32, 14336, 128256, 8),
    "13b": ModelShape(40, 5120, 40, 13824, 32000, 40),
}
"""Known dense flavours; a workload's ``model.size`` (or ``surrogate.model``) picks one."""


@dataclass(frozen=True)
class Problem:
    """Everything fixed about the simulated job (the contract side)."""

    gpu: GpuSpec
    """Accelerator kind."""
    model: ModelShape
    """Transformer shape."""
    world_size: int
    """Total devices."""
    gpus_per_node: int
    """Devices per node (NVLink domain)."""
    global_batch: int
    """Sequences per optimizer step."""
    seq_len: int
    """Tokens per sequence."""
    memory_capacity_bytes: int
    """Capacity per device; a config above it runs out of memory."""
    setup_s: float = 45.0
    """Engine build time before the first step, seconds."""

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.world_size / self.gpus_per_node))

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len


@dataclass
class Evaluation:
    """Noiseless outcome of one config."""

    step_time_s: float
    """Seconds per optimizer step."""
    peak_memory_bytes: float
    """Peak per device, bytes."""
    fits: bool
    """peak_memory_bytes <= capacity."""
    valid: bool
    """The config is runnable at all (divisibility); invalid configs fail at launch."""
    mfu: float
    """Model FLOPs utilisation."""
    phase_times_s: dict[str, float] = field(default_factory=dict)
    """Per-step seconds per phase (forward, backward, recompute, optimizer, communication, bubble)."""
    memory_parts_bytes: dict[str, float] = field(default_factory=dict)
    """Peak memory split (model_states, activations incl. logits, buffers, workspace)."""
    reason: str = ""
    """Why the config is invalid (empty when valid)."""


def _get(config: dict[str, Any], name: str, default: Any) -> Any:
    value = config.get(name, default)
    return default if value is None else value


def evaluate(problem: Problem, config: dict[str, Any]) -> Evaluation:
    """Noiseless step time and peak memory of ``config`` on ``problem``."""
    m, g = problem.model, problem.gpu
    zero = int(_get(config, kn.ZERO_STAGE, 0))
    mbs = int(_get(config, kn.MICRO_BATCH_SIZE, 1))
    ckpt = str(_get(config, kn.ACTIVATION_CHECKPOINTING, "none"))
    tp = int(_get(config, kn.TP, 1))
    pp = int(_get(config, kn.PP, 1))
    offload = bool(_get(config, kn.OFFLOAD_OPTIMIZER, False)) and zero >= 1
    offload_param = bool(_get(config, kn.OFFLOAD_PARAM, False)) and zero == 3
    overlap = bool(_get(config, kn.OVERLAP_COMM, False)) and zero >= 1
    flash = bool(_get(config, kn.FLASH_ATTENTION, True))
    dtype = str(_get(config, kn.DTYPE, "bf16"))
    bucket = _get(config, kn.REDUCE_BUCKET_SIZE, "auto")
    bucket_elems = 5e8 if bucket == "auto" else float(bucket)

    ws = problem.world_size
    reason = ""
    if ws % (tp * pp):
        reason = f"tp*pp={tp * pp} does not divide world_size={ws}"
    dp = max(1, ws // (tp * pp))
    if not reason and problem.global_batch % (dp * mbs):
        reason = f"global_batch={problem.global_batch} is not a multiple of dp*mbs={dp * mbs}"
    if not reason and m.n_layers % pp:
        reason = f"pp={pp} does not divide n_layers={m.n_layers}"
    if not reason and m.n_heads % tp:
        reason = f"tp={tp} does not divide n_heads={m.n_heads}"
    gas = max(1, problem.global_batch // (dp * mbs))
    s, h, L, a, V = problem.seq_len, m.hidden, m.n_layers, m.n_heads, m.vocab
    N = m.num_params
    act_bytes = 4 if dtype == "fp32" else 2
    peak = g.peak_flops * (0.5 if dtype == "fp32" else 1.0)  # fp32 runs on TF32 tensor cores

    # ---------------- compute ----------------
    tokens_mb = mbs * s
    dense_flops_tok = 6.0 * N / (tp * pp)
    attn_flops_tok = 12.0 * L * h * s / (tp * pp)
    # Achievable GEMM efficiency grows with the tokens per micro-batch and shrinks with the
    # per-device GEMM width (tp splits it); flash attention runs the attention part near peak.
    eff_tokens = tokens_mb / (tokens_mb + 1800.0)
    eff_width = (h / tp) / ((h / tp) + 300.0)
    eff = 0.72 * eff_tokens * eff_width
    attn_eff = eff * (0.95 if flash else 0.45)
    fwd_s = (dense_flops_tok / 3 / eff + attn_flops_tok / 3 / attn_eff) * tokens_mb / peak
    bwd_s = 2.0 * fwd_s
    if ckpt == "full":
        recompute_s = fwd_s
    elif ckpt == "selective":
        recompute_s = (attn_flops_tok / 3 / attn_eff) * tokens_mb / peak * (0.6 if flash else 1.0)
    else:
        recompute_s = 0.0
    launch_s = 2.5e-5 * (L / pp) * 12 * (3 if ckpt == "none" else 4)  # kernel launches
    compute_mb_s = fwd_s + bwd_s + recompute_s + launch_s

    # ---------------- tensor parallel communication (per micro-batch) ----------------
    tp_s = 0.0
    if tp > 1:
        vol = 4 * (L / pp) * 2 * (tp - 1) / tp * tokens_mb * h * act_bytes
        tp_s = vol / g.nvlink_bytes_per_s * (1.5 if ckpt == "full" else 1.0)
        tp_s *= 0.6  # partly overlapped by the async TP communication of the backward

    # ---------------- data-parallel communication ----------------
    shard_params = N / (tp * pp)
    dp_span_nodes = min(problem.nodes, max(1, dp * tp * pp // problem.gpus_per_node))
    bw = g.nvlink_bytes_per_s if dp_span_nodes <= 1 else g.internode_bytes_per_s
    latency = 8e-6 if dp_span_nodes <= 1 else 3e-5
    ring = 2 * (dp - 1) / dp if dp > 1 else 0.0
    half = (dp - 1) / dp if dp > 1 else 0.0
    grad_bytes = shard_params * act_bytes
    n_buckets = max(1.0, shard_params / bucket_elems)
    if dp == 1:
        per_step_comm = per_mb_comm = 0.0
    elif zero <= 1:
        per_step_comm = ring * grad_bytes / bw + n_buckets * latency * 2 * dp
        per_mb_comm = 0.0
    elif zero == 2:
        per_step_comm = half * grad_bytes / bw  # param all-gather after the step
        per_mb_comm = half * grad_bytes / bw + n_buckets * latency * dp  # reduce-scatter
    else:
        per_step_comm = 0.0
        layers_gathers = (L / pp) * 2  # fwd + bwd gathers, one latency per layer each
        per_mb_comm = (3 * half * grad_bytes) / bw + layers_gathers * latency * dp
        if ckpt == "full":
            per_mb_comm += half * grad_bytes / bw  # recompute re-gathers the params
    # Overlap: overlap_comm hides most of the gradient traffic behind the backward; ZeRO-3
    # prefetches parameters a little even without it. Bigger buckets overlap worse.
    hide = 0.0
    if zero >= 1 and overlap:
        hide = 0.8 - 0.1 * min(1.0, bucket_elems / 5e8)
    elif zero == 3:
        hide = 0.3
    exposed_mb_comm = max(per_mb_comm * (1 - hide), per_mb_comm - 0.9 * bwd_s)
    exposed_step_comm = per_step_comm * (1 - (0.5 * hide if zero <= 1 else 0.0))

    # ---------------- optimizer / offload ----------------
    local_params = shard_params / (dp if zero >= 1 else 1)
    opt_s = local_params * 16 * 2 / g.hbm_bytes_per_s
    offload_s = 0.0
    if offload:
        cpu_adam = local_params / 1.5e9  # CPU Adam, params/s per device's share of cores
        pcie = local_params * (act_bytes + 2) / g.pcie_bytes_per_s
        offload_s = cpu_adam + pcie
        opt_s = 0.0
    if offload_param:
        offload_s += gas * 2 * shard_params * 2 / dp / g.pcie_bytes_per_s + gas * 0.02

    # ---------------- pipeline ----------------
    per_mb = compute_mb_s + tp_s + exposed_mb_comm
    pipe_s = gas * per_mb
    bubble_s = pipe_s * (pp - 1) / gas if pp > 1 else 0.0
    p2p_s = (2 * gas * tokens_mb * h * act_bytes / g.nvlink_bytes_per_s) if pp > 1 else 0.0
    step = pipe_s + bubble_s + p2p_s + exposed_step_comm + opt_s + offload_s + 0.02

    model_flops = problem.tokens_per_step * (6.0 * N + 12.0 * L * h * s)
    mfu = model_flops / (step * ws * g.peak_flops)

    # ---------------- memory ----------------
    psi = shard_params
    param_b = 2 * psi if dtype != "fp32" else 4 * psi
    grad_b = 2 * psi if dtype != "fp32" else 4 * psi
    optim_b = 12 * psi if dtype != "fp32" else 8 * psi
    if offload:
        optim_b = 0.0
    if zero == 0:
        states = param_b + grad_b + optim_b
    elif zero == 1:
        states = param_b + grad_b + optim_b / dp
    elif zero == 2:
        states = param_b + (grad_b + optim_b) / dp
    else:
        states = (grad_b + optim_b) / dp + (0 if offload_param else param_b / dp)
        states += 2 * (psi / (L / pp)) * act_bytes  # two gathered layers live at once
    bytes_factor = act_bytes / 2
    per_layer_full = s * mbs * h * (34 + (0 if flash else 5 * a * s / h)) / tp * bytes_factor
    if ckpt == "full":
        acts_per_layer = 2 * s * mbs * h / tp * bytes_factor
        working = per_layer_full
    elif ckpt == "selective":
        acts_per_layer = s * mbs * h * 34 / tp * bytes_factor
        working = 0.0 if flash else s * mbs * a * s * act_bytes / tp
    else:
        acts_per_layer = per_layer_full
        working = 0.0
    # 1F1B: the first stage holds pp micro-batches of L/pp layers = L layers' worth.
    logits = s * mbs * V * 6 / tp  # bf16 logits + fp32 softmax, vocab-parallel over tp
    if pp == 1:
        acts = acts_per_layer * L + working + logits
    else:  # first stage: pp micro-batches of L/pp layers; last stage: one, plus the logits
        acts = max(acts_per_layer * L, acts_per_layer * L / pp + logits) + working
    buffers = 0.0
    if zero >= 1:
        buffers = min(bucket_elems, psi) * 4 * (2 if overlap else 1)
    if zero == 0 and dp > 1:
        buffers = min(5e8, psi) * act_bytes
    workspace = 2.5e9 + 0.06 * acts  # CUDA context, NCCL, cuBLAS, fragmentation
    peak_mem = states + acts + buffers + workspace
    phases = {
        "forward": gas * fwd_s,
        "backward": gas * bwd_s,
        "recompute": gas * recompute_s,
        "communication": gas * (tp_s + exposed_mb_comm) + exposed_step_comm + p2p_s,
        "bubble": bubble_s,
        "optimizer": opt_s + offload_s,
    }
    parts = {
        "model_states": states,
        "activations": acts,
        "buffers": buffers,
        "workspace": workspace,
    }
    return Evaluation(
        step_time_s=step,
        peak_memory_bytes=peak_mem,
        fits=peak_mem <= problem.memory_capacity_bytes and not reason,
        valid=not reason,
        mfu=mfu,
        phase_times_s=phases,
        memory_parts_bytes=parts,
        reason=reason,
    )


def problem_from_params(
    *,
    world_size: int,
    global_batch: int,
    seq_len: int,
    params: dict[str, Any],
    model_size: str,
    memory_capacity_bytes: int | None = None,
    source: str = "<workload>",
) -> Problem:
    """Build a ``Problem`` from a workload's ``surrogate`` dict (``gpu``, ``model``,
    ``gpus_per_node``, ``setup_s``)."""
    gpu_name = str(params.get("gpu", "h100_sxm"))
    if gpu_name not in GPUS:
        raise WorkloadError(
            f"{source}: field 'surrogate.gpu' is {gpu_name!r}; known kinds: {sorted(GPUS)}."
        )
    size = str(params.get("model", model_size))
    if size not in MODELS:
        raise WorkloadError(
            f"{source}: surrogate model size {size!r} is unknown; known sizes: {sorted(MODELS)}. "
            f"Set model.size or surrogate.model."
        )
    gpu = GPUS[gpu_name]
    cap = memory_capacity_bytes or int(params.get("memory_capacity_bytes", gpu.memory_bytes))
    return Problem(
        gpu=gpu,
        model=MODELS[size],
        world_size=world_size,
        gpus_per_node=int(params.get("gpus_per_node", 8)),
        global_batch=global_batch,
        seq_len=seq_len,
        memory_capacity_bytes=int(cap),
        setup_s=float(params.get("setup_s", 45.0)),
    )
