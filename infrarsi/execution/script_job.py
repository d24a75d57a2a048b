"""One trial of a user's own training script on one rank.

``run_script_rank(spec) -> dict`` is the worker entry (``SCRIPT_ENTRY``) the ``TrialRunner``
uses for a workload with ``script:``. It runs in the rank's ``TrainWorker`` process, after the
harness's ``torch.distributed`` group is up, and returns the same ``RankResult`` as the
entry-point loop (``rank_loop.run_rank``), so aggregation, invariants, log rows and stages do
not know the difference.

How the script runs (the process is the rank's warm Ray actor, reused by later trials):

- the launcher's environment: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
  ``MASTER_ADDR``, ``MASTER_PORT`` (the worker set them when it joined the group; ``LOCAL_RANK``
  is 0 on cuda, where the rank sees its own GPU only); ``sys.argv`` = the script and
  ``script.args``, plus ``--local_rank=N`` for the ``deepspeed`` launcher; the working directory
  is the workload YAML's folder, and the script's folder leads ``sys.path`` (as ``python
  train.py`` does); then ``runpy.run_path(script, run_name="__main__")``. All of it is restored
  afterwards.
- the process group is the harness's: ``deepspeed.init_distributed()`` (also inside
  ``deepspeed.initialize``) finds it initialised and wraps it; ``torch.distributed``'s
  ``init_process_group`` and ``destroy_process_group`` are no-ops while the script runs (the
  group outlives the trial: a warm worker runs the next one in it).
- ``deepspeed.initialize`` is replaced for the run (also where accelerate or transformers, loaded
  earlier, hold it under their own name: ``rebind``; a Hugging Face ``Trainer`` reaches it through
  accelerate, and its ``TrainingArguments`` get the trial's batch, precision and checkpointing
  first: ``script_hf``): the script's config (``config=`` or
  ``--deepspeed_config``) gets the trial's knobs merged in (``script_config``), DeepSpeed builds
  the engine from the merged config, and ``EngineTap`` taps it (``engine_tap``).
- the trial ends when the tap raises ``TrialComplete`` out of the script's ``engine.step()``
  after the contract's last step; then the parameter checksum of the replicas, the peak memory,
  and the cleanup (tap removed, engine destroyed, the script's frames cleared, ``gc``).
- failure is a row: a script that raises, exits (``SystemExit``, any code), returns before the
  contract's steps, or never calls ``deepspeed.initialize`` gives ``failed`` with its own
  traceback in ``error`` (``oom`` for an out-of-memory error).

The spec is a ``RankSpec`` as for ``rank_loop`` (``seed`` unused: the script seeds itself), with
``script`` and ``script_cwd`` set (both relative to ``code_dir``).
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import os
import runpy
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from infrarsi.errors import WorkloadError
from infrarsi.execution import checkpoint_trip as ckpt
from infrarsi.execution import end_checks
from infrarsi.execution.engine_tap import EngineTap, TrialComplete
from infrarsi.execution.knobs.deepspeed import build_trial
from infrarsi.execution.memory import MemoryMonitor, is_oom
from infrarsi.execution.rank_loop import plan_round_trip, start_rank
from infrarsi.execution.rank_result import RankResult
from infrarsi.execution.rank_spec import RankSpec
from infrarsi.execution.script_config import merge_trial_config, script_ds_config
from infrarsi.execution.script_hf import (
    TrainerOverrides,
    patched_post_init,
    reset_accelerate,
    trainer_overrides,
)
from infrarsi.execution.script_launch import launched, script_argv
from infrarsi.execution.script_source import read_script
from infrarsi.execution.worker import SCRIPT_ENTRY
from infrarsi.workload import Workload

ERROR_TAIL_CHARS = 4000
"""The tail of a failure's traceback kept in the row's ``error`` (as ``rank_loop``)."""


def hidden_size_of(model: torch.nn.Module) -> int:
    """The model's hidden size as the knobs' ZeRO-3 heuristics want it: the first embedding's
    width, else the widest input of a linear layer (0 when neither exists)."""
    for m in model.modules():
        if isinstance(m, torch.nn.Embedding):
            return int(m.embedding_dim)
    widths = [int(m.in_features) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return max(widths, default=0)


@dataclass
class Restart:
    """The restarted half of a script trial's checkpoint round trip (``_round_trip``)."""

    trip: ckpt.RoundTrip
    """The round trip being run; its ``step`` is the optimizer steps the checkpoint holds."""
    directory: str
    """Where the uninterrupted run saved the checkpoint (``checkpoint_trip.shared_temp_dir``)."""


