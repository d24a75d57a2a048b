"""The three signatures an experience-bank row carries: the hardware, the workload and the parallel layout.

Each is a frozen dataclass whose fields carry their unit in their name; ``columns()`` flattens it
into the bank's Parquet columns under a prefix (``hw_``, ``wl_``, ``par_``), ``from_columns``
reads them back (missing columns, as in banks written before the signatures, read as None).
They are computed from what a study directory already holds:

- ``HardwareSignature.from_study``: a trial row's ``hardware`` dict (what ``execution.runner`` and
  ``execution.aggregate`` record: ``device``, ``device_name``, ``memory_per_device_bytes``,
  ``cpu``, ``torch``, ``deepspeed``...; ``driver``/``cuda``/``interconnect`` where a row carries
  them), the doctor's hardware dict, and the workload's resources for devices per node and nodes;
- ``WorkloadSignature.from_workload``: the contract's embedded workload (family or entry point,
  sequence length, tokens per step) and the model's architecture (the built-in families'
  ``workloads.models.model_args``, the surrogate's ``MODELS``, a user job's ``ModelShape``);
  parameters from the trial rows (``extra.num_params``) when the architecture is unknown;
- ``ParallelLayout.from_config``: the world size and nodes of a trial and its knobs (``tp``,
  ``pp``, ``expert_parallel``, ``zero_stage``, ``micro_batch_size``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

import pyarrow as pa

from infrarsi.structlog_config import get_logger

log = get_logger(__name__)
S = TypeVar("S", bound="_Signature")


class _Signature:
    """Flattening shared by the three signatures."""

    PREFIX: ClassVar[str] = ""

    def columns(self) -> dict[str, Any]:
        """The bank columns of this signature: ``PREFIX + field name`` -> value."""
        return {self.PREFIX + f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_columns(cls: type[S], row: Mapping[str, Any]) -> S:
        """Inverse of ``columns`` (a bank row; missing columns read as None)."""
        return cls(**{f.name: row.get(cls.PREFIX + f.name) for f in fields(cls)})  # type: ignore[arg-type]

    @classmethod
    def arrow_fields(cls) -> list[pa.Field]:
        """The bank schema's fields for this signature."""
        types = {
            "str | None": pa.string(),
            "int | None": pa.int64(),
            "float | None": pa.float64(),
            "bool | None": pa.bool_(),
        }
        return [pa.field(cls.PREFIX + f.name, types[str(f.type)]) for f in fields(cls)]  # type: ignore[arg-type]


