"""The built-in knob handlers: a knob config becomes a DeepSpeed config, model build options and an environment.

The ONE translation from a knob config to a trial build (DeepSpeed config dict, model build
options, harness runtime options, environment), plus the built-in knob handlers.

``build_trial(workload, config, world_size, num_params, hidden_size)`` starts from a base
DeepSpeed config (batch sizes from the workload's fixed tokens per step, no gradient clipping,
no DeepSpeed optimizer: the harness builds a torch AdamW and passes it in) and then applies the
registered handler of every knob, in ``handler_order()`` (the registrations' ``after=``;
unknown knobs raise ``KnobError`` listing the known ones). Each registration declares the knob's
values, default and memory tag, and its handler's docstring names the DeepSpeed keys it sets;
docs/KNOBS.md is generated from them (``python -m infrarsi.execution.knobs.docs``).
"""

from __future__ import annotations

from typing import Any

from infrarsi.errors import KnobError, WorkloadError
from infrarsi.execution.knobs.registry import (
    KNOB_HANDLERS,
    KnobContext,
    TrialBuild,
    boolean,
    either,
    handler_order,
    integer,
    knob_defaults,
    one_of,
    register_knob,
)
from infrarsi.knob_names import (
    ACTIVATION_CHECKPOINTING,
    ALLGATHER_BUCKET_SIZE,
    DTYPE,
    EXPERT_PARALLEL,
    MICRO_BATCH_SIZE,
    OFFLOAD_OPTIMIZER,
    OFFLOAD_PARAM,
    OPTIMIZER_IMPL,
    OVERLAP_COMM,
    REDUCE_BUCKET_SIZE,
    THREADS_PER_WORKER,
    ZERO_STAGE,
)
from infrarsi.workload import Workload

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
        raise KnobError(
            f"knob {knob!r}: expected 'auto' or a positive element count, got {value!r}"
        ) from None
    if n <= 0:
        raise KnobError(f"knob {knob!r}: bucket size must be > 0 elements, got {n}")
    return n


def _zero(build: TrialBuild) -> dict[str, Any]:
    return build.ds_config.setdefault("zero_optimization", {"stage": 0})


BUCKET = either(one_of("auto"), integer(lo=1))
"""A bucket size: ``auto`` or a positive element count."""