class ScriptRun:
    """The state of one script run on one rank: the spec, the tap, the engine the script got."""

    def __init__(
        self,
        spec: RankSpec,
        wl: Workload,
        res: RankResult,
        monitor: MemoryMonitor,
        *,
        after_step: Callable[[int], None] | None = None,
        restart: Restart | None = None,
    ) -> None:
        self.spec = spec
        self.wl = wl
        self.res = res
        self.monitor = monitor
        self.config = dict(spec.config)
        """The trial's knob config."""
        self.cwd = str(Path(spec.code_dir) / spec.script_cwd)
        """The working directory of the script (the workload YAML's folder in the trial's code)."""
        guard = spec.loss_guard
        script = Path(spec.code_dir) / spec.script if spec.script else None
        self.trainer = script is not None and read_script(script).kind == "hf_trainer"
        """The script is a Hugging Face ``Trainer`` script (``script_hf``)."""
        self.restart = restart
        """Set for the restarted run of a checkpoint round trip: ``initialize`` loads the
        checkpoint and the tap passes over the steps it holds."""
        skip = restart.trip.step if restart is not None else 0
        self.tap = EngineTap(
            spec.steps_to_train(wl.steps.warmup, wl.steps.measured) - skip,
            wl.resources.device,
            monitor,
            loss_guard=guard.trip if guard is not None and restart is None else None,
            loss_reduction="step_sum" if self.trainer else "token_mean",
            after_step=after_step,
            skip_steps=skip,
        )
        """The harness's tap on the engine (attached by ``initialize``)."""
        self.initialized = False
        """True once the script called ``deepspeed.initialize``."""
        self._t_start = time.perf_counter()

    def initialize(self, real: Any, *a: Any, **k: Any) -> Any:
        """``deepspeed.initialize`` as the script sees it: the trial's config merged in, the
        engine tapped (see the module docstring)."""
        if self.initialized:
            raise WorkloadError(
                "script: deepspeed.initialize was called a second time in one run; infrarsi "
                "tunes one engine per trial"
            )
        bound = inspect.signature(real).bind(*a, **k)
        kw = dict(bound.arguments)
        model = kw.get("model")
        if not isinstance(model, torch.nn.Module):
            raise WorkloadError(
                f"script: deepspeed.initialize needs model= a torch.nn.Module, got {type(model).__name__}"
            )
        args = kw.get("args")
        script_cfg = script_ds_config(
            args, kw.pop("config", None), kw.pop("config_params", None), cwd=self.cwd
        )
        num_params = sum(int(getattr(p, "ds_numel", p.numel())) for p in model.parameters())
        hidden = hidden_size_of(model)
        world = self.res.world_size
        build = build_trial(self.wl, self.config, world, num_params, hidden)
        if build.model_transforms:  # init pins such knobs; a hand-made config must not slip past
            raise WorkloadError(
                f"script: the config {dict(self.config)} changes the model the script built "
                f"(a knob such as float8_linear), which a script run cannot do. Fix: leave those "
                f"knobs at their defaults for a script workload (init pins them)."
            )
        merged = merge_trial_config(
            script_cfg,
            build.ds_config,
            list(self.config),
            num_params=num_params,
            hidden_size=hidden,
            client_optimizer=kw.get("optimizer") is not None,
        )
        if args is not None and (
            hasattr(args, "deepspeed_config") or hasattr(args, "deepscale_config")
        ):
            import argparse

            args = argparse.Namespace(**vars(args))  # the script's own args object stays as it was
            for name in ("deepspeed_config", "deepscale_config"):
                if hasattr(args, name):
                    setattr(args, name, None)
            kw["args"] = args
        kw["config"] = merged
        res = self.res
        res.num_params = num_params
        res.micro_batch_size = int(merged["train_micro_batch_size_per_gpu"])
        res.grad_accum_steps = int(merged["gradient_accumulation_steps"])
        res.ds_config = merged
        self.monitor.attach(model)
        self.initialized = True
        out = real(**kw)
        torch.set_num_threads(build.runtime["threads_per_worker"])
        self.tap.attach(out[0])
        self.monitor.check("engine_init")
        res.setup_time_s = time.perf_counter() - self._t_start
        if self.restart is not None:  # the script goes on from the checkpoint's state
            trip = self.restart.trip
            loaded = ckpt.load(out[0], self.restart.directory, trip.step, trip)
            trip.restart_s = time.perf_counter() - self._t_start
            if not loaded:
                raise TrialComplete(trip.error)
        return out

    def trainer_overrides(self) -> TrainerOverrides:
        """The ``TrainingArguments`` fields of this trial (a ``Trainer`` script; ``script_hf``)."""
        build = build_trial(
            self.wl, self.config, self.res.world_size, 1, 1
        )  # the batch keys need no model
        cpu = self.wl.resources.device == "cpu" and self.res.world_size > 1
        return trainer_overrides(
            build.ds_config,
            self.config,
            self.res.world_size,
            ddp_backend=dist.get_backend() if cpu else None,  # accelerate finds none on a CPU
        )

    def read_config(self, value: Any) -> dict[str, Any]:
        """The script's DeepSpeed config given as a path (relative to its working directory) or a dict."""
        return script_ds_config(None, value, None, cwd=self.cwd)

    def run(self, script: str, argv: list[str], t_start: float) -> None:
        """Run the script to the tap's ``TrialComplete``; raises what the script raised, or
        ``WorkloadError`` when it ended without the contract's steps."""
        self._t_start = t_start
        try:
            runpy.run_path(script, run_name="__main__")
        except TrialComplete:
            return
        except SystemExit as e:
            raise WorkloadError(
                f"script: {self._where()} exited (SystemExit code {e.code!r}) before the contract's "
                f"{self.tap.total_steps} optimizer steps\n{_script_traceback(e)[-3000:]}"
            ) from None
        if not self.initialized:
            raise WorkloadError(
                f"script: {self._where()} finished without calling deepspeed.initialize: infrarsi "
                f"reaches a script through its DeepSpeed engine. Fix: build the engine with "
                f"deepspeed.initialize(args=..., model=..., ...)"
            )
        raise WorkloadError(
            f"script: {self._where()} returned after {len(self.tap.record.loss)} of the contract's "
            f"{self.tap.total_steps} optimizer steps. Fix: let it train at least that many steps "
            f"(its own arguments in script.args)"
        )

    def _where(self) -> str:
        return f"{self.spec.script} (after {len(self.tap.record.loss)} optimizer steps)"