@dataclass(frozen=True)
class HardwareSignature(_Signature):
    """The machine type a trial ran on (host names and measured rates left out)."""

    PREFIX: ClassVar[str] = "hw_"

    device_kind: str | None = None
    """``cpu`` or ``cuda`` (the workload's ``resources.device``)."""
    device_name: str | None = None
    """The device's name as the ranks report it (``NVIDIA H200``; the CPU model on CPU)."""
    memory_per_device_bytes: int | None = None
    """Memory of one device as the ranks report it, bytes (None: not reported)."""
    devices_per_node: int | None = None
    """Devices of the job on one node (world size over nodes)."""
    nodes: int | None = None
    """Nodes the job spans."""
    interconnect: str | None = None
    """The inter-device / inter-node link where a trial row names it (``nvlink``, ``ib``...)."""
    driver_version: str | None = None
    """The GPU driver version where visible (a row's ``driver``)."""
    cuda_version: str | None = None
    """The CUDA version torch was built with where visible (a row's ``cuda``)."""
    torch_version: str | None = None
    """``torch.__version__`` on the driver process."""
    deepspeed_version: str | None = None
    """``deepspeed.__version__`` on the driver process."""
    simulated: bool | None = None
    """True for a surrogate (simulated) study."""

    @classmethod
    def from_study(
        cls,
        hardware: Mapping[str, Any] | None,
        *,
        workload: Any = None,
        doctor_hardware: Mapping[str, Any] | None = None,
        nodes: int | None = None,
        simulated: bool | None = None,
    ) -> HardwareSignature:
        """From a trial row's ``hardware`` dict, completed by the doctor's and the workload's."""
        hw = {
            **dict(doctor_hardware or {}),
            **{k: v for k, v in dict(hardware or {}).items() if v is not None},
        }
        res = getattr(workload, "resources", None)
        world = int(getattr(workload, "world_size", 0) or 0)
        n_nodes = nodes or (int(res.nodes) if res is not None else None) or None
        if getattr(workload, "backend", None) == "surrogate":
            sur = getattr(workload, "surrogate", {}) or {}
            per_node: int | None = int(sur.get("gpus_per_node", 8))
            name = hw.get("device_name") or sur.get("gpu", "h100_sxm")
        else:
            per_node = max(1, world // n_nodes) if world and n_nodes else None
            name = (
                hw.get("device_name")
                or hw.get("gpu_name")
                or hw.get("device_kind")
                or (hw.get("cpu") if hw.get("device") == "cpu" else None)
            )
        mem = hw.get("memory_per_device_bytes") or hw.get("device_memory_bytes")
        return cls(
            device_kind=_text(hw.get("device") or (res.device if res is not None else None)),
            device_name=_text(name),
            memory_per_device_bytes=_int(mem),
            devices_per_node=_int(
                hw.get("devices_per_node") or hw.get("gpus_per_node") or per_node
            ),
            nodes=_int(n_nodes),
            interconnect=_text(hw.get("interconnect")),
            driver_version=_text(hw.get("driver") or hw.get("driver_version")),
            cuda_version=_text(hw.get("cuda") or hw.get("cuda_version")),
            torch_version=_text(hw.get("torch")),
            deepspeed_version=_text(hw.get("deepspeed")),
            simulated=bool(simulated if simulated is not None else hw.get("simulated", False)),
        )


@dataclass(frozen=True)
class WorkloadSignature(_Signature):
    """What is being trained, independent of where and how it is laid out."""

    PREFIX: ClassVar[str] = "wl_"

    name: str | None = None
    """The workload's name."""
    family: str | None = None
    """The built-in model family (``dense``, ``moe``); None for a user job."""
    entry_point: str | None = None
    """A user job's ``module:function`` (None for a built-in family)."""
    size: str | None = None
    """The model flavour (``debug``, ``1b``...)."""
    num_params: int | None = None
    """Parameters of the model (all of them, experts included)."""
    n_layers: int | None = None
    """Transformer blocks."""
    hidden: int | None = None
    """Hidden size."""
    n_heads: int | None = None
    """Attention heads."""
    num_experts: int | None = None
    """Experts per MoE layer (0: dense)."""
    top_k: int | None = None
    """Experts each token is routed to (0: dense)."""
    seq_len_tokens: int | None = None
    """Tokens per sequence."""
    tokens_per_step: int | None = None
    """Tokens per optimizer step, across all ranks."""

    @classmethod
    def from_workload(cls, wl: Any, *, num_params: int | None = None) -> WorkloadSignature:
        """From a ``Workload``; the architecture is looked up as the analytic prior does (an
        unknown one leaves those fields None, logged, never raised)."""
        arch: dict[str, Any] = {}
        try:
            arch = _architecture(wl)
        except Exception as e:  # an unknown flavour or an unimportable job: keep what the YAML says
            log.info(
                "bank.architecture_unknown", workload=getattr(wl, "name", None), error=str(e)[:200]
            )
        model = wl.model
        script = getattr(wl, "script", None)
        return cls(
            name=_text(wl.name),
            family=_text(model.family) if model is not None else None,
            entry_point=(
                _text(model.entry_point)
                if model is not None
                else _text(f"script:{script.path}")
                if script is not None
                else None
            ),
            size=_text(model.size) if model is not None and model.entry_point is None else None,
            num_params=_int(arch.get("num_params") or num_params),
            n_layers=_int(arch.get("n_layers")),
            hidden=_int(arch.get("hidden")),
            n_heads=_int(arch.get("n_heads")),
            num_experts=_int(arch.get("num_experts")),
            top_k=_int(arch.get("top_k")),
            seq_len_tokens=_int(wl.data.seq_len),
            tokens_per_step=_int(wl.tokens_per_step),
        )


@dataclass(frozen=True)
class ParallelLayout(_Signature):
    """How one trial spread the job over its devices."""

    PREFIX: ClassVar[str] = "par_"

    world_size: int | None = None
    """Ranks (devices) of the trial."""
    nodes: int | None = None
    """Nodes of the trial."""
    data_parallel: int | None = None
    """Data-parallel degree: world size over tensor x pipeline parallel."""
    tensor_parallel: int | None = None
    """Tensor-parallel degree (the ``tp`` knob; 1 without it)."""
    pipeline_parallel: int | None = None
    """Pipeline-parallel degree (the ``pp`` knob; 1 without it)."""
    expert_parallel: int | None = None
    """Expert-parallel degree (the ``expert_parallel``/``ep`` knob; None without it)."""
    zero_stage: int | None = None
    """DeepSpeed ZeRO stage (the ``zero_stage`` knob)."""
    micro_batch_size: int | None = None
    """Sequences per rank per micro-step (the ``micro_batch_size`` knob)."""
    gradient_accumulation_steps: int | None = None
    """Micro-steps per optimizer step: global batch over (micro-batch x data parallel)."""

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any],
        *,
        world_size: int | None,
        nodes: int | None,
        global_batch: int | None = None,
    ) -> ParallelLayout:
        """From a trial's config, world size and nodes (``global_batch``: sequences per step)."""
        tp, pp = _int(config.get("tp")) or 1, _int(config.get("pp")) or 1
        ep = _int(config.get("expert_parallel", config.get("ep")))
        dp = world_size // (tp * pp) if world_size and world_size % (tp * pp) == 0 else None
        mbs = _int(config.get("micro_batch_size"))
        gas = (
            global_batch // (mbs * dp)
            if global_batch and mbs and dp and global_batch % (mbs * dp) == 0
            else None
        )
        return cls(
            world_size=_int(world_size),
            nodes=_int(nodes),
            data_parallel=dp,
            tensor_parallel=tp,
            pipeline_parallel=pp,
            expert_parallel=ep,
            zero_stage=_int(config.get("zero_stage")),
            micro_batch_size=mbs,
            gradient_accumulation_steps=gas,
        )


