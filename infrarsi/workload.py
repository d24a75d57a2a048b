"""The workload: the training job being tuned, read from its YAML.

The workload: the training job being tuned (model, data, tokens per step, steps, resources,
baseline recipe, search space), loaded from a YAML file in ``workloads/``.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from infrarsi.errors import WorkloadError
from infrarsi.units import parse_size


class _Strict(BaseModel):
    # unknown fields are refused; floats must be finite (``lr: .inf`` is a typo, not a setting);
    # ``memory_capacity: true`` is not the number 1
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=False)


BUILTIN_ENTRY_POINT = "workloads.jobs:builtin_job"
"""The entry point of the built-in families (``model.family``), a job like any user's."""

ENTRY_POINT_RE = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
)
"""``module.path:function``."""

BUILTIN_PREFIX = "builtin:"
"""``search_space: builtin:NAME`` names a search space shipped in the package (``infrarsi/search_spaces/``,
a link to the repository's ``search_spaces/`` folder, whose files a built wheel holds)."""


def builtin_spaces() -> list[str]:
    """The names of the search spaces shipped with infrarsi (``builtin:NAME``), sorted."""
    folder = importlib.resources.files("infrarsi") / "search_spaces"
    return sorted(
        f.name.removesuffix(".yaml") for f in folder.iterdir() if f.name.endswith(".yaml")
    )


def builtin_space_path(name: str) -> Path:
    """The file of the shipped search space ``name`` (``deepspeed_dense``); ``WorkloadError``
    listing the shipped ones when there is none of that name."""
    names = builtin_spaces()
    if name not in names:
        raise WorkloadError(
            f"search_space: rule: {BUILTIN_PREFIX}NAME names a search space shipped with infrarsi; "
            f"got {BUILTIN_PREFIX}{name}. Fix: one of "
            + ", ".join(BUILTIN_PREFIX + n for n in names)
            + ", or a YAML path"
        )
    return Path(str(importlib.resources.files("infrarsi") / "search_spaces" / f"{name}.yaml"))


def space_file(value: str | Path, base: Path | None = None) -> Path:
    """The search-space file ``value`` names: a shipped space for ``builtin:NAME``
    (``builtin_space_path``), else a path, relative to ``base`` when given and not absolute."""
    text = str(value)
    if text.startswith(BUILTIN_PREFIX):
        return builtin_space_path(text.removeprefix(BUILTIN_PREFIX))
    p = Path(text)
    return base / p if base is not None and not p.is_absolute() else p


class ModelSpec(_Strict):
    family: Literal["dense", "moe"] | None = None
    """Built-in model family: ``dense`` (Llama-style) or ``moe`` (Mixtral-style); or set
    ``entry_point`` to tune your own training code."""
    size: str = "debug"
    """Flavour name in the family's registry (``debug``, ``1b``, ``8x1b``...)."""
    overrides: dict[str, Any] = Field(default_factory=dict)
    """Field overrides of the flavour's model args (e.g. ``{n_layers: 2}``)."""
    entry_point: str | None = None
    """Your own training code: ``module:function`` returning an ``infrarsi.job.TrainingJob``
    (see ``infrarsi/job.py``), imported from ``code_dir``."""
    code_dir: str | None = None
    """Folder ``entry_point``'s module is imported from, relative to the workload YAML (default:
    the YAML's folder). Code patches edit a git worktree of the repository holding it."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Settings handed to the entry point as ``JobContext.args``."""

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.family is None) == (self.entry_point is None):
            raise ValueError(
                "set exactly one of model.family (a built-in: dense, moe) and model.entry_point "
                "(your code, 'module:function')"
            )
        if self.entry_point is not None:
            if not ENTRY_POINT_RE.match(self.entry_point):
                raise ValueError(
                    f"model.entry_point must look like 'package.module:function', got {self.entry_point!r}"
                )
            if self.overrides or self.size != "debug":
                raise ValueError(
                    "model.size and model.overrides belong to the built-in families; pass your "
                    "job's settings in model.args"
                )
        elif self.code_dir is not None or self.args:
            raise ValueError(
                "model.code_dir and model.args belong to model.entry_point; a built-in family "
                "takes model.size and model.overrides"
            )
        return self

    def entry(self) -> tuple[str, dict[str, Any]]:
        """The entry point and the ``JobContext.args`` it gets (the built-in families' too)."""
        if self.entry_point is not None:
            return self.entry_point, dict(self.args)
        return BUILTIN_ENTRY_POINT, {
            "family": self.family,
            "size": self.size,
            "overrides": dict(self.overrides),
        }


