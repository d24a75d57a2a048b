"""One trial's result: the row the Arrow trial log stores.

Every field name carries its unit. The Arrow schema in ``infrarsi.study.trial_log`` is derived from this
dataclass, so adding a field here adds a column there.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["ok", "oom", "failed", "timeout", "nan", "invariant_violation"]
"""How a trial ended (``TrialResult.status``)."""
STATUSES: tuple[Status, ...] = typing.get_args(Status)
"""Every ``Status``, in this order."""
RankStatus = Literal["ok", "oom", "failed", "nan"]
"""How one rank's part of a trial ended (``timeout`` is decided by the group, the invariants after
the ranks)."""


def is_status(value: object) -> typing.TypeGuard[Status]:
    """True when ``value`` is one of ``STATUSES`` (a row's or a caller's text)."""
    return value in STATUSES


Stage = Literal["doctor", "run", "verify", "long", "trial"]
"""Which stage ran a trial (``TrialResult.stage``)."""
STAGES: tuple[Stage, ...] = typing.get_args(Stage)
"""Every ``Stage``, in this order."""


Role = Literal[
    "baseline",
    "honest_change",
    "candidate",
    "long_baseline",
    "long_calibration",
    "long_candidate",
]
"""What a stage ran a trial for (``TrialExtra.role``)."""


@dataclass
class TrialExtra:
    """The typed side facts of one trial row (``TrialResult.extra``).

    Every field is optional (None: not recorded for this trial). The log stores the record as one
    JSON object (the ``extra`` column) holding only the fields that are set, under their field
    names, so rows written before this record existed read back unchanged (``from_dict``).
    """

    # --- why the trial ran (the stage that asked for it) -------------------------------------
    role: Role | None = None
    """Its part in a doctor, verify or long-check stage: ``baseline``/``honest_change`` (doctor;
    also ``baseline`` in verify), ``candidate`` (verify), ``long_baseline``/``long_calibration``/
    ``long_candidate`` (the long check)."""
    repeat: int | None = None
    """Doctor: which repeat of the baseline this is (0, 1, ...)."""
    changed: str | None = None
    """Doctor's honest change or the long check's calibration: the knob that was changed."""
    round: int | None = None
    """Verify: the interleaved round (0, 1, ...)."""
    pair: int | None = None
    """Verify: the pair within the round (a baseline and its candidate share it)."""
    candidate: int | None = None
    """Verify: index of the candidate among those verified."""
    horizon_steps: int | None = None
    """A horizon trial (the long check): the optimizer steps it trained, warm-up included."""
    tune_trial_id: str | None = None
    """Run stage: the Ray Tune trial id the row belongs to (a retried Tune trial reuses it)."""
    concurrency: int | None = None
    """Run stage: how many trials ran at once."""
    ask_info: dict[str, Any] | None = None
    """Run stage: why the optimizer asked for the config, as ``infrarsi.search.AskInfo.to_dict()``
    (read it back with ``AskInfo.from_dict``)."""
    proposal: dict[str, Any] | None = None
    """Run stage: the queued proposal the trial took, as
    ``infrarsi.study.proposals.Proposal.to_dict()``."""

    # --- refusals, interruptions and invariants (the executor) -------------------------------
    out_of_scope: bool | None = None
    """True when the config was refused before running: outside the contract's scope."""
    patch_conflict: str | None = None
    """Why the trial's code patches did not apply together (refused before any rank started)."""
    patch_base_sha: str | None = None
    """Commit of the workload repository the trial's code patches were applied to."""
    patch_paths_touched: list[str] | None = None
    """Repository-relative paths the trial's code patches touched."""
    interrupted: bool | None = None
    """True when the harness was killed while the trial was in flight (its measurements were
    lost; it does not count against the budget nor teach the optimizer)."""
    device_seconds_lower_bound: bool | None = None
    """True when ``device_seconds`` is a lower bound (an interrupted trial's, up to its last
    heartbeat)."""
    invariants_checked: bool | None = None
    """True when the row was checked against the doctor's reference (``study.invariants``)."""
    invariant_reasons: list[str] | None = None
    """Why the row violates the invariants (status ``invariant_violation``)."""
    measured_step_time_s: float | None = None
    """The step time an ``invariant_violation`` row measured (the row's own field is kept too)."""

    # --- the rank group that ran it (``execution.runner``) -----------------------------------
    warm: bool | None = None
    """True when the trial reused an already started rank group."""
    acquire_s: float | None = None
    """Seconds spent getting a rank group (starting one when not warm)."""
    group_start_s: float | None = None
    """Seconds the group took to start (0 when warm)."""
    trial_wall_s: float | None = None
    """Wall seconds of the trial on its group, from the ranks' start to their results."""
    pids: list[int] | None = None
    """Process id of each rank."""
    actor_ids: list[str] | None = None
    """Ray actor id of each rank."""
    placement_group_id: str | None = None
    """Ray placement group the ranks ran in."""
    node_ids: list[str] | None = None
    """Ray node id of each rank."""
    cpu_pinned: bool | None = None
    """True when every rank was pinned to its own CPU cores."""
    cpu_pin_note: str | None = None
    """Why some rank was not pinned (empty when all were)."""
    group_trials_run: int | None = None
    """Trials the group had run, this one included."""
    memory_capacity_bytes: int | None = None
    """The per-device memory capacity the runner assumed."""
    code_shipped: bool | None = None
    """True when the trial's code was shipped to the ranks as a package (ranks on another node)."""
    code_digest: str | None = None
    """Hex sha256 of the shipped code package."""

    # --- what the ranks measured (``execution.aggregate``) -----------------------------------
    num_params: int | None = None
    """Model parameters (rank 0's count; older surrogate rows wrote it as ``model_params``)."""
    flops_per_token: float | None = None
    """Model FLOPs per token (rank 0's estimate)."""
    micro_batch_size: int | None = None
    """Sequences per rank per micro step, as the engine ran it."""
    grad_accum_steps: int | None = None
    """Micro steps per optimizer step, as the engine ran it."""
    ds_config: dict[str, Any] | None = None
    """The DeepSpeed config the engine actually ran (open: DeepSpeed's own keys)."""
    workload_loss: list[float] | None = None
    """The loss the workload itself reported per step (must match the harness's ``loss``)."""
    sequences_seen: list[int] | None = None
    """Global sequences fed per optimizer step."""
    sequences_per_step: int | None = None
    """Global sequences per optimizer step, for engines that report one count."""
    tokens_seen: list[int] | None = None
    """Tokens that entered the model at each optimizer step."""
    tokens_per_step_varied: list[int] | None = None
    """The distinct per-step token counts, when they varied."""
    data_digests: list[int] | None = None
    """Per optimizer step, a digest of the token ids that entered the model, summed over ranks
    (``execution.counters.token_digest``): equal for two runs that feed the same sequences in the
    same steps, whatever the micro-batch split; the doctor's data-order check and the data
    invariant compare them."""
    device_used_peak_bytes: int | None = None
    """Max over ranks of the device's used-memory peak (all processes, ``execution.memory``)."""
    leftover_device_bytes: int | None = None
    """Max over ranks of the device memory still allocated after the trial's cleanup."""
    end_checks_time_s: float | None = None
    """Max over ranks of the end-of-trial checks' seconds."""
    stopped_early: str | None = None
    """Why the ranks stopped before the last step (the loss guard), when they did."""
    checkpoint_round_trip: dict[str, Any] | None = None
    """The checkpoint round trip, when the trial asked for one: rank 0's
    ``execution.checkpoint_trip.RoundTrip.to_dict()``."""
    param_checksum: float | None = None
    """Rank 0's checksum of the trained parameters."""
    param_checksums_agree: bool | None = None
    """True when every rank's parameter checksum was the same."""
    param_checksum_spread: float | None = None
    """Relative max-min of the parameter checksum over data-parallel ranks."""
    rank_param_checksums: list[float] | None = None
    """Each rank's parameter checksum."""

    # --- the analytic surrogate backend ------------------------------------------------------
    modelled_step_time_s: float | None = None
    """The surrogate's modelled step time (before noise)."""
    modelled_peak_memory_bytes: int | None = None
    """The surrogate's modelled peak memory."""
    memory_parts_bytes: dict[str, float] | None = None
    """The surrogate's modelled memory by part (parameters, gradients, optimizer, activations)."""

    unknown: dict[str, Any] = field(default_factory=dict)
    """Keys of a stored row that this version does not know (a row written by another version),
    kept so that the row is written back unchanged. No code reads them."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able dict the log stores: the set fields, plus ``unknown``'s keys."""
        out = dict(self.unknown)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name != "unknown" and value is not None:
                out[f.name] = copy.deepcopy(value)
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> TrialExtra:
        """Inverse of ``to_dict``; also reads rows of earlier versions (``model_params``)."""
        data = dict(raw or {})
        if "model_params" in data and data.get("num_params") is None:
            data["num_params"] = data.pop("model_params")
        known = {k: v for k, v in data.items() if k in _EXTRA_FIELDS}
        return cls(**known, unknown={k: v for k, v in data.items() if k not in _EXTRA_FIELDS})

    def update(self, other: TrialExtra) -> None:
        """Set every field that ``other`` sets (its unknown keys too)."""
        for f in dataclasses.fields(other):
            value = getattr(other, f.name)
            if f.name != "unknown" and value is not None:
                setattr(self, f.name, value)
        self.unknown.update(other.unknown)


