"""One trial on one rank: build, train, time and measure.

One trial on one rank: get the job from its entry point (``infrarsi.job``; the built-in
families are ``workloads.jobs:builtin_job``), build its model on the rank's device (under
``zero.Init`` with ZeRO-3) and the DeepSpeed engine from the knob config, train the contract's
steps with harness-owned counting and timing, measure memory, evaluate.

``run_rank(spec: dict) -> dict`` is called by the Ray ``TrainWorker`` (or a test's spawn harness)
after ``torch.distributed`` is initialised (gloo on CPU, nccl on GPU). The process group may
be reused by later trials (warm worker): the engine is destroyed and memory collected at the
end of every trial. ``run_rank`` never raises for a trial failure: it returns a ``RankResult``
dict with status ``ok`` | ``oom`` | ``failed`` | ``nan``.

The spec is a ``RankSpec`` (``infrarsi.execution.rank_spec``, one documented field each). Two of
its fields change how a trial runs: ``loss_guard`` stops training as soon as a step's loss leaves
the contract's tolerance around the baseline's (every rank sees the same all-reduced loss, so all
ranks stop at the same step; a trial that can no longer pass stops burning device time), and
``steps`` trains that many optimizer steps instead of the workload's (the long check's horizon;
the batches of every step come from the harness's source by (step, rank, micro-batch), past the
workload's usual count too). ``checkpoint_step`` S adds a DeepSpeed checkpoint round trip
(``infrarsi.execution.checkpoint_trip``: save after step S, train on uninterrupted, then rebuild,
load and continue from S; reported in ``RankResult.checkpoint``).

Harness-owned measures (anti reward hacking): tokens and sequences fed to the model are counted
by a forward pre-hook, optimizer steps by a step post-hook on the real torch optimizer (once
per optimizer step), the loss is computed by the harness from the logits (chunked over the tokens
with the ``loss_chunk_tokens`` knob; the workload's
reported loss is kept apart as ``workload_loss``), and each rank reports a checksum of its
replicated parameters.

Why one module: it is one trial's training loop on one rank, from build to eval; its collaborators
(counters, clocks, memory, the checkpoint trip, the end checks, rank setup) are modules of their
own.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import statistics
import time
import traceback
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from infrarsi.errors import JobError
from infrarsi.execution import checkpoint_trip as ckpt
from infrarsi.execution import clocks, end_checks, rank_setup
from infrarsi.execution.counters import HarnessCounters
from infrarsi.execution.data_sources import make_source
from infrarsi.execution.flops import flops_per_token, peak_flops_per_s
from infrarsi.execution.job_loader import check_job, import_entry
from infrarsi.execution.knobs import attention
from infrarsi.execution.knobs.deepspeed import build_trial
from infrarsi.execution.knobs.fused_loss import FUSED_LOSS_KNOB
from infrarsi.execution.knobs.loss_chunk import LOSS_CHUNK_KNOB, chunked_cross_entropy
from infrarsi.execution.memory import MemoryMonitor, is_oom
from infrarsi.execution.rank_result import RankResult
from infrarsi.execution.rank_spec import RankSpec
from infrarsi.execution.seams import HONEST, Seams
from infrarsi.execution.telemetry import TelemetrySampler
from infrarsi.job import JobContext, TrainingJob
from infrarsi.knob_names import ATTENTION_BACKEND
from infrarsi.workload import Workload

PHASES = ("data", "forward", "backward", "optimizer", "communication")


def start_rank(spec: RankSpec) -> tuple[RankResult, Workload, MemoryMonitor]:
    """What every rank entry (an entry-point job, a script) starts a trial with: its empty
    ``RankResult``, the workload, and the memory monitor under the trial's capacity."""
    res = RankResult(rank=dist.get_rank(), world_size=dist.get_world_size(), trial_id=spec.trial_id)
    wl = Workload.from_dict(spec.workload)
    monitor = MemoryMonitor(wl.resources.device, spec.memory_capacity_bytes)
    res.memory_measure = monitor.measure
    return res, wl, monitor


