"""The simulated ``surrogate`` backend: a trial answered from the analytic model, with noise, OOM and device time.

The ``surrogate`` workload backend: answers a trial from an analytic model of a large GPU
training job instead of training, so the whole stack (Ray Tune, stages, logs, reports) can run
at cluster scale in seconds. Every result is labelled simulated (``TrialResult.simulated=True``,
``memory_measure="surrogate"``).

The noiseless model is ``infrarsi.execution.surrogate.model.evaluate``. On top of it this module
adds what real clusters do: run-to-run noise (lognormal, CV ~4%), per-step jitter, occasional
stragglers (one slow rank sets the step time), rare random crashes (``failed``), and OOM when
the modelled peak exceeds the capacity (the capacity is then the known lower bound). A result is
a deterministic function of (workload, config, seed, trial_id).

A trial answers at once, unless the workload's ``surrogate.wall_clock_scale`` (default 0) is
positive: the trial then holds its caller for ``scale x`` its simulated wall time in real seconds
(``time.sleep``), so concurrent trials overlap and faults can strike a trial in flight (the soak
benchmark, ``benchmarks/soak.py``). The row's numbers do not change with the scale.

Knob handlers: the surrogate-only knobs (``tp``, ``pp``, ``flash_attention``) get handlers that
just record the value into ``TrialBuild.runtime``, so ``infrarsi.execution.knobs.registry.check_handlers`` passes
for ``search_spaces/surrogate_gpu.yaml``. Knobs the DeepSpeed translator already handles keep
its handler.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from typing import Any

import numpy as np

from infrarsi.errors import WorkloadError
from infrarsi.execution.knobs.registry import (
    KNOB_HANDLERS,
    KnobContext,
    KnobMemory,
    KnobSpeed,
    KnobValues,
    TrialBuild,
    boolean,
    integer,
    register_knob,
)
from infrarsi.execution.surrogate.model import Evaluation, Problem, evaluate, problem_from_params
from infrarsi.knob_names import DTYPE, FLASH_ATTENTION, PP, TP
from infrarsi.result import Stage, Status, TrialExtra, TrialResult
from infrarsi.workload import Workload

NOISE_CV = 0.04
"""Run-to-run coefficient of variation of the step time (lognormal)."""
STEP_JITTER_CV = 0.01
"""Step-to-step jitter within one trial."""
STRAGGLER_RATE = 0.04
"""Probability that a trial has one slow rank (slows every step by 15-60%)."""
CRASH_RATE = 0.015
"""Probability of a random crash (NCCL timeout, Xid, preemption): status ``failed``."""
MEMORY_NOISE_CV = 0.004
"""Relative noise of the reported peak memory of a trial that fits."""


def _record(name: str) -> Any:
    def handler(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
        build.runtime[name] = value

    handler.__name__ = f"surrogate_{name}"
    return handler


SURROGATE_KNOBS: dict[str, tuple[KnobValues, KnobMemory, KnobSpeed, str]] = {
    TP: (
        integer(lo=1),
        "saver",
        "neutral",
        "Tensor-parallel degree, simulated by the surrogate backend only. Record-only: "
        "sets runtime `tp`; no DeepSpeed key.",
    ),
    PP: (
        integer(lo=1),
        "saver",
        "neutral",
        "Pipeline-parallel degree, simulated by the surrogate backend only. Record-only: "
        "sets runtime `pp`; no DeepSpeed key.",
    ),
    FLASH_ATTENTION: (
        boolean(),
        "saver",
        "faster",
        "Flash attention on or off, simulated by the surrogate backend only. "
        "Record-only: sets runtime `flash_attention`; no DeepSpeed key.",
    ),
}
"""The surrogate-only knobs: the values each accepts, its memory and speed tags and its
documentation line."""


def register_surrogate_knobs() -> None:
    """Register record-only handlers for the surrogate-only knobs that have none yet."""
    # The built-in handlers own the knobs they know; importing the registry loaded them.
    for name, (values, memory, speed, doc) in SURROGATE_KNOBS.items():
        if name not in KNOB_HANDLERS:
            register_knob(name, values=values, memory=memory, speed=speed, doc=doc)(_record(name))


register_surrogate_knobs()


def problem_for(workload: Workload, memory_capacity_bytes: int | None = None) -> Problem:
    """The analytic ``Problem`` of a ``backend: surrogate`` workload. The capacity is
    ``memory_capacity_bytes``, else the workload's ``memory_capacity``, else the GPU's memory."""
    if memory_capacity_bytes is None:
        memory_capacity_bytes = workload.memory_capacity_bytes
    return problem_from_params(
        world_size=workload.world_size,
        global_batch=workload.global_batch_size,
        seq_len=workload.data.seq_len,
        params=workload.surrogate,
        model_size=workload.job_model().size,
        memory_capacity_bytes=memory_capacity_bytes,
        source=workload.path or workload.name,
    )


def wall_clock_scale(workload: Workload) -> float:
    """Real seconds a trial holds its caller per simulated second (``surrogate.wall_clock_scale``;
    0: none). A ``WorkloadError`` naming the field when it is not a finite number >= 0."""
    raw = workload.surrogate.get("wall_clock_scale", 0.0)
    try:
        scale = float(raw)
    except (TypeError, ValueError):
        scale = math.nan
    if not math.isfinite(scale) or scale < 0 or isinstance(raw, bool):
        raise WorkloadError(
            f"{workload.path or workload.name}: field 'surrogate.wall_clock_scale' is {raw!r}; "
            f"rule: a number >= 0 (real seconds per simulated second; 0 answers at once)."
        )
    return scale


def _rng(config: dict[str, Any], seed: int, trial_id: str) -> np.random.Generator:
    key = json.dumps(config, sort_keys=True, default=str) + f"|{seed}|{trial_id}"
    digest = hashlib.sha256(key.encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def loss_curve(steps: int, data_seed: int, dtype: str) -> list[float]:
    """A plausible training-loss curve, identical for every config of the same dtype; fp32 and
    bf16 differ by ~1e-4 (as measured on CPU for real)."""
    base = np.random.default_rng(data_seed).normal(0.0, 0.03, size=steps)
    t = np.arange(steps, dtype=float)
    curve = 2.1 + 9.7 * np.exp(-(t + 1) / 25.0) + base
    if dtype == "fp32":
        curve = curve + np.random.default_rng(data_seed + 1).normal(0.0, 1e-4, size=steps)
    return [float(x) for x in curve]


def sample_trial(
    problem: Problem,
    config: dict[str, Any],
    rng: np.random.Generator,
    *,
    measured_steps: int = 8,
    warmup_steps: int = 2,
) -> tuple[Status, Evaluation, dict[str, Any]]:
    """Draw one noisy trial: (status, noiseless evaluation, measured fields). The measured
    fields are ``step_time_samples_s``, ``rank_step_time_s``, ``peak_memory_bytes``,
    ``wall_s`` (simulated seconds the devices were held) and ``error``."""
    ev = evaluate(problem, config)
    out: dict[str, Any] = {"step_time_samples_s": [], "rank_step_time_s": [], "error": ""}
    u_crash, u_strag = rng.random(), rng.random()
    sigma = math.sqrt(math.log(1 + NOISE_CV**2))
    run_factor = float(rng.lognormal(-0.5 * sigma**2, sigma))
    if not ev.valid:
        out.update(
            peak_memory_bytes=None,
            wall_s=0.3 * problem.setup_s,
            error=f"simulated launch failure: {ev.reason}",
        )
        return "failed", ev, out
    if not ev.fits:
        frac = 0.5 + 0.5 * rng.random()  # it dies somewhere in the first step
        out.update(
            peak_memory_bytes=int(problem.memory_capacity_bytes),
            wall_s=problem.setup_s + frac * ev.step_time_s,
            error=(
                f"simulated CUDA out of memory: modelled peak "
                f"{ev.peak_memory_bytes / 2**30:.1f} GiB > capacity "
                f"{problem.memory_capacity_bytes / 2**30:.1f} GiB"
            ),
        )
        return "oom", ev, out
    steps = warmup_steps + measured_steps
    if u_crash < CRASH_RATE:
        done = rng.integers(0, steps)
        out.update(
            peak_memory_bytes=None,
            wall_s=problem.setup_s + done * ev.step_time_s * run_factor,
            error=(
                f"simulated crash: NCCL watchdog timeout on rank "
                f"{int(rng.integers(problem.world_size))} at step {int(done)}"
            ),
        )
        return "failed", ev, out
    straggle = 1.0 + (0.15 + 0.45 * rng.random()) if u_strag < STRAGGLER_RATE else 1.0
    slow_rank = int(rng.integers(problem.world_size))
    jitter = rng.lognormal(0.0, STEP_JITTER_CV, size=measured_steps)
    samples = ev.step_time_s * run_factor * straggle * jitter
    ranks = ev.step_time_s * run_factor * rng.lognormal(0.0, 0.005, size=problem.world_size)
    ranks[slow_rank] *= straggle
    mem = ev.peak_memory_bytes * (1 + MEMORY_NOISE_CV * rng.standard_normal())
    mem = min(mem, float(problem.memory_capacity_bytes))
    warm = warmup_steps * ev.step_time_s * run_factor * 1.3
    out.update(
        step_time_samples_s=[float(x) for x in samples],
        rank_step_time_s=[float(x) for x in ranks],
        peak_memory_bytes=int(mem),
        wall_s=problem.setup_s + warm + float(samples.sum()),
        warmup_s=warm,
        run_factor=run_factor * straggle,
    )
    return "ok", ev, out


def run_surrogate(
    workload: Workload,
    config: dict[str, Any],
    *,
    trial_id: str,
    stage: Stage = "run",
    memory_capacity_bytes: int | None = None,
    seed: int = 0,
) -> TrialResult:
    """Answer one trial of a ``backend: surrogate`` workload from the analytic model.

    ``memory_capacity_bytes`` overrides the workload's capacity (else ``surrogate`` dict, else the
    GPU's memory). The result is deterministic in (config, seed, trial_id) and ``simulated``.
    """
    started = time.time()
    hold = wall_clock_scale(workload)
    problem = problem_for(workload, memory_capacity_bytes)
    rng = _rng(config, seed, trial_id)
    status, ev, m = sample_trial(
        problem,
        config,
        rng,
        measured_steps=workload.steps.measured,
        warmup_steps=workload.steps.warmup,
    )
    ws = problem.world_size
    result = TrialResult(
        trial_id=trial_id,
        stage=stage,
        config=dict(config),
        status=status,
        error=m["error"],
        memory_measure="surrogate",
        simulated=True,
        world_size=ws,
        nodes=problem.nodes,
        tokens_per_step=problem.tokens_per_step,
        device_seconds=float(ws * m["wall_s"]),
        started_at=started,
        setup_time_s=problem.setup_s,
        hardware={
            "device": problem.gpu.name,
            "count": ws,
            "gpus_per_node": problem.gpus_per_node,
            "peak_flops": problem.gpu.peak_flops,
            "simulated": True,
        },
        extra=TrialExtra(
            num_params=int(problem.model.num_params),
            modelled_step_time_s=ev.step_time_s,
            modelled_peak_memory_bytes=int(ev.peak_memory_bytes),
            memory_parts_bytes=ev.memory_parts_bytes,
        ),
    )
    if status == "oom":
        result.peak_memory_bytes = m["peak_memory_bytes"]
        result.memory_censored = True
    if status == "ok":
        samples = m["step_time_samples_s"]
        step = float(np.median(samples))
        scale = step / ev.step_time_s
        steps = workload.steps.warmup + workload.steps.measured
        result.step_time_s = step
        result.step_time_samples_s = samples
        result.rank_step_time_s = m["rank_step_time_s"]
        result.warmup_time_s = m["warmup_s"]
        result.peak_memory_bytes = m["peak_memory_bytes"]
        result.optimizer_steps = steps
        result.loss = loss_curve(steps, workload.data.seed, str(config.get(DTYPE, "bf16")))
        result.tokens_per_s = problem.tokens_per_step / step
        result.mfu = ev.mfu / scale
        result.phase_times_s = {k: v * scale for k, v in ev.phase_times_s.items()}
    if hold > 0:
        time.sleep(hold * float(m["wall_s"]))
    result.ended_at = time.time()
    return result