_EXTRA_FIELDS = frozenset(f.name for f in dataclasses.fields(TrialExtra)) - {"unknown"}


@dataclass
class TrialResult:
    """The measured outcome of one trial (one row of the trial log)."""

    trial_id: str
    """Unique id of the trial within the study (never reused, also across resumes)."""
    stage: Stage
    """Which stage ran it: ``doctor``, ``run``, ``verify``, ``long`` (the long check past the
    trial's horizon: ``extra.horizon_steps`` steps) or ``trial`` (the CLI command)."""
    config: dict[str, Any]
    """Knob name -> value; every knob of the space (inactive knobs hold their default)."""
    status: Status = "failed"
    """How it ended (one of ``STATUSES``)."""
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
    extra: TrialExtra = field(default_factory=TrialExtra)
    """The trial's typed side facts (stage roles, the rank group, engine counters, refusals);
    stored in the log as one JSON object (``TrialExtra.to_dict``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.extra, TrialExtra):  # a dict: a stored row's, or an old caller's
            self.extra = TrialExtra.from_dict(self.extra)

    def to_dict(self) -> dict[str, Any]:
        """The row as a JSON-able dict (``extra`` as ``TrialExtra.to_dict``); ``from_dict``
        inverts it."""
        out = {
            f.name: copy.deepcopy(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.name != "extra"
        }
        out["extra"] = self.extra.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialResult:
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        for key in ("config", "hardware", "telemetry", "extra", "phase_times_s"):
            if isinstance(kwargs.get(key), str):
                kwargs[key] = json.loads(kwargs[key]) if kwargs[key] else {}
        if not isinstance(kwargs.get("extra"), TrialExtra):
            kwargs["extra"] = TrialExtra.from_dict(kwargs.get("extra"))
        return cls(**kwargs)

    @property
    def ok(self) -> bool:
        return self.status == "ok"