def _script_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))[-ERROR_TAIL_CHARS:]


def run_script_rank(raw_spec: dict[str, Any]) -> dict[str, Any]:
    """Run one trial of the workload's script on this rank (``raw_spec``: a ``RankSpec.to_dict``);
    see the module docstring."""
    t_start = time.perf_counter()
    spec = RankSpec.from_dict(raw_spec)
    res, wl, monitor = start_rank(spec)
    device = wl.resources.device
    res.warmup_steps = wl.steps.warmup
    run: ScriptRun | None = None
    try:
        run = ScriptRun(spec, wl, res, monitor)
        _run(spec, wl, run, t_start)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        if is_oom(exc):
            res.status, res.memory_censored = "oom", True
            res.peak_memory_bytes = monitor.oom_lower_bound()
            res.error = monitor.describe_oom(exc)
        else:
            res.status = "failed"
            res.error = (
                str(exc)[-ERROR_TAIL_CHARS:]
                if isinstance(exc, WorkloadError)
                else _script_traceback(exc)
            )
        traceback.clear_frames(exc.__traceback__)
        del exc
    finally:
        monitor.stop()
        res.device_used_peak_bytes = monitor.device_used_peak_bytes
        _cleanup(run, device)
        if device == "cuda":
            res.leftover_device_bytes = int(torch.cuda.memory_allocated())
    return asdict(res)