@register_knob(ZERO_STAGE, values=one_of(0, 1, 2, 3), default=0, memory="saver", speed="slower")
def zero_stage(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """ZeRO partitioning of optimizer state (1), gradients (2) and parameters (3).

    Sets ``zero_optimization.stage``; at 3 also ``stage3_prefetch_bucket_size`` = min(5e7,
    num_params), ``stage3_max_live_parameters`` and ``stage3_max_reuse_distance`` = min(1e9,
    num_params) (DeepSpeed's defaults capped at the model size) and
    ``stage3_param_persistence_threshold`` = 10 x hidden."""
    stage = int(value)
    if stage not in (0, 1, 2, 3):
        raise KnobError(f"knob {ZERO_STAGE!r}: must be 0, 1, 2 or 3, got {value!r}")
    z = _zero(build)
    z["stage"] = stage
    if stage == 3:
        # DeepSpeed's defaults (5e7 prefetch, 1e9 live/reuse), capped at the model size.
        n = max(int(ctx.num_params), 1)
        z["stage3_prefetch_bucket_size"] = min(50_000_000, n)
        z["stage3_param_persistence_threshold"] = 10 * ctx.hidden_size
        z["stage3_max_live_parameters"] = min(1_000_000_000, n)
        z["stage3_max_reuse_distance"] = min(1_000_000_000, n)


@register_knob(MICRO_BATCH_SIZE, values=integer(lo=1), default=1, memory="hungry", speed="faster")
def micro_batch_size(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """Sequences per rank per forward; gradient accumulation is derived from the fixed global batch.

    ``accum = global_batch / (micro_batch_size x world_size)``, a ``KnobError`` naming the
    numbers when it does not divide. Sets ``train_micro_batch_size_per_gpu``,
    ``gradient_accumulation_steps`` and ``train_batch_size``."""
    mbs = int(value)
    per_step = mbs * ctx.world_size
    if mbs <= 0 or ctx.global_batch_size % per_step:
        whole = ctx.global_batch_size % ctx.world_size == 0
        per_rank = ctx.global_batch_size // ctx.world_size if whole else ctx.global_batch_size
        raise KnobError(
            f"knob {MICRO_BATCH_SIZE!r}={value!r}: the global batch of {ctx.global_batch_size} sequences "
            f"(tokens_per_step / seq_len) must be a multiple of micro_batch_size x world_size = "
            f"{mbs} x {ctx.world_size}; pick a micro-batch size that divides {per_rank}."
        )
    build.ds_config["train_micro_batch_size_per_gpu"] = mbs
    build.ds_config["gradient_accumulation_steps"] = ctx.global_batch_size // per_step
    build.ds_config["train_batch_size"] = ctx.global_batch_size
    build.runtime["micro_batch_size"] = mbs
    build.runtime["grad_accum_steps"] = ctx.global_batch_size // per_step


@register_knob(
    ACTIVATION_CHECKPOINTING,
    values=one_of("none", "selective", "full"),
    default="none",
    memory="saver",
    speed="slower",
)
def activation_checkpointing(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """Recomputation with ``torch.utils.checkpoint`` (non-reentrant) in the model code.

    ``selective``: the attention sub-layer of every block; ``full``: every block. Sets model
    option ``activation_checkpointing``; no DeepSpeed key."""
    if value not in ("none", "selective", "full"):
        raise KnobError(
            f"knob {ACTIVATION_CHECKPOINTING!r}: must be none, selective or full, got {value!r}"
        )
    build.model_options["activation_checkpointing"] = value


@register_knob(DTYPE, values=one_of("fp32", "bf16"), default="fp32")
def dtype(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """The compute dtype: bf16 weights and activations, with fp32 master weights under ZeRO 1-3.

    bf16 sets ``bf16.enabled: true``. Under ZeRO-0 DeepSpeed keeps no fp32 masters (its
    ``DDP_BFLOAT16`` path updates the bf16 weights), a different arithmetic that the loss and eval
    invariants judge like any other; the harness's loss is computed in fp32. Sets runtime
    ``dtype``."""
    if value not in ("fp32", "bf16"):
        raise KnobError(f"knob {DTYPE!r}: must be fp32 or bf16, got {value!r}")
    build.runtime["dtype"] = value
    if value == "bf16":
        build.ds_config["bf16"] = {"enabled": True}
    else:
        build.ds_config.pop("bf16", None)


@register_knob(
    OFFLOAD_OPTIMIZER,
    values=boolean(),
    default=False,
    memory="saver",
    speed="slower",
    after=(ZERO_STAGE,),
)
def offload_optimizer(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """ZeRO-Offload of the optimizer state to CPU (needs zero_stage >= 1).

    True sets ``zero_optimization.offload_optimizer = {device: cpu, pin_memory: <on GPU>}`` and
    keeps the harness's torch AdamW (``zero_force_ds_cpu_optimizer: false``)."""
    if not value:
        return
    z = _zero(build)
    if z.get("stage", 0) < 1:
        raise KnobError(
            f"knob {OFFLOAD_OPTIMIZER!r}=true needs zero_stage >= 1, got zero_stage={z.get('stage', 0)}"
        )
    z["offload_optimizer"] = {"device": "cpu", "pin_memory": ctx.device == "cuda"}


@register_knob(
    OFFLOAD_PARAM,
    values=boolean(),
    default=False,
    memory="saver",
    speed="slower",
    after=(ZERO_STAGE,),
)
def offload_param(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """ZeRO-3 parameter offload to CPU (needs zero_stage 3).

    True sets ``zero_optimization.offload_param = {device: cpu, pin_memory: <on GPU>}``."""
    if not value:
        return
    z = _zero(build)
    if z.get("stage", 0) != 3:
        raise KnobError(
            f"knob {OFFLOAD_PARAM!r}=true needs zero_stage == 3, got zero_stage={z.get('stage', 0)}"
        )
    z["offload_param"] = {"device": "cpu", "pin_memory": ctx.device == "cuda"}


@register_knob(OVERLAP_COMM, values=boolean(), default=False)
def overlap_comm(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """Overlap of gradient reduction with backward (double-buffers the reduce bucket).

    Sets ``zero_optimization.overlap_comm``."""
    _zero(build)["overlap_comm"] = bool(value)


@register_knob(REDUCE_BUCKET_SIZE, values=BUCKET, default="auto", memory="hungry")
def reduce_bucket_size(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """Elements per gradient-reduction bucket, or ``auto``.

    ``auto`` = ``min(5e8, max(num_params, 1e6))`` (``auto_bucket_elements``): a 5M-parameter
    model gets a 5M-element bucket, never DeepSpeed's 5e8 default (about 2 GB malloc'd on CPU).
    Sets ``zero_optimization.reduce_bucket_size``."""
    _zero(build)["reduce_bucket_size"] = _bucket(value, ctx, REDUCE_BUCKET_SIZE)


@register_knob(ALLGATHER_BUCKET_SIZE, values=BUCKET, default="auto", memory="hungry")
def allgather_bucket_size(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """Elements per ZeRO-1/2 parameter all-gather bucket, or ``auto`` (as reduce_bucket_size).

    Sets ``zero_optimization.allgather_bucket_size``."""
    _zero(build)["allgather_bucket_size"] = _bucket(value, ctx, ALLGATHER_BUCKET_SIZE)


OPTIMIZER_IMPLS = ("adamw", "adamw_foreach", "adamw_fused")
"""The implementations of the harness's AdamW: ``foreach=False``, ``foreach=True``, ``fused=True``."""


@register_knob(OPTIMIZER_IMPL, values=one_of(*OPTIMIZER_IMPLS), default="adamw")
def optimizer_impl(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """Implementation of the harness-built ``torch.optim.AdamW`` passed to ``deepspeed.initialize``.

    ``adamw`` (for-loop), ``adamw_foreach``, ``adamw_fused``. Sets runtime ``optimizer_impl``; no
    DeepSpeed key (no ``optimizer`` block: DeepSpeedCPUAdam's compile is avoided)."""
    if value not in OPTIMIZER_IMPLS:
        raise KnobError(f"knob {OPTIMIZER_IMPL!r}: must be one of {OPTIMIZER_IMPLS}, got {value!r}")
    build.runtime["optimizer_impl"] = value


def _omp_threads(value: Any) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(int(value))}


@register_knob(THREADS_PER_WORKER, values=integer(lo=1), default=1, process_env=_omp_threads)
def threads_per_worker(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """Intra-op CPU threads per rank.

    ``torch.set_num_threads`` in each rank, and ``OMP_NUM_THREADS`` in its environment at
    process start (a new value starts fresh rank processes). Sets runtime ``threads_per_worker``."""
    n = int(value)
    if n <= 0:
        raise KnobError(f"knob {THREADS_PER_WORKER!r}: must be >= 1, got {value!r}")
    build.runtime["threads_per_worker"] = n
    build.env.update(_omp_threads(n))


@register_knob(
    EXPERT_PARALLEL, values=boolean(), default=False, memory="saver", after=(ZERO_STAGE,)
)
def expert_parallel(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """MoE only: shard the experts over all ranks (ep_size = world size); not with ZeRO-3.

    Each rank holds ``num_experts / ep_size`` experts and tokens travel with
    ``all_to_all_single``. Expert parameters are kept out of DeepSpeed's data-parallel reduction;
    their gradients (summed over ranks by the all-to-all backward) are divided by the world size
    and stepped by a harness AdamW. Sets model options ``expert_parallel`` and ``ep_size``; no
    DeepSpeed key."""
    on = bool(value)
    build.model_options["expert_parallel"] = on
    build.model_options["ep_size"] = ctx.world_size if on else 1
    if on and _zero(build).get("stage", 0) == 3:
        raise KnobError(
            f"knob {EXPERT_PARALLEL!r}=true is not supported with zero_stage=3; use zero_stage <= 2"
        )


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
    ranks. Registered knobs missing from ``config`` take their registered default (``knob_defaults``;
    one without a default is skipped); every knob in ``config`` must have a registered handler.
    Handlers run in ``handler_order()``. Raises ``KnobError`` / ``WorkloadError`` naming the value."""
    if workload.global_batch_size % world_size:
        raise WorkloadError(
            f"workload {workload.name!r}: global batch {workload.global_batch_size} sequences is not "
            f"divisible by world size {world_size}; change tokens_per_step or resources.workers."
        )
    unknown = [k for k in config if k not in KNOB_HANDLERS]
    if unknown:
        raise KnobError(f"knob(s) {unknown} have no handler. Known knobs: {sorted(KNOB_HANDLERS)}.")
    full = {**knob_defaults(), **config}
    ctx = KnobContext(
        world_size=world_size,
        num_params=num_params,
        hidden_size=hidden_size,
        global_batch_size=workload.global_batch_size,
        seq_len=workload.data.seq_len,
        device=workload.resources.device,
        config=full,
    )
    build = TrialBuild(ds_config=base_ds_config(workload, world_size))
    for name in handler_order():
        if name in full:
            KNOB_HANDLERS[name](full[name], build, ctx)
    return build
