"""Rank results -> one ``TrialResult``: status classification and cross-rank measurement.

Pure functions (no Ray), so that the rules are unit-tested on their own:

- status: any rank ``oom`` -> ``oom`` (memory censored); else any ``nan`` -> ``nan``; else any
  ``failed`` (its exception text kept) -> ``failed``; else ranks missing at the deadline ->
  ``timeout``; else ``ok``. Success is judged by what the ranks returned, never by a return code.
- ``step_time_samples_s[i]`` = max over ranks of measured step i (the slowest rank sets the pace;
  communication is inside the step); ``step_time_s`` = their median; warm-up apart.
- ``peak_memory_bytes`` = max over ranks (for oom, the known lower bound).
- loss, tokens and optimizer steps come from the harness counters of rank 0.
- ``extra.end_checks_time_s`` = max over ranks of the end-of-trial checks' seconds;
  ``extra.device_used_peak_bytes`` = max over ranks of the GPU's used-memory peak (``memory.py``);
- ``extra.leftover_device_bytes`` = max over ranks of the GPU memory still allocated after the
  trial's cleanup (the pool recycles a group that leaves too much).
- ``extra.checkpoint_round_trip`` (only when the trial asked for one): rank 0's round trip
  (``checkpoint_trip.RoundTrip``), with the first rank's error when rank 0 has none.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Sequence
from typing import Any

from infrarsi.result import Stage, Status, TrialExtra, TrialResult

STATUS_PRIORITY: tuple[Status, ...] = ("oom", "nan", "failed", "timeout")
"""Which rank status wins when ranks disagree (first match)."""


def classify(rank_results: Sequence[dict[str, Any] | None], timed_out: bool) -> tuple[Status, str]:
    """(status, error text) of a trial from its rank results."""
    statuses = [r.get("status", "failed") if r is not None else "missing" for r in rank_results]
    errors = [
        f"rank {r.get('rank', i)}: {r.get('error') or r.get('status')}"
        for i, r in enumerate(rank_results)
        if r is not None and r.get("status") != "ok"
    ]
    for status in STATUS_PRIORITY[:3]:  # a rank's own failure; timeout is the group's
        if status in statuses:
            return status, "\n".join(errors)
    unknown = [s for s in statuses if s not in ("ok", "missing")]
    if unknown:
        return "failed", f"ranks returned unknown statuses {unknown}; expected ok|oom|failed|nan"
    if timed_out or "missing" in statuses:
        missing = [i for i, s in enumerate(statuses) if s == "missing"]
        return (
            "timeout",
            f"ranks {missing} did not finish before the trial deadline; the group was killed",
        )
    return "ok", ""


def _median(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def _measured(r: dict[str, Any]) -> list[float]:
    return [float(x) for x in (r.get("step_times_s") or [])[int(r.get("warmup_steps") or 0) :]]


def _phase_medians(r: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    warm = int(r.get("warmup_steps") or 0)
    for phase, value in (r.get("phase_times_s") or {}).items():
        if isinstance(value, (list, tuple)):
            samples = [float(x) for x in value[warm:]] or [float(x) for x in value]
            med = _median(samples)
            if med is not None:
                out[phase] = med
        elif value is not None:
            out[phase] = float(value)
    return out


def aggregate(
    rank_results: Sequence[dict[str, Any] | None],
    *,
    timed_out: bool,
    trial_id: str,
    stage: Stage,
    config: dict[str, Any],
    patches: Sequence[str] = (),
    world_size: int,
    nodes: int,
    devices: int,
    started_at: float,
    ended_at: float,
    peak_flops_per_s: float | None = None,
    hardware: dict[str, Any] | None = None,
    extra: TrialExtra | None = None,
) -> TrialResult:
    """Combine the ranks' results of one trial into the log row."""
    status, error = classify(rank_results, timed_out)
    answered = [r for r in rank_results if r is not None]
    rank0 = (
        rank_results[0]
        if rank_results and rank_results[0] is not None
        else (answered[0] if answered else {})
    )
    peak_flops_per_s = peak_flops_per_s or rank0.get("peak_flops_per_s")

    res = TrialResult(
        trial_id=trial_id,
        stage=stage,
        config=dict(config),
        status=status,
        error=error,
        patches=list(patches),
        world_size=world_size,
        nodes=nodes,
        started_at=started_at,
        ended_at=ended_at,
        device_seconds=float(devices) * max(0.0, ended_at - started_at),
        hardware=dict(hardware or {}),
        extra=copy.copy(extra) if extra is not None else TrialExtra(),
    )

    mems = [int(r["device_memory_bytes"]) for r in answered if r.get("device_memory_bytes")]
    if mems:  # what the ranks' own devices report: the doctor's default capacity, on any cluster
        res.hardware["memory_per_device_bytes"] = min(mems)
    for key, field in (
        ("device_name", "device_name"),
        ("cuda", "cuda_version"),
        ("driver", "driver_version"),
    ):
        values = sorted({str(r[field]) for r in answered if r.get(field)})
        if values:  # one value, or every distinct one (a mixed cluster says so)
            res.hardware[key] = values[0] if len(values) == 1 else ", ".join(values)
    peaks = [
        int(r["peak_memory_bytes"]) for r in answered if r.get("peak_memory_bytes") is not None
    ]
    res.peak_memory_bytes = max(peaks) if peaks else None
    res.memory_censored = status == "oom" or any(
        bool(r.get("memory_censored")) for r in answered if r.get("status") == "oom"
    )
    res.memory_measure = str(rank0.get("memory_measure") or "")
    res.loss = [float(x) for x in (rank0.get("loss") or [])]
    if rank0.get("eval_loss") is not None:
        res.eval_loss = float(rank0["eval_loss"])
    res.optimizer_steps = (
        int(rank0["optimizer_steps"]) if rank0.get("optimizer_steps") is not None else None
    )
    setups = [float(r["setup_time_s"]) for r in answered if r.get("setup_time_s") is not None]
    res.setup_time_s = max(setups) if setups else None
    res.telemetry = {
        str(r.get("rank", i)): r["telemetry"] for i, r in enumerate(answered) if r.get("telemetry")
    }

    def given(key: str) -> Any:
        """Rank 0's value of ``key``; None when it gave none (or an empty one)."""
        value = rank0.get(key)
        return None if value in (None, [], {}) else value

    res.extra.num_params = given("num_params")
    res.extra.flops_per_token = given("flops_per_token")
    res.extra.micro_batch_size = given("micro_batch_size")
    res.extra.grad_accum_steps = given("grad_accum_steps")
    res.extra.ds_config = given("ds_config")
    res.extra.workload_loss = given("workload_loss")
    res.extra.sequences_seen = given("sequences_seen")
    used = [
        int(r["device_used_peak_bytes"])
        for r in answered
        if r.get("device_used_peak_bytes") is not None
    ]
    if used:
        res.extra.device_used_peak_bytes = max(used)
    leftover = [
        int(r["leftover_device_bytes"])
        for r in answered
        if r.get("leftover_device_bytes") is not None
    ]
    if leftover:
        res.extra.leftover_device_bytes = max(leftover)
    checks = [
        float(r["end_checks_time_s"]) for r in answered if r.get("end_checks_time_s") is not None
    ]
    if checks:
        res.extra.end_checks_time_s = max(checks)
    if rank0.get("stopped_early"):
        res.extra.stopped_early = str(rank0["stopped_early"])
    trips = [r["checkpoint"] for r in answered if r.get("checkpoint")]
    if trips:
        trip = dict(rank0.get("checkpoint") or trips[0])
        if not trip.get("error"):
            trip["error"] = next((str(t["error"]) for t in trips if t.get("error")), "")
        res.extra.checkpoint_round_trip = trip
    checksums = [r.get("param_checksum") for r in answered if r.get("param_checksum") is not None]
    if checksums:
        res.extra.param_checksum = checksums[0]
        res.extra.param_checksums_agree = len({repr(c) for c in checksums}) == 1

    tokens = [int(t) for t in (rank0.get("tokens_seen") or [])]
    digests = [int(d) for d in (rank0.get("data_digests") or [])]
    if digests:
        res.extra.data_digests = digests
    warm = int(rank0.get("warmup_steps") or 0)
    measured_tokens = tokens[warm:] or tokens
    if measured_tokens:
        res.tokens_per_step = int(statistics.median(measured_tokens))
        if len(set(tokens)) > 1:
            res.extra.tokens_per_step_varied = sorted(set(tokens))

    if status != "ok":
        return res

    per_rank = [_measured(r) for r in answered]
    n = min((len(x) for x in per_rank), default=0)
    res.step_time_samples_s = [max(x[i] for x in per_rank) for i in range(n)]
    res.step_time_s = _median(res.step_time_samples_s)
    res.rank_step_time_s = [m for m in (_median(x) for x in per_rank) if m is not None]
    warm_times = [
        [float(x) for x in (r.get("step_times_s") or [])[: int(r.get("warmup_steps") or 0)]]
        for r in answered
    ]
    nw = min((len(x) for x in warm_times), default=0)
    res.warmup_time_s = sum(max(x[i] for x in warm_times) for i in range(nw)) if nw else 0.0
    phases: dict[str, float] = {}
    for r in answered:
        for phase, v in _phase_medians(r).items():
            phases[phase] = max(phases.get(phase, 0.0), v)
    res.phase_times_s = phases
    if res.step_time_s and res.tokens_per_step:
        res.tokens_per_s = res.tokens_per_step / res.step_time_s
        fpt = rank0.get("flops_per_token")
        if fpt and peak_flops_per_s:
            res.mfu = float(fpt) * res.tokens_per_s / (world_size * float(peak_flops_per_s))
    return res