def _run(spec: RankSpec, wl: Workload, run: ScriptRun, t_start: float) -> None:
    import deepspeed

    if wl.script is None:
        raise WorkloadError(
            f"{wl.path or wl.name}: field 'script': the script entry needs a script workload"
        )
    res = run.res
    device = wl.resources.device
    script = str(Path(spec.code_dir) / str(spec.script))
    local_rank = 0 if device == "cuda" else int(os.environ.get("LOCAL_RANK", res.rank))
    env = {"RANK": str(res.rank), "WORLD_SIZE": str(res.world_size), "LOCAL_RANK": str(local_rank)}
    for key in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        if key in os.environ:
            env[key] = os.environ[key]
    threads = int(run.config.get("threads_per_worker", 1))
    torch.set_num_threads(threads)
    if device == "cpu":  # as rank_loop: free here, and the losses repeat
        torch.use_deterministic_algorithms(True, warn_only=True)
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = (
        False  # as rank_loop: no JIT shm op on CPU
    )
    deepspeed.init_distributed(dist_backend=dist.get_backend(), dist_init_required=False)
    argv = script_argv(script, list(wl.script.args), wl.script.launcher, local_rank)
    trip, ckpt_dir = _plan_round_trip(spec, run.tap.total_steps)
    if trip is not None and not trip.skipped:
        step = trip.step

        def save_at(done: int) -> None:  # right after step S, outside its clock
            if done == step:
                ckpt.save(run.tap.engine, ckpt_dir, step, trip)

        run.tap.after_step = save_at
    run.monitor.start()
    try:
        _launch(run, script, argv, env, t_start)
    except BaseException:
        if ckpt_dir:
            ckpt.remove(ckpt_dir)
        raise
    rec = run.tap.record
    res.step_times_s = list(rec.step_times_s)
    res.loss = list(rec.loss)
    res.tokens_seen = list(rec.tokens_seen)
    res.data_digests = list(rec.data_digests)
    res.sequences_seen = list(rec.sequences_seen)
    res.optimizer_steps = rec.optimizer_steps
    res.peak_memory_bytes = run.monitor.peak()
    run.monitor.stop()
    if rec.stop_kind == "nan":
        res.status, res.error = "nan", rec.stop_reason
        if trip is not None:
            trip.skipped = trip.skipped or f"{rec.stop_reason}: the round trip was not tried"
            res.checkpoint = trip.to_dict()
            ckpt.remove(ckpt_dir)
        return
    if rec.stop_kind == "no_loss":
        raise WorkloadError(f"script: {rec.stop_reason}")
    if rec.stop_kind == "guard":
        res.stopped_early = rec.stop_reason
    t_checks = time.perf_counter()
    engine = run.tap.engine
    if (
        engine is not None
    ):  # replicas must agree (gradient all-reduce): the same check as rank_loop's
        res.param_checksum = end_checks.checksum_and_load(engine.module)
    res.end_checks_time_s = time.perf_counter() - t_checks
    res.peak_flops_per_s = spec.peak_flops_per_s
    res.status = "ok"
    if trip is not None:
        if not trip.skipped and len(rec.loss) < run.tap.total_steps:
            trip.skipped = (
                f"training stopped after {len(rec.loss)} of {run.tap.total_steps} steps (loss "
                f"guard), so the checkpoint round trip was not tried"
            )
        if trip.skipped:
            ckpt.remove(ckpt_dir)
        else:
            _cleanup(run, device)  # the trained engine goes before the restarted one is built
            _round_trip(spec, wl, run, Restart(trip, ckpt_dir), script, argv, env)
        res.checkpoint = trip.to_dict()


