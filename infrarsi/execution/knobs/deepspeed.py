"""The built-in knob handlers: a knob config becomes a DeepSpeed config, model build options and an environment.

The ONE translation from a knob config to a trial build (DeepSpeed config dict, model build
options, harness runtime options, environment), plus the built-in knob handlers.

``build_trial(workload, config, world_size, num_params, hidden_size)`` starts from a base
DeepSpeed config (batch sizes from the workload's fixed tokens per step, no gradient clipping,
no DeepSpeed optimizer: the harness builds a torch AdamW and passes it in) and then applies the
registered handler of every knob, in ``HANDLER_ORDER`` (unknown knobs raise ``KnobError``
listing the known ones). Each handler's docstring names the DeepSpeed keys it sets; docs/KNOBS.md
has the table.
"""

from __future__ import annotations

from typing import Any

from infrarsi.errors import KnobError, WorkloadError
from infrarsi.execution.knobs.registry import KNOB_HANDLERS, KnobContext, TrialBuild, register_knob
from infrarsi.workload import Workload

DEFAULTS: dict[str, Any] = {
    "zero_stage": 0,
    "micro_batch_size": 1,
    "activation_checkpointing": "none",
    "dtype": "fp32",
    "offload_optimizer": False,
    "offload_param": False,
    "overlap_comm": False,
    "reduce_bucket_size": "auto",
    "allgather_bucket_size": "auto",
    "optimizer_impl": "adamw",
    "threads_per_worker": 1,
    "expert_parallel": False,
}
"""Value of each built-in knob when a config does not hold it."""

HANDLER_ORDER = list(DEFAULTS)
"""Built-in knobs are applied in this order (zero_stage first: later handlers read it)."""

DEEPSPEED_MAX_BUCKET = 500_000_000
"""DeepSpeed's default bucket size in elements (about 2 GB of fp32 buffers)."""


def auto_bucket_elements(num_params: int) -> int:
    """``auto`` bucket size: one bucket holds the whole model, capped at DeepSpeed's 5e8
    default and at least 1e6 elements. A 5M-parameter model gets a 5M-element bucket (20 MB)
    instead of DeepSpeed's 5e8 default (about 2 GB malloc'd, measured on CPU)."""
    return int(min(DEEPSPEED_MAX_BUCKET, max(num_params, 1_000_000)))


def _bucket(value: Any, ctx: KnobContext, knob: str) -> int:
    if value == "auto":
        return auto_bucket_elements(ctx.num_params)
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise KnobError(f"knob {knob!r}: expected 'auto' or a positive element count, got {value!r}") from None
    if n <= 0:
        raise KnobError(f"knob {knob!r}: bucket size must be > 0 elements, got {n}")
    return n


def _zero(build: TrialBuild) -> dict[str, Any]:
    return build.ds_config.setdefault("zero_optimization", {"stage": 0})