def run_rank(raw_spec: dict[str, Any]) -> dict[str, Any]:
    """Run one trial on this rank (``raw_spec``: a ``RankSpec.to_dict``); see the module
    docstring. Returns ``RankResult`` as a dict."""
    t_start = time.perf_counter()
    spec = RankSpec.from_dict(raw_spec)
    res, wl, monitor = start_rank(spec)
    device = wl.resources.device
    telemetry = TelemetrySampler(device, torch.cuda.current_device() if device == "cuda" else 0)
    if device == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        res.device_name, res.device_memory_bytes = str(props.name), int(props.total_memory)
        res.cuda_version, res.driver_version = str(torch.version.cuda or ""), _driver_version()
    state: dict[str, Any] = {}
    try:
        with contextlib.ExitStack() as scope:  # what the trial sets for itself, undone at its end
            state["scope"] = scope
            _run(spec, wl, res, monitor, telemetry, state, t_start)
    except BaseException as exc:
        monitor.stop()
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        if is_oom(exc):
            res.status = "oom"
            res.memory_censored = True
            res.peak_memory_bytes = monitor.oom_lower_bound()
            res.error = monitor.describe_oom(exc)
        else:
            res.status = "failed"
            res.error = "".join(traceback.format_exception(exc))[-4000:]
    finally:
        monitor.stop()
        res.device_used_peak_bytes = monitor.device_used_peak_bytes
        res.telemetry = telemetry.stop()
        _cleanup(state, device)
        if device == "cuda":  # what this trial leaves to the next one in this process
            res.leftover_device_bytes = int(torch.cuda.memory_allocated())
    return asdict(res)