Launcher = Literal["deepspeed", "torchrun", "python"]
"""The launchers whose rank environment a script run reproduces."""


class ScriptSpec(_Strict):
    """Your existing training script, run unchanged on every rank (``infrarsi.execution.script_job``)."""

    path: str = Field(min_length=1)
    """The script, relative to the workload YAML (or absolute), inside the job's git repository."""
    args: list[str] = Field(default_factory=list)
    """Its command-line arguments, as you pass them today (``--deepspeed --deepspeed_config ds.json
    ...``); relative paths in them are read from the workload YAML's folder (the working directory
    the ranks run the script in). ``--local_rank`` is added by the ``deepspeed`` launcher, not here."""
    launcher: Launcher = "deepspeed"
    """What you type today: ``deepspeed`` (appends ``--local_rank=N`` to the arguments, as the
    DeepSpeed launcher does), ``torchrun`` or ``python`` (environment only)."""

    @model_validator(mode="after")
    def _args_are_the_users(self) -> ScriptSpec:
        if not self.path.endswith(".py"):
            raise ValueError(
                f"script.path: rule: a Python file (*.py) run as __main__; got {self.path!r}. "
                f"Fix: name your training script, e.g. script.path: train.py"
            )
        own = [
            a
            for a in self.args
            if a == "--local_rank" or a.startswith(("--local_rank=", "--local-rank"))
        ]
        if own:
            raise ValueError(
                f"script.args: rule: the launcher sets the rank's --local_rank; got {own[0]!r}. "
                f"Fix: remove it from script.args"
            )
        return self


class DataSpec(_Strict):
    kind: Literal["synthetic", "tokens"] = "synthetic"
    """``synthetic``: a fixed-seed Markov source; ``tokens``: your token ids from ``path``. The
    harness owns the order either way (a job may also bring its own loader, ``infrarsi.job``)."""
    seed: int = 1234
    """Seed of the synthetic source; each global batch is fixed by (seed, step)."""
    seq_len: int = Field(128, gt=0)
    """Tokens per sequence."""
    path: str | None = None
    """``kind: tokens``: a 1-D file of token ids (``.npy``, or raw ids of ``dtype``, e.g.
    nanoGPT's ``.bin``), relative to the workload YAML."""
    dtype: str = "uint16"
    """``kind: tokens``: the integer type of a raw token file (``uint16``, ``uint32``, ``int32``,
    ``int64``; a ``.npy`` file carries its own)."""

    @model_validator(mode="after")
    def _path_for_tokens(self) -> DataSpec:
        if self.kind == "tokens" and not self.path:
            raise ValueError(
                "data.kind 'tokens' needs data.path: a file of token ids (.npy or raw)"
            )
        if self.dtype not in ("uint16", "uint32", "int32", "int64"):
            raise ValueError(
                f"data.dtype must be one of uint16, uint32, int32, int64, got {self.dtype!r}"
            )
        return self


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

    @model_validator(mode="after")
    def _ranks_fill_the_nodes(self) -> ResourcesSpec:
        if self.workers % self.nodes:
            raise ValueError(
                f"nodes: rule: the {self.workers} workers must split evenly over the nodes (the same "
                f"number of ranks on each), but nodes is {self.nodes}. Fix: make workers a multiple of nodes."
            )
        return self

    @property
    def workers_per_node(self) -> int:
        """Ranks on each node."""
        return self.workers // self.nodes