@register_knob("zero_stage")
def zero_stage(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """ZeRO stage 0-3. Sets ``zero_optimization.stage``; for stage 3 also
    ``stage3_prefetch_bucket_size`` (min(5e7, num_params)), ``stage3_max_live_parameters`` and
    ``stage3_max_reuse_distance`` (min(1e9, num_params)) and
    ``stage3_param_persistence_threshold`` (10 x hidden)."""
    stage = int(value)
    if stage not in (0, 1, 2, 3):
        raise KnobError(f"knob 'zero_stage': must be 0, 1, 2 or 3, got {value!r}")
    z = _zero(build)
    z["stage"] = stage
    if stage == 3:
        # DeepSpeed's defaults (5e7 prefetch, 1e9 live/reuse), capped at the model size.
        n = max(int(ctx.num_params), 1)
        z["stage3_prefetch_bucket_size"] = min(50_000_000, n)
        z["stage3_param_persistence_threshold"] = 10 * ctx.hidden_size
        z["stage3_max_live_parameters"] = min(1_000_000_000, n)
        z["stage3_max_reuse_distance"] = min(1_000_000_000, n)


@register_knob("micro_batch_size")
def micro_batch_size(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """Sequences per rank per forward. Gradient accumulation is derived from the fixed global
    batch: ``accum = global_batch / (micro_batch_size x world_size)``. Sets
    ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps`` and ``train_batch_size``;
    raises ``KnobError`` when it does not divide."""
    mbs = int(value)
    per_step = mbs * ctx.world_size
    if mbs <= 0 or ctx.global_batch_size % per_step:
        raise KnobError(
            f"knob 'micro_batch_size'={value!r}: the global batch of {ctx.global_batch_size} sequences "
            f"(tokens_per_step / seq_len) must be a multiple of micro_batch_size x world_size = "
            f"{mbs} x {ctx.world_size}; pick a micro-batch size that divides "
            f"{ctx.global_batch_size // ctx.world_size if ctx.global_batch_size % ctx.world_size == 0 else ctx.global_batch_size}."
        )
    build.ds_config["train_micro_batch_size_per_gpu"] = mbs
    build.ds_config["gradient_accumulation_steps"] = ctx.global_batch_size // per_step
    build.ds_config["train_batch_size"] = ctx.global_batch_size
    build.runtime["micro_batch_size"] = mbs
    build.runtime["grad_accum_steps"] = ctx.global_batch_size // per_step


@register_knob("activation_checkpointing")
def activation_checkpointing(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """``none`` | ``selective`` (attention sub-layer of every block) | ``full`` (every block),
    with ``torch.utils.checkpoint`` in the model code. Sets model option
    ``activation_checkpointing``; no DeepSpeed key."""
    if value not in ("none", "selective", "full"):
        raise KnobError(f"knob 'activation_checkpointing': must be none, selective or full, got {value!r}")
    build.model_options["activation_checkpointing"] = value


@register_knob("dtype")
def dtype(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """``fp32`` | ``bf16``. bf16 sets ``bf16.enabled: true``: bf16 weights and activations, with
    fp32 master weights in the optimizer under ZeRO 1-3. Under ZeRO-0 DeepSpeed keeps no fp32
    masters (its ``DDP_BFLOAT16`` path updates the bf16 weights), a different arithmetic that the
    loss and eval invariants judge like any other. Sets runtime ``dtype``."""
    if value not in ("fp32", "bf16"):
        raise KnobError(f"knob 'dtype': must be fp32 or bf16, got {value!r}")
    build.runtime["dtype"] = value
    if value == "bf16":
        build.ds_config["bf16"] = {"enabled": True}
    else:
        build.ds_config.pop("bf16", None)


@register_knob("offload_optimizer")
def offload_optimizer(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """ZeRO-Offload of optimizer state to CPU. True sets
    ``zero_optimization.offload_optimizer = {device: cpu, pin_memory: <on GPU>}`` (needs
    zero_stage >= 1) and keeps the harness's torch AdamW (``zero_force_ds_cpu_optimizer: false``)."""
    if not value:
        return
    z = _zero(build)
    if z.get("stage", 0) < 1:
        raise KnobError(f"knob 'offload_optimizer'=true needs zero_stage >= 1, got zero_stage={z.get('stage', 0)}")
    z["offload_optimizer"] = {"device": "cpu", "pin_memory": ctx.device == "cuda"}


@register_knob("offload_param")
def offload_param(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """ZeRO-3 parameter offload to CPU. True sets
    ``zero_optimization.offload_param = {device: cpu, pin_memory: <on GPU>}`` (needs zero_stage 3)."""
    if not value:
        return
    z = _zero(build)
    if z.get("stage", 0) != 3:
        raise KnobError(f"knob 'offload_param'=true needs zero_stage == 3, got zero_stage={z.get('stage', 0)}")
    z["offload_param"] = {"device": "cpu", "pin_memory": ctx.device == "cuda"}


@register_knob("overlap_comm")
def overlap_comm(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """Overlap gradient reduction with backward. Sets ``zero_optimization.overlap_comm``
    (double-buffers the reduce bucket)."""
    _zero(build)["overlap_comm"] = bool(value)


@register_knob("reduce_bucket_size")
def reduce_bucket_size(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """Elements per gradient-reduction bucket, or ``auto`` (``auto_bucket_elements``: the model
    size, capped at 5e8). Sets ``zero_optimization.reduce_bucket_size``."""
    _zero(build)["reduce_bucket_size"] = _bucket(value, ctx, "reduce_bucket_size")


@register_knob("allgather_bucket_size")
def allgather_bucket_size(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """Elements per ZeRO-1/2 parameter all-gather bucket, or ``auto`` (as reduce_bucket_size).
    Sets ``zero_optimization.allgather_bucket_size``."""
    _zero(build)["allgather_bucket_size"] = _bucket(value, ctx, "allgather_bucket_size")


OPTIMIZER_IMPLS = ("adamw", "adamw_foreach", "adamw_fused")


@register_knob("optimizer_impl")
def optimizer_impl(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """Implementation of the harness-built ``torch.optim.AdamW`` passed to
    ``deepspeed.initialize``: ``adamw`` (for-loop), ``adamw_foreach``, ``adamw_fused``. Sets
    runtime ``optimizer_impl``; no DeepSpeed key (no ``optimizer`` block: DeepSpeedCPUAdam's
    compile is avoided)."""
    if value not in OPTIMIZER_IMPLS:
        raise KnobError(f"knob 'optimizer_impl': must be one of {OPTIMIZER_IMPLS}, got {value!r}")
    build.runtime["optimizer_impl"] = value


def _omp_threads(value: Any) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(int(value))}


@register_knob("threads_per_worker", process_env=_omp_threads)
def threads_per_worker(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """Intra-op CPU threads per rank: ``torch.set_num_threads`` in each rank, and
    ``OMP_NUM_THREADS`` in its environment at process start (a new value starts fresh rank
    processes). Sets runtime ``threads_per_worker``."""
    n = int(value)
    if n <= 0:
        raise KnobError(f"knob 'threads_per_worker': must be >= 1, got {value!r}")
    build.runtime["threads_per_worker"] = n
    build.env.update(_omp_threads(n))


@register_knob("expert_parallel")
def expert_parallel(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """MoE only: shard the experts over all ranks (ep_size = world size) and exchange tokens
    with all-to-all. Sets model option ``expert_parallel`` and ``ep_size``; expert parameters are
    kept out of DeepSpeed (no DeepSpeed key) and stepped by the harness. Not with ZeRO-3."""
    on = bool(value)
    build.model_options["expert_parallel"] = on
    build.model_options["ep_size"] = ctx.world_size if on else 1
    if on and _zero(build).get("stage", 0) == 3:
        raise KnobError("knob 'expert_parallel'=true is not supported with zero_stage=3; use zero_stage <= 2")


def base_ds_config(workload: Workload, world_size: int) -> dict[str, Any]:
    """DeepSpeed keys every trial shares (before any knob handler runs)."""
    return {
        "train_batch_size": workload.global_batch_size,
        "train_micro_batch_size_per_gpu": workload.global_batch_size // world_size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "zero_optimization": {"stage": 0},
    }


def build_trial(
    workload: Workload, config: dict[str, Any], world_size: int, num_params: int, hidden_size: int
) -> TrialBuild:
    """Translate a knob ``config`` into a ``TrialBuild`` for ``workload`` on ``world_size``
    ranks. Built-in knobs missing from ``config`` take ``DEFAULTS``; every knob in ``config``
    must have a registered handler. Raises ``KnobError`` / ``WorkloadError`` naming the value."""
    if workload.global_batch_size % world_size:
        raise WorkloadError(
            f"workload {workload.name!r}: global batch {workload.global_batch_size} sequences is not "
            f"divisible by world size {world_size}; change tokens_per_step or resources.workers."
        )
    unknown = [k for k in config if k not in KNOB_HANDLERS]
    if unknown:
        raise KnobError(f"knob(s) {unknown} have no handler. Known knobs: {sorted(KNOB_HANDLERS)}.")
    full = {**DEFAULTS, **config}
    ctx = KnobContext(
        world_size=world_size, num_params=num_params, hidden_size=hidden_size,
        global_batch_size=workload.global_batch_size, seq_len=workload.data.seq_len,
        device=workload.resources.device, config=full,
    )
    build = TrialBuild(ds_config=base_ds_config(workload, world_size))
    order = HANDLER_ORDER + [k for k in config if k not in HANDLER_ORDER]
    for name in order:
        KNOB_HANDLERS[name](full[name], build, ctx)
    return build