def _run(
    spec: RankSpec,
    wl: Workload,
    res: RankResult,
    monitor: MemoryMonitor,
    telemetry: TelemetrySampler,
    state: dict[str, Any],
    t_start: float,
) -> None:
    import deepspeed

    rank, world = res.rank, res.world_size
    device = wl.resources.device
    entry_point, job_args = wl.job_model().entry()
    make_job = import_entry(spec.code_dir, entry_point)
    seams = _seams(wl)

    def job_for(
        options: dict[str, Any], *, reference: bool = False, fn: Any = make_job
    ) -> TrainingJob:
        ctx = JobContext(
            args=job_args,
            options=options,
            device=device,
            rank=rank,
            world_size=world,
            seq_len=wl.data.seq_len,
            reference=reference,
        )
        try:
            return check_job(fn(ctx), entry_point)
        except JobError:
            raise
        except Exception as e:
            raise JobError(
                f"model.entry_point: {entry_point}(ctx) raised {type(e).__name__}: {e}"
            ) from e

    with torch.device("meta"):
        num_params = sum(p.numel() for p in job_for({}).build_model().parameters())
    build = build_trial(wl, dict(spec.config), world, num_params, job_for({}).shape.dim)
    job = job_for(dict(build.model_options))
    shape = job.shape
    res.num_params = num_params
    res.flops_per_token = flops_per_token(shape, num_params, wl.data.seq_len)
    res.micro_batch_size = build.runtime["micro_batch_size"]
    res.grad_accum_steps = build.runtime["grad_accum_steps"]
    res.ds_config = build.ds_config
    ep = bool(build.model_options.get("expert_parallel"))
    if ep and job.expert_parallel is None:
        from infrarsi.errors import KnobError

        raise KnobError(
            f"knob 'expert_parallel'=true needs a job with expert parallelism (the built-in moe "
            f"family), but {entry_point} has none"
        )

    os.environ.update(build.env)
    # the SDPA kernel for the whole trial, checkpoint recomputation in backward included
    state["scope"].enter_context(attention.backend_context(build.runtime[ATTENTION_BACKEND]))
    os.environ.setdefault("LOCAL_RANK", "0" if device == "cuda" else str(rank))
    torch.set_num_threads(build.runtime["threads_per_worker"])
    if device == "cpu":  # free here (measured); on GPU it would change the kernels being timed
        torch.use_deterministic_algorithms(True, warn_only=True)
    # DeepSpeed JIT-builds a shared-memory op on CPU that only inference all-reduce uses:
    # minutes of compile on a fresh machine, and shm state shared by trial groups. Skip it.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend=dist.get_backend(), dist_init_required=False)
    comm = clocks.CommTimer.install(device)
    res.peak_flops_per_s = spec.peak_flops_per_s or peak_flops_per_s(
        device, build.runtime["threads_per_worker"]
    )

    # ---- build (memory baseline first) ----
    seed = int(spec.seed if spec.seed is not None else wl.data.seed)
    monitor.start()
    torch.manual_seed(seed)
    with rank_setup.build_context(device, build.ds_config, partitioned=not ep):
        model = job.build_model()
    if not isinstance(model, torch.nn.Module):
        raise JobError(
            f"model.entry_point: {entry_point}: build_model() returned {type(model).__name__}, not a torch.nn.Module"
        )
    ep_params: list[torch.nn.Parameter] = []
    if ep:
        ep_mod = job.expert_parallel
        assert ep_mod is not None
        ep_mod.parallelize_moe(model)
        ep_params = ep_mod.expert_parameters(model)
        state["ep_mod"] = ep_mod
    for transform in build.model_transforms:  # float8 linear layers...: before the optimizer
        transform(model, shape)
    counters = HarnessCounters().attach(model)
    monitor.attach(model)
    monitor.check("model_build")
    opt = rank_setup.make_optimizer(
        build.runtime["optimizer_impl"], list(model.parameters()), wl.optimizer
    )
    counters.watch_optimizer(opt)
    ep_opt = (
        rank_setup.make_optimizer(build.runtime["optimizer_impl"], ep_params, wl.optimizer)
        if ep_params
        else None
    )
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=build.ds_config)
    state.update(engine=engine, model=model, counters=counters)
    seams.configure_engine(engine)
    torch.set_num_threads(build.runtime["threads_per_worker"])
    monitor.check("engine_init")
    dev = engine.device
    source = make_source(wl.data, shape.vocab_size, job=job, data_path=spec.data_path)
    total_steps = spec.steps_to_train(wl.steps.warmup, wl.steps.measured)
    trip = plan_round_trip(spec.checkpoint_step, total_steps, ep)
    if trip is not None and not trip.skipped:
        state["ckpt_dir"] = ckpt.shared_temp_dir()
    # Every step's rows are generated before the clock starts (a data loader that keeps up):
    # the timed steps measure training, not the harness's synthetic source.
    planned = rank_setup.plan_batches(
        source, total_steps, wl.global_batch_size, rank, world, res.micro_batch_size, dev
    )
    res.warmup_steps = wl.steps.warmup
    res.setup_time_s = time.perf_counter() - t_start
    telemetry.start()

    # ---- train ----
    sync = (lambda: torch.cuda.synchronize()) if device == "cuda" else (lambda: None)
    clock = clocks.PhaseClock(device)
    phases: dict[str, list[float]] = {p: [] for p in PHASES}
    vocab = shape.vocab_size
    job_loss = job.loss
    loss_chunk = int(build.runtime.get(LOSS_CHUNK_KNOB, 0))
    fused_chunk = int(build.runtime.get(FUSED_LOSS_KNOB, 0))
    fused = _fused_loss(job, fused_chunk)
    for step in range(total_steps):
        dist.barrier()
        t0 = time.perf_counter()
        comm0 = comm.total_s() + (state["ep_mod"].COMM_TIME_S[0] if ep else 0.0)
        acc = dict.fromkeys(PHASES, 0.0)
        batches = [
            (b.inputs.to(dev, non_blocking=True), b.targets.to(dev, non_blocking=True))
            for b in seams.fetch(planned[step])
        ]
        counters.begin_step()
        loss_sum = torch.zeros((), dtype=torch.float64, device=dev)
        reported_sum = torch.zeros((), dtype=torch.float64, device=dev)
        n_tok = 0
        t1 = time.perf_counter()
        acc["data"] = t1 - t0
        clock.reset()
        for i, (inp, tgt) in enumerate(batches):
            clock.mark()
            logits: torch.Tensor | None = None
            if fused:  # the same mean cross-entropy, the logits never whole (the job's fused_loss)
                loss = fused(engine, inp, tgt, fused_chunk)
            else:
                logits = job.forward(engine, inp)
                loss = (  # loss_chunk: the same mean cross-entropy, a chunk of tokens at a time
                    chunked_cross_entropy(logits, tgt, loss_chunk)
                    if loss_chunk
                    else F.cross_entropy(logits.float().reshape(-1, vocab), tgt.reshape(-1))
                )
            ntok = tgt.numel()
            loss_sum += loss.detach().double() * ntok
            if job_loss is not None and logits is not None:  # the job's own loss is back-propagated
                loss = job_loss(logits, tgt)
            reported_sum += (
                torch.as_tensor(seams.report_loss(loss.detach()), device=dev).double() * ntok
            )
            n_tok += ntok
            clock.mark()
            engine.backward(loss)
            monitor.check("after_backward")
            clock.mark()
            boundary = i == len(batches) - 1
            seams.optimizer_step(engine, opt, step, boundary)
            if boundary and ep_opt is not None:
                state["ep_mod"].finish_expert_grads(ep_params, world)
                ep_opt.step()
                ep_opt.zero_grad(set_to_none=True)
            monitor.check("after_step")
            clock.mark()
            del logits, loss
        totals = torch.stack(
            [
                loss_sum,
                reported_sum,
                torch.tensor(float(n_tok), dtype=torch.float64, device=dev),
                torch.tensor(float(counters.step_tokens), dtype=torch.float64, device=dev),
                torch.tensor(float(counters.step_rows), dtype=torch.float64, device=dev),
                counters.digest_on(dev),
            ]
        )
        dist.all_reduce(totals)
        sync()
        step_time = time.perf_counter() - t0
        for fwd, bwd, opt_s in clock.micro_batch_phases():
            acc["forward"] += fwd
            acc["backward"] += bwd
            acc["optimizer"] += opt_s
        acc["communication"] = (
            comm.total_s() + (state["ep_mod"].COMM_TIME_S[0] if ep else 0.0) - comm0
        )
        tot = totals.tolist()
        res.step_times_s.append(step_time)
        res.loss.append(tot[0] / max(tot[2], 1.0))
        res.workload_loss.append(tot[1] / max(tot[2], 1.0))
        res.tokens_seen.append(int(tot[3]))
        res.sequences_seen.append(int(tot[4]))
        res.data_digests.append(int(tot[5]))
        res.optimizer_steps += counters.end_step()
        for p in PHASES:
            phases[p].append(acc[p])
        if not math.isfinite(res.loss[-1]):
            res.status = "nan"
            res.error = f"loss is {res.loss[-1]} at optimizer step {step}"
            break
        res.stopped_early = spec.loss_guard.trip(step, res.loss[-1]) if spec.loss_guard else ""
        if res.stopped_early:
            break
        if (
            trip is not None and not trip.skipped and step + 1 == trip.step
        ):  # outside the timed step
            ckpt.save(engine, state["ckpt_dir"], trip.step, trip)
    res.peak_memory_bytes = monitor.peak()
    monitor.stop()
    measured = {p: v[wl.steps.warmup :] or v for p, v in phases.items()}
    res.phase_times_s = {p: statistics.median(v) for p, v in measured.items() if v}
    if trip is not None and not trip.skipped and len(res.loss) < total_steps:
        trip.skipped = (
            f"training stopped after {len(res.loss)} of {total_steps} steps "
            f"({res.status if res.status == 'nan' else 'loss guard'}), so the checkpoint "
            f"round trip was not tried"
        )
    if trip is not None:
        res.checkpoint = trip.to_dict()
    if res.status == "nan":
        return

    # ---- checksum and eval with the untouched reference model, on this rank's device ----
    t_checks = time.perf_counter()
    reference = None
    if (
        not res.stopped_early
    ):  # the loss invariant already failed: no eval (replicas still compared)
        # the untouched code (a patched trial's reference is the unpatched code dir), imported afresh
        ref_fn = import_entry(spec.reference_code_dir or spec.code_dir, entry_point)
        ref_job = job_for({}, reference=True, fn=ref_fn)
        reference = end_checks.build_reference(ref_job.build_model, dev)
    res.param_checksum = end_checks.checksum_and_load(model, state.get("ep_mod"), reference, dev)
    if reference is not None:
        res.eval_loss = end_checks.eval_loss(
            reference, source.eval_batch(), dev, vocab, forward=ref_job.forward
        )
        del reference
    res.end_checks_time_s = time.perf_counter() - t_checks
    res.status = "ok"
    if trip is not None and not trip.skipped:

        def rebuild() -> tuple[Any, Any, TrainingJob]:
            # the trial's own code imported afresh (the eval check imported the reference since), as
            # a restarted process would: module-level state starts over
            fresh_job = job_for(
                dict(build.model_options), fn=import_entry(spec.code_dir, entry_point)
            )
            torch.manual_seed(seed)
            with rank_setup.build_context(device, build.ds_config, partitioned=True):
                fresh = fresh_job.build_model()
            for transform in build.model_transforms:
                transform(fresh, fresh_job.shape)
            fresh_opt = rank_setup.make_optimizer(
                build.runtime["optimizer_impl"], list(fresh.parameters()), wl.optimizer
            )
            fresh_engine, *_ = deepspeed.initialize(
                model=fresh, optimizer=fresh_opt, config=build.ds_config
            )
            seams.configure_engine(fresh_engine)
            torch.set_num_threads(build.runtime["threads_per_worker"])
            return fresh_engine, fresh_opt, fresh_job

        del (
            engine,
            model,
            opt,
            counters,
            job,
        )  # nothing here may keep the trained engine alive past the restart
        _round_trip(trip, state, rebuild, seams, planned, vocab, loss_chunk, dev)
        res.checkpoint = trip.to_dict()


