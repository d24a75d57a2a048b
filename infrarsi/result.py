"""One trial's result: the row the Arrow trial log stores.

Every field name carries its unit. The Arrow schema in ``infrarsi.study.trial_log`` is derived from this
dataclass, so adding a field here adds a column there.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["ok", "oom", "failed", "timeout", "nan", "invariant_violation"]
STATUSES: tuple[str, ...] = ("ok", "oom", "failed", "timeout", "nan", "invariant_violation")
Stage = Literal["doctor", "run", "verify", "long", "trial"]


@dataclass
class TrialResult:
    """The measured outcome of one trial (one row of the trial log)."""

    trial_id: str
    """Unique id of the trial within the study (never reused, also across resumes)."""
    stage: str
    """Which stage ran it: ``doctor``, ``run``, ``verify``, ``long`` (the long check past the
    trial's horizon: ``extra["horizon_steps"]`` steps) or ``trial`` (the CLI command)."""
    config: dict[str, Any]
    """Knob name -> value; every knob of the space (inactive knobs hold their default)."""
    status: str = "failed"
    """One of ``STATUSES``."""
    error: str = ""
    """Exception text or invariant-violation reason; empty when ok."""
    patches: list[str] = field(default_factory=list)
    """Code patches applied for this trial, in order (paths of patch files: relative to the
    workload's repository for a ``code_patch`` knob's, to the study directory for a proposal's)."""
    patch_sha256: list[str] = field(default_factory=list)
    """Hex sha256 of each patch file in ``patches`` (same order) as the trial ran it: with the
    config, the identity of the candidate (``infrarsi.study.candidate``)."""
    step_time_s: float | None = None
    """Median over measured steps of the max-over-ranks time of one optimizer step; None unless ok."""
    step_time_samples_s: list[float] = field(default_factory=list)
    """Max-over-ranks time of each measured optimizer step, in order."""
    warmup_time_s: float | None = None
    """Total time of the warm-up steps (reported apart, never dropped silently)."""
    setup_time_s: float | None = None
    """Engine build time (DeepSpeed init, model build) before the first step."""
    peak_memory_bytes: int | None = None
    """Max over ranks of the per-device peak; for oom, the known lower bound."""
    memory_censored: bool = False
    """True when the trial ran out of memory: the true peak is >= ``peak_memory_bytes``."""
    memory_measure: str = ""
    """How the peak was measured (``cuda_max_allocated``, ``mallinfo2``, ``surrogate``...)."""
    loss: list[float] = field(default_factory=list)
    """Global mean training loss per optimizer step (warm-up steps included, in order)."""
    eval_loss: float | None = None
    """Loss of the trained parameters on a fixed held-out batch, computed by the reference model code."""
    tokens_per_step: int | None = None
    """Tokens per optimizer step, as counted by the harness (not reported by the workload)."""
    optimizer_steps: int | None = None
    """Optimizer steps taken, as counted by the harness."""
    tokens_per_s: float | None = None
    """tokens_per_step / step_time_s."""
    mfu: float | None = None
    """Model FLOPs utilisation: achieved model FLOP/s over (world_size x measured peak FLOP/s)."""
    phase_times_s: dict[str, float] = field(default_factory=dict)
    """Median per-step seconds of each phase (data, forward, backward, optimizer, communication)."""
    rank_step_time_s: list[float] = field(default_factory=list)
    """Median step time of each rank (before the max over ranks), for straggler detection."""
    world_size: int = 0
    """Number of ranks (devices) the trial used."""
    nodes: int = 1
    """Number of nodes (Ray raylets) the trial's ranks spanned."""
    device_seconds: float = 0.0
    """Devices x wall seconds the trial held them, failed trials included."""
    started_at: float = 0.0
    """Unix time the trial started (converted to a timestamp column in the log)."""
    ended_at: float = 0.0
    """Unix time the trial ended."""
    hardware: dict[str, Any] = field(default_factory=dict)
    """Device kind, count, measured peak FLOP/s, host names..."""
    telemetry: dict[str, Any] = field(default_factory=dict)
    """Sampled device telemetry (pynvml on GPU: utilisation, SM clock, power, memory used)."""
    simulated: bool = False
    """True when the result came from the analytic ``surrogate`` backend, not real training."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else worth keeping (repair provenance, verify pairing, invariant details)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialResult:
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        for key in ("config", "hardware", "telemetry", "extra", "phase_times_s"):
            if isinstance(kwargs.get(key), str):
                kwargs[key] = json.loads(kwargs[key]) if kwargs[key] else {}
        return cls(**kwargs)

    @property
    def ok(self) -> bool:
        return self.status == "ok"
