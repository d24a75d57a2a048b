"""What one rank returns from ``run_rank`` (JSON-able via ``dataclasses.asdict``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infrarsi.result import RankStatus


@dataclass
class RankResult:
    """One rank's view of one trial. Lists are per optimizer step, warm-up steps first."""

    rank: int = 0
    """This rank."""
    world_size: int = 0
    """Ranks in the trial."""
    trial_id: str = ""
    """Trial id from the spec."""
    status: RankStatus = "failed"
    """``ok`` | ``oom`` | ``failed`` | ``nan`` (``timeout`` is decided by the group)."""
    error: str = ""
    """Exception text (traceback tail) or OOM message; empty when ok."""
    step_times_s: list[float] = field(default_factory=list)
    """Seconds of each optimizer step on this rank, from a barrier to the end of the step's
    harness all-reduce (so communication is inside). Warm-up steps included."""
    warmup_steps: int = 0
    """How many leading entries of the per-step lists are warm-up."""
    phase_times_s: dict[str, float] = field(default_factory=dict)
    """Median over measured steps of seconds per step in data, forward, backward, optimizer;
    ``communication`` is time inside blocking collectives (DeepSpeed's + expert all-to-all,
    CPU only) and is contained in backward/optimizer, not additive."""
    loss: list[float] = field(default_factory=list)
    """Global mean training loss per optimizer step, computed by the harness from the logits."""
    workload_loss: list[float] = field(default_factory=list)
    """Global mean of the loss the workload reported (its ``report_loss`` seam)."""
    eval_loss: float | None = None
    """Loss of the trained parameters on the fixed held-out batch, by the reference model code."""
    tokens_seen: list[int] = field(default_factory=list)
    """Tokens fed to the model per optimizer step, summed over ranks (forward pre-hook)."""
    sequences_seen: list[int] = field(default_factory=list)
    """Sequences fed to the model per optimizer step, summed over ranks (forward pre-hook)."""
    data_digests: list[int] = field(default_factory=list)
    """Per optimizer step, the ``counters.token_digest`` of the token ids fed to the model, summed
    over ranks: equal for two runs that feed the same sequences in the same steps."""
    optimizer_steps: int = 0
    """Optimizer steps on this rank in which the real torch optimizer stepped (post-hook)."""
    peak_memory_bytes: int | None = None
    """This rank's peak (``memory_measure``); for oom, the known lower bound."""
    memory_censored: bool = False
    """True on OOM: the true need is >= ``peak_memory_bytes``."""
    memory_measure: str = ""
    """``mallinfo2`` (CPU, bytes over the pre-build baseline) or ``cuda_max_allocated``."""
    device_used_peak_bytes: int | None = None
    """GPU only: peak of the device's used memory during the trial over its value before the
    model was built, inside PyTorch's allocator or not (the ``device_used`` measure of
    ``memory.py``); None on CPU or when the device cannot be read."""
    leftover_device_bytes: int | None = None
    """GPU only: bytes PyTorch still had allocated on the device after the trial's cleanup (engine
    destroyed, references dropped): what the next trial in this process would start with. DeepSpeed
    ZeRO-3 engines leave their model states behind (measured on an H200: +22 GiB per 1.5e9-parameter
    trial); the pool recycles a group that leaves more than ``pool.LEFTOVER_RECYCLE_BYTES``."""
    device_name: str = ""
    """The rank's accelerator (``torch.cuda.get_device_name``; empty on CPU)."""
    device_memory_bytes: int | None = None
    """Total memory of the rank's GPU, bytes (None on CPU): the study's default capacity."""
    cuda_version: str = ""
    """The CUDA version torch was built with on the rank (``torch.version.cuda``; empty on CPU)."""
    driver_version: str = ""
    """The GPU driver version on the rank's node (NVML; empty on CPU or where NVML is missing)."""
    setup_time_s: float | None = None
    """Seconds from ``run_rank`` entry to the first step (imports, model build, engine init)."""
    param_checksum: float | None = None
    """sum(p) + sum(p^2) in float64 over the replicated parameters after training, computed on
    the rank's device parameter by parameter (identical across ranks unless replicas diverged;
    rank-local experts excluded). Compared across the ranks of one trial only."""
    end_checks_time_s: float | None = None
    """Seconds of the end-of-trial checks (parameter checksum, reference model build and eval
    loss) after the last step; None when they did not run (failure, nan)."""
    flops_per_token: float | None = None
    """Model training FLOPs per token (see ``flops.py``)."""
    num_params: int = 0
    """Parameters of the single-device model."""
    peak_flops_per_s: float | None = None
    """Peak FLOP/s per device used for MFU (from the spec, else probed on this rank)."""
    micro_batch_size: int = 0
    """Sequences per micro-batch."""
    grad_accum_steps: int = 0
    """Micro-batches per optimizer step."""
    ds_config: dict[str, Any] = field(default_factory=dict)
    """The DeepSpeed config the engine was built from."""
    telemetry: dict[str, Any] = field(default_factory=dict)
    """pynvml aggregates on GPU (``telemetry.aggregate``); empty on CPU."""
    stopped_early: str = ""
    """Why the harness stopped training before the contract's last step (the loss guard: a
    step's loss left the baseline's tolerance, so the trial could no longer pass); empty when
    every step ran."""
    checkpoint: dict[str, Any] = field(default_factory=dict)
    """The checkpoint round trip when the spec asked for one (``checkpoint_step``; see
    ``infrarsi.execution.checkpoint_trip.RoundTrip``: ``step``, the continued ``loss`` per step,
    ``error``, ``skipped``, ``save_s``, ``restart_s``, ``continue_s``, ``checkpoint_bytes``); empty
    otherwise."""