def _launch(run: ScriptRun, script: str, argv: list[str], env: dict[str, str], t0: float) -> None:
    """Run the script once in the launcher's world (``script_launch``), a ``Trainer`` script's
    ``TrainingArguments`` given the trial's values (``script_hf``)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(launched(argv, run.cwd, str(Path(script).parent), env, run))
        if run.trainer:  # the trial's batch reaches TrainingArguments too
            try:
                from transformers.training_args import TrainingArguments
            except ImportError as e:
                raise WorkloadError(
                    f"script: {run.spec.script} is a Hugging Face Trainer script, and transformers "
                    f"cannot be imported here ({e}). Fix: pip install 'infrarsi[hf]'"
                ) from None
            stack.enter_context(
                patched_post_init(TrainingArguments, run.trainer_overrides, run.read_config)
            )
        run.run(script, argv, t0)


def _plan_round_trip(spec: RankSpec, total_steps: int) -> tuple[ckpt.RoundTrip | None, str]:
    """The checkpoint round trip the spec asks for (``rank_loop.plan_round_trip``; None: none)
    and the directory its files go to (collective: every rank calls this)."""
    trip = plan_round_trip(spec.checkpoint_step, total_steps, expert_parallel=False)
    return trip, (ckpt.shared_temp_dir() if trip is not None else "")


def _round_trip(
    spec: RankSpec,
    wl: Workload,
    first: ScriptRun,
    restart: Restart,
    script: str,
    argv: list[str],
    env: dict[str, str],
) -> None:
    """The restarted half of the round trip: the script launched again, unchanged, as a user
    resuming would; at its ``deepspeed.initialize`` the engine loads the step-S checkpoint
    (weights, optimizer, DeepSpeed's scheduler), the tap passes over the script's first S steps
    untrained (its data loader advances as before) and records the steps after. The continued
    losses go to ``trip.loss``; a data order that differs from the uninterrupted run's, or a
    failure, to ``trip.error``. The trial itself stays ``ok``: its uninterrupted run was measured."""
    trip, t0 = restart.trip, time.perf_counter()
    monitor = MemoryMonitor(wl.resources.device, spec.memory_capacity_bytes)
    run = ScriptRun(spec, wl, replace(first.res), monitor, restart=restart)
    try:
        monitor.start()
        _launch(run, script, argv, env, t0)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        trip.error = trip.error or (
            "the script restarted from the checkpoint failed: "
            + (str(exc) if isinstance(exc, WorkloadError) else _script_traceback(exc))[-1500:]
        )
        traceback.clear_frames(exc.__traceback__)
    finally:
        monitor.stop()
        _cleanup(run, wl.resources.device)
        ckpt.remove(restart.directory)
    trip.continue_s = time.perf_counter() - t0 - trip.restart_s
    if trip.error:
        trip.loss = []
        return
    rec = run.tap.record
    trip.loss = list(rec.loss)
    expected = first.tap.record.data_digests[trip.step : trip.step + len(rec.data_digests)]
    if rec.data_digests != expected:
        at = next(
            (i for i, (a, b) in enumerate(zip(rec.data_digests, expected, strict=False)) if a != b),
            min(len(rec.data_digests), len(expected)),
        )
        trip.error = (
            f"the script restarted from the step-{trip.step} checkpoint was fed other tokens at "
            f"step {trip.step + at} than the uninterrupted run: its data order does not resume "
            f"with the checkpoint (a loader that restarts from the first batch, or shuffles by "
            f"epoch). A run resumed this way trains on different data"
        )


def _cleanup(run: ScriptRun | None, device: str) -> None:
    """Tap removed, engine destroyed, garbage collected: nothing of the script outlives the trial."""
    if run is not None:
        engine = run.tap.engine
        run.tap.detach()
        if engine is not None:
            with contextlib.suppress(Exception):  # best effort; actors are recycled after failures
                engine.destroy()
        del engine
        run.tap.engine = None
        if run.trainer:  # accelerate's process-wide state, made by this trial's Trainer
            reset_accelerate()
    gc.collect()
    gc.freeze()  # as rank_loop: the long-lived state is skipped by the next trial's collections
    if device == "cuda":
        torch.cuda.empty_cache()


__all__ = ["SCRIPT_ENTRY", "ScriptRun", "hidden_size_of", "run_script_rank"]