class OptimSpec(_Strict):
    lr: float = Field(1e-3, gt=0, allow_inf_nan=False)
    """AdamW learning rate (constant)."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""


def script_root(folder: Path) -> Path:
    """The root of the git repository holding ``folder`` (a ``.git`` folder, or the ``.git`` file
    of a worktree), else ``folder`` itself."""
    for p in (folder, *folder.parents):
        if (p / ".git").exists():
            return p
    return folder


class Workload(_Strict):
    """A training job: what infrarsi tunes. See ``workloads/dense_debug.yaml``."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """Short name, used in study and branch names."""
    backend: Literal["deepspeed", "surrogate"] = "deepspeed"
    """``deepspeed`` trains for real; ``surrogate`` answers from an analytic model (simulated)."""
    model: ModelSpec | None = None
    """The job as an entry point or a built-in family; or set ``script`` instead."""
    script: ScriptSpec | None = None
    """Your existing training script, unchanged (instead of ``model``)."""
    data: DataSpec = Field(default_factory=DataSpec)
    tokens_per_step: int = Field(gt=0)
    """Tokens per optimizer step across all ranks (an invariant of the contract)."""
    steps: StepsSpec = Field(default_factory=StepsSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    optimizer: OptimSpec = Field(default_factory=OptimSpec)
    baseline: dict[str, Any] = Field(default_factory=dict)
    """The conservative recipe a team ships first (knob -> value); other knobs take defaults."""
    search_space: str | None = None
    """Path of the search-space YAML, relative to this file (or absolute); or ``builtin:NAME``, a
    space shipped with infrarsi (``builtin:deepspeed_dense``); left out: the default of the job's
    kind (``default_space``)."""
    memory_capacity: str | int | None = Field(None, union_mode="left_to_right")
    """Default memory capacity per device (``4GiB``); the CLI's ``--memory-capacity`` wins."""

    @field_validator("search_space")
    @classmethod
    def _builtin_space_exists(cls, v: str | None) -> str | None:
        if v is not None and v.startswith(BUILTIN_PREFIX):
            try:
                builtin_space_path(v.removeprefix(BUILTIN_PREFIX))
            except WorkloadError as e:
                raise ValueError(str(e)) from None
        return v

    @field_validator("memory_capacity", mode="before")
    @classmethod
    def _capacity_is_a_size(cls, v: Any) -> Any:
        if isinstance(v, bool) or (v is not None and not isinstance(v, (str, int))):
            raise ValueError(
                f"memory_capacity: rule: a size such as 80GiB, or a byte count; got {v!r}. "
                f"Fix: memory_capacity: 80GiB, or leave it out (the device's own)"
            )
        return v

    variant: str | None = None
    """Test-only: ``module:attribute`` of an ``infrarsi.execution.seams.Seams`` the ranks train
    through instead of the honest seams (a deliberate cheat, e.g. ``tests.cheats:fake_loss``),
    imported on the ranks (the job's code directory is on their path). Never set in a real workload."""

    @field_validator("variant")
    @classmethod
    def _variant_is_an_attribute(cls, v: str | None) -> str | None:
        if v is not None and not ENTRY_POINT_RE.match(v):
            raise ValueError(
                f"variant: rule: 'module:attribute' of the test-only seams to train through; got "
                f"{v!r}. Fix: e.g. variant: tests.cheats:fake_loss, or remove it"
            )
        return v

    surrogate: dict[str, Any] = Field(default_factory=dict)
    """Parameters of the analytic model when ``backend: surrogate`` (GPU kind, model size...)."""

    path: str | None = Field(None, exclude=True)
    """Where the workload was loaded from (not part of the YAML)."""

    @model_validator(mode="after")
    def _check_batch(self) -> Workload:
        if (self.model is None) == (self.script is None):
            raise ValueError(
                "rule: a workload names its job once: either model (a built-in family or an "
                "entry point) or script (your training script, unchanged). Fix: keep exactly one "
                "of model: and script:"
            )
        if self.script is not None and self.backend != "deepspeed":
            raise ValueError(
                f"backend: rule: a script workload trains for real; got backend {self.backend!r}. "
                f"Fix: backend: deepspeed (or leave it out)"
            )
        if self.variant is not None and (self.model is None or self.model.family is None):
            raise ValueError("variant is a test-only switch of the built-in families; remove it")
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
        return int(
            parse_size(self.memory_capacity, what=f"{self.path or self.name}: memory_capacity")
        )

    @property
    def world_size(self) -> int:
        return self.resources.workers * self.resources.devices_per_worker

    def _relative(self, p: str) -> Path:
        path = Path(p)
        if not path.is_absolute() and self.path:
            path = Path(self.path).resolve().parent / path
        return path.resolve()

    def job_model(self) -> ModelSpec:
        """``model``; a ``WorkloadError`` for a script workload (which has none)."""
        if self.model is None:
            raise WorkloadError(
                f"{self.path or self.name}: field 'model': this workload runs a script "
                f"(script.path {self.script.path if self.script else None!r}) and has no model "
                f"entry point or family"
            )
        return self.model

    def job_code_dir(self) -> Path | None:
        """The folder ``model.entry_point`` is imported from (None for a built-in family); for a
        script, the root of the git repository holding the workload YAML (or the YAML's folder
        outside git): what trials run from (a patched worktree has the same layout)."""
        if self.script is not None:
            return script_root(self._relative("."))
        if self.model is None or self.model.entry_point is None:
            return None
        return self._relative(self.model.code_dir or ".")

    def script_path(self) -> Path | None:
        """``script.path`` resolved against the YAML's folder (None without a script)."""
        return self._relative(self.script.path) if self.script is not None else None

    def script_layout(self) -> tuple[str, str]:
        """(the script, the working directory) relative to ``job_code_dir()``, so a rank finds
        both in any copy of the repository (a patched worktree, a shipped package). Raises
        ``WorkloadError`` naming the field when the script is not a file inside the repository."""
        if self.script is None:
            raise WorkloadError(f"{self.path or self.name}: field 'script': not set")
        root, script = script_root(self._relative(".")), self._relative(self.script.path)
        where = f"{self.path or self.name}: field 'script.path'"
        if not script.is_file():
            raise WorkloadError(
                f"{where}: rule: must name your training script, relative to the workload YAML; "
                f"{self.script.path!r} is {script}, which is not a file. Fix the path."
            )
        if not script.is_relative_to(root):
            raise WorkloadError(
                f"{where}: rule: the script must lie inside the job's git repository {root} (the "
                f"trials run from a copy of it); {self.script.path!r} is {script}. Fix: move the "
                f"workload YAML into the script's repository"
            )
        cwd = self._relative(".")
        return str(script.relative_to(root)), str(cwd.relative_to(root)) if cwd.is_relative_to(
            root
        ) else "."

    def data_path(self) -> Path | None:
        """``data.path`` resolved against the YAML's folder (None without one)."""
        return self._relative(self.data.path) if self.data.path else None

    def default_space(self) -> str:
        """The shipped space a workload without ``search_space`` gets: ``surrogate_gpu`` for the
        surrogate backend, ``deepspeed_moe`` for the ``moe`` family, else ``deepspeed_dense`` (the
        DeepSpeed launch knobs any dense job takes: the ``dense`` family, your entry point or script)."""
        if self.backend == "surrogate":
            return "surrogate_gpu"
        return (
            "deepspeed_moe"
            if self.model is not None and self.model.family == "moe"
            else "deepspeed_dense"
        )

    def search_space_path(self) -> Path:
        """The search-space file: ``search_space`` resolved against the YAML's folder, a shipped
        space for ``builtin:NAME``, or the shipped ``default_space()`` when it is left out."""
        if self.search_space is None:
            return builtin_space_path(self.default_space())
        return space_file(self.search_space, Path(self.path).parent if self.path else None)

    def to_yaml_dict(self) -> dict[str, Any]:
        d = self.model_dump(mode="json", exclude={"path"})
        for key in (
            "model",
            "script",
        ):  # absent, not null: the hashes of workloads without a script stay
            if d.get(key) is None:
                d.pop(key, None)
        return d

    def hash(self) -> str:
        """sha256 of the canonical YAML dump (the contract pins it)."""
        text = yaml.safe_dump(self.to_yaml_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    @classmethod
    def from_yaml(cls, path: str | Path) -> Workload:
        p = Path(path)
        if not p.exists():
            raise WorkloadError(
                f"workload file {str(p)!r} does not exist. Pass a YAML from workloads/, "
                f"e.g. workloads/dense_debug.yaml."
            )
        if not p.is_file():
            raise WorkloadError(
                f"workload file {str(p)!r} is not a file. Pass a YAML from workloads/, e.g. workloads/dense_debug.yaml."
            )
        try:
            data = yaml.safe_load(p.read_text())
        except (OSError, UnicodeDecodeError) as e:
            raise WorkloadError(
                f"{p}: cannot be read as UTF-8 text ({e}). Pass a workload YAML."
            ) from None
        except yaml.YAMLError as e:
            raise WorkloadError(f"{p}: not valid YAML: {e}") from e
        wl = cls.from_dict(data, source=str(p))
        if wl.script is not None:
            wl.script_layout()  # the script is a file inside the job's repository
        return wl

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<workload>") -> Workload:
        if not isinstance(data, dict):
            raise WorkloadError(
                f"{source}: a workload must be a mapping, but got {type(data).__name__}."
            )
        odd = [k for k in data if not isinstance(k, str)]
        if odd:
            raise WorkloadError(
                f"{source}: field {odd[0]!r}: field names must be strings, like 'name' or "
                f"'tokens_per_step'; got {type(odd[0]).__name__} {odd[0]!r}."
            )
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