def _fused_loss(job: TrainingJob, chunk: int) -> Any:
    """The job's ``fused_loss`` when the ``fused_loss_tokens`` knob is on (None when it is off);
    ``JobError`` when the job cannot take it."""
    if not chunk:
        return None
    if job.fused_loss is None:
        raise JobError(
            f"knob {FUSED_LOSS_KNOB!r}={chunk}: this job gives no TrainingJob.fused_loss, so its loss "
            f"cannot be computed without the logits. Fix: give fused_loss (infrarsi/job.py), or "
            f"leave the knob at 0"
        )
    if job.loss is not None:
        raise JobError(
            f"knob {FUSED_LOSS_KNOB!r}={chunk}: this job back-propagates a loss of its own "
            f"(TrainingJob.loss, from the logits), which the fused loss never builds. Fix: leave the "
            f"knob at 0"
        )
    return job.fused_loss


def plan_round_trip(
    step: int | None, total_steps: int, expert_parallel: bool
) -> ckpt.RoundTrip | None:
    """The checkpoint round trip the spec asks for (``step``; None: none), skipped with the
    reason where it cannot be tried."""
    if step is None:
        return None
    if not 0 < int(step) < total_steps:
        raise ValueError(
            f"spec checkpoint_step={step}: must be between 1 and {total_steps - 1} (the steps "
            f"trained are {total_steps})"
        )
    trip = ckpt.RoundTrip(step=int(step))
    if expert_parallel:
        trip.skipped = (
            "expert parallelism: the experts' optimizer lives outside the DeepSpeed engine, so "
            "DeepSpeed's checkpoint does not hold its state"
        )
    return trip


