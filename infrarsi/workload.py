"""The workload: the training job being tuned, read from its YAML.

The workload: the training job being tuned (model, data, tokens per step, steps, resources,
baseline recipe, search space), loaded from a YAML file in ``workloads/``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from infrarsi.errors import WorkloadError
from infrarsi.units import parse_size


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(_Strict):
    family: Literal["dense", "moe"]
    """Model family: ``dense`` (Llama-style) or ``moe`` (Mixtral-style)."""
    size: str = "debug"
    """Flavour name in the family's registry (``debug``, ``1b``, ``8x1b``...)."""
    overrides: dict[str, Any] = Field(default_factory=dict)
    """Field overrides of the flavour's model args (e.g. ``{n_layers: 2}``)."""


class DataSpec(_Strict):
    kind: Literal["synthetic"] = "synthetic"
    """Only synthetic data: a fixed-seed Markov source; the harness owns the order."""
    seed: int = 1234
    """Seed of the data source; each global batch is fixed by (seed, step)."""
    seq_len: int = Field(128, gt=0)
    """Tokens per sequence."""


class StepsSpec(_Strict):
    warmup: int = Field(2, ge=0)
    """Warm-up optimizer steps, timed and reported apart."""
    measured: int = Field(8, gt=0)
    """Measured optimizer steps; step_time_s is their median."""


class ResourcesSpec(_Strict):
    workers: int = Field(2, gt=0)
    """Ranks (one Ray actor each)."""
    nodes: int = Field(1, gt=0)
    """Nodes the ranks are spread over (Ray raylets)."""
    devices_per_worker: int = Field(1, gt=0)
    """Accelerators per worker (1 on GPU; on CPU each worker gets ``cpus_per_worker`` cores)."""
    cpus_per_worker: float = Field(1, gt=0)
    """CPU cores reserved per worker in its placement-group bundle."""
    device: Literal["cpu", "cuda"] = "cpu"
    """``cpu`` (gloo) or ``cuda`` (nccl)."""


class OptimSpec(_Strict):
    lr: float = Field(1e-3, gt=0)
    """AdamW learning rate (constant)."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""


class Workload(_Strict):
    """A training job: what infrarsi tunes. See ``workloads/dense_debug.yaml``."""

    name: str
    """Short name, used in study and branch names."""
    backend: Literal["deepspeed", "surrogate"] = "deepspeed"
    """``deepspeed`` trains for real; ``surrogate`` answers from an analytic model (simulated)."""
    model: ModelSpec
    data: DataSpec = Field(default_factory=DataSpec)
    tokens_per_step: int = Field(gt=0)
    """Tokens per optimizer step across all ranks (an invariant of the contract)."""
    steps: StepsSpec = Field(default_factory=StepsSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    optimizer: OptimSpec = Field(default_factory=OptimSpec)
    baseline: dict[str, Any] = Field(default_factory=dict)
    """The conservative recipe a team ships first (knob -> value); other knobs take defaults."""
    search_space: str
    """Path of the search-space YAML, relative to this file (or absolute)."""
    memory_capacity: str | int | None = None
    """Default memory capacity per device (``4GiB``); the CLI's ``--memory-capacity`` wins."""
    variant: str | None = None
    """Test-only workload variant (e.g. a deliberate cheat); never set in a real workload."""
    surrogate: dict[str, Any] = Field(default_factory=dict)
    """Parameters of the analytic model when ``backend: surrogate`` (GPU kind, model size...)."""

    path: str | None = Field(None, exclude=True)
    """Where the workload was loaded from (not part of the YAML)."""

    @model_validator(mode="after")
    def _check_batch(self) -> Workload:
        if self.tokens_per_step % self.data.seq_len:
            raise ValueError(
                f"tokens_per_step ({self.tokens_per_step}) must be a multiple of data.seq_len "
                f"({self.data.seq_len}); pick tokens_per_step = sequences x seq_len."
            )
        return self

    @property
    def global_batch_size(self) -> int:
        """Sequences per optimizer step across all ranks."""
        return self.tokens_per_step // self.data.seq_len

    @property
    def memory_capacity_bytes(self) -> int | None:
        """The workload's own ``memory_capacity`` per device, bytes (None when it sets none): the
        one place it is parsed (a study resolves its capacity in ``infrarsi.study.capacity``)."""
        if self.memory_capacity is None:
            return None
        return int(parse_size(self.memory_capacity, what=f"{self.path or self.name}: memory_capacity"))

    @property
    def world_size(self) -> int:
        return self.resources.workers * self.resources.devices_per_worker

    def search_space_path(self) -> Path:
        p = Path(self.search_space)
        if not p.is_absolute() and self.path:
            p = Path(self.path).parent / p
        return p

    def to_yaml_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude={"path"})

    def hash(self) -> str:
        """sha256 of the canonical YAML dump (the contract pins it)."""
        text = yaml.safe_dump(self.to_yaml_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    @classmethod
    def from_yaml(cls, path: str | Path) -> Workload:
        p = Path(path)
        if not p.exists():
            raise WorkloadError(f"workload file {str(p)!r} does not exist. Pass a YAML from workloads/, e.g. workloads/dense_debug.yaml.")
        try:
            data = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise WorkloadError(f"{p}: not valid YAML: {e}") from e
        return cls.from_dict(data, source=str(p))

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<workload>") -> Workload:
        if not isinstance(data, dict):
            raise WorkloadError(f"{source}: a workload must be a mapping, but got {type(data).__name__}.")
        try:
            wl = cls(**data)
        except ValidationError as e:
            msgs = []
            for err in e.errors():
                loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
                msgs.append(f"field {loc!r}: {err['msg']} (got {err.get('input')!r})")
            raise WorkloadError(f"{source}: " + "; ".join(msgs)) from None
        wl.path = source if source != "<workload>" else None
        return wl