def _architecture(wl: Any) -> dict[str, Any]:
    """n_layers, hidden, n_heads, num_experts, top_k (and num_params where known) of a workload."""
    if wl.backend == "surrogate":
        from infrarsi.execution.surrogate.model import MODELS

        m = MODELS[str(wl.surrogate.get("model", wl.job_model().size))]
        return {
            "n_layers": m.n_layers,
            "hidden": m.hidden,
            "n_heads": m.n_heads,
            "num_experts": 0,
            "top_k": 0,
            "num_params": int(m.num_params),
        }
    if wl.job_model().entry_point is not None:
        from infrarsi.execution.job_loader import load_job
        from infrarsi.execution.runner import default_code_dir
        from infrarsi.job import JobContext

        entry, args = wl.job_model().entry()
        ctx = JobContext(
            args=args,
            options={},
            device=wl.resources.device,
            rank=0,
            world_size=wl.world_size,
            seq_len=wl.data.seq_len,
            reference=True,
        )
        s = load_job(default_code_dir(wl), entry, ctx).shape
        return {
            "n_layers": s.n_layers,
            "hidden": s.dim,
            "n_heads": s.n_heads or None,
            "num_experts": s.num_experts,
            "top_k": s.top_k,
        }
    from infrarsi.workload_prior import _model_args

    a = _model_args(wl)
    return {
        "n_layers": a.n_layers,
        "hidden": a.dim,
        "n_heads": a.n_heads,
        "num_experts": int(getattr(a, "num_experts", 0) or 0),
        "top_k": int(getattr(a, "top_k", 0) or 0),
    }


def _text(v: Any) -> str | None:
    return None if v is None or v == "" else str(v)


def _int(v: Any) -> int | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def signature_fields() -> list[pa.Field]:
    """Every signature column of the bank schema."""
    return [
        *HardwareSignature.arrow_fields(),
        *WorkloadSignature.arrow_fields(),
        *ParallelLayout.arrow_fields(),
    ]


__all__ = ["HardwareSignature", "ParallelLayout", "WorkloadSignature", "signature_fields"]