def _round_trip(
    trip: ckpt.RoundTrip,
    state: dict[str, Any],
    rebuild: Any,
    seams: Seams,
    planned: list[list[Any]],
    vocab: int,
    loss_chunk: int,
    dev: torch.device,
) -> None:
    """The restart half of the checkpoint round trip (``checkpoint_trip``): destroy the trained
    engine, rebuild it from scratch (``rebuild() -> (engine, base optimizer, job)``), load the
    checkpoint, continue to the last step. A failure is recorded in ``trip.error``; the trial
    itself stays ``ok``."""
    counters = state.pop("counters", None)
    if counters is not None:
        counters.detach()
    old = state.pop("engine", None)
    state.pop("model", None)
    if old is not None:
        old.destroy()
    del old
    gc.collect()
    t0 = time.perf_counter()
    directory = state["ckpt_dir"]
    try:
        engine, opt, job = rebuild()
        state["engine"] = engine
    except Exception as e:
        trip.error = f"rebuilding the engine for the restart failed: {type(e).__name__}: {e}"[:800]
        ckpt.any_rank(True, dev)
        return
    if ckpt.any_rank(False, dev):
        trip.error = "rebuilding the engine for the restart failed on another rank"
        return
    loaded = ckpt.load(engine, directory, trip.step, trip)
    trip.restart_s = time.perf_counter() - t0
    ckpt.remove(directory)  # every rank has loaded (the load's all-reduce): the files can go
    if not loaded:
        return
    try:
        ckpt.continue_training(
            engine,
            opt,
            job,
            seams,
            planned,
            trip.step,
            vocab,
            ckpt.harness_loss(vocab, loss_chunk),
            trip,
        )
    except Exception as e:  # the uninterrupted run's measurements stand; the restart is what failed
        trip.error = f"training on after the restart failed: {type(e).__name__}: {e}"[:800]


def _seams(wl: Workload) -> Seams:
    """The honest seams, or the test-only seams ``wl.variant`` names (``module:attribute``,
    imported here on the rank: the job's code directory is on the path)."""
    if wl.variant is None:
        return HONEST
    import importlib

    module, _, attribute = wl.variant.partition(":")
    seams = getattr(importlib.import_module(module), attribute, None)
    if not isinstance(seams, Seams):
        raise JobError(
            f"variant: rule: 'module:attribute' names an infrarsi.execution.seams.Seams; "
            f"{wl.variant!r} is {type(seams).__name__}. Fix the attribute, or remove variant"
        )
    return seams


def _cleanup(state: dict[str, Any], device: str) -> None:
    counters = state.get("counters")
    if counters is not None:
        counters.detach()
    engine = state.pop("engine", None)
    if engine is not None:
        with contextlib.suppress(Exception):  # best effort; actors are recycled after failures
            engine.destroy()
    if state.get("ckpt_dir"):
        ckpt.remove(state["ckpt_dir"])
    state.clear()
    del engine
    gc.collect()
    # What survives a trial is the process's long-lived state (torch, DeepSpeed, Ray modules:
    # some 400k objects): frozen, the next trial's collection skips it (0.2 s -> ~0.01 s on CPU).
    gc.freeze()
    if device == "cuda":
        torch.cuda.empty_cache()


def _driver_version() -> str:
    """The GPU driver version from NVML (empty where NVML cannot be read)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:  # no NVML (a CPU node, a container without the library)
        return ""
