"""``infrarsi init --script "LAUNCH LINE"``: the launch line a user already runs, turned into a workload YAML.

``parse_launch_line(text)`` splits the line with ``shlex`` (never a shell) into a ``LaunchLine``:
the launcher (``deepspeed``, ``torchrun`` / ``python -m torch.distributed.run``, or ``python``),
the world size its options give (``--num_gpus``/``--num_nodes``/``--include`` of DeepSpeed's
launcher, ``--nproc_per_node``/``--nnodes`` of torchrun; one process for ``python``), the script
and the script's own arguments. An unknown launcher, a launcher option infrarsi does not know,
``-m module`` scripts and multi-node elastic ranges are refused (``ConfigError``, exit 2).

``script_workload(line, cwd=..., space=...)`` reads what the baseline is without running the
script: the DeepSpeed config its arguments name (``--deepspeed_config FILE`` or a Hugging Face
``--deepspeed FILE``), the script's own argument defaults (its ``argparse`` ``add_argument`` calls
and dataclass fields, read from its syntax tree) and the Hugging Face ``TrainingArguments`` flags
on the line. It maps them to knob values (``baseline_from_config``) and returns a
``ScriptWorkload``: the workload as a mapping (``script.path`` relative to the YAML, which is
written in ``cwd``, the folder the line is run from, so relative paths in the arguments keep
their meaning) and the notes ``init`` prints (what was read from where, and every value that
could not become a knob value and why).

Why one module: reading a launch line and writing the workload it implies are one translation;
merging a trial's config into the script's is ``execution.script_config``.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from infrarsi.errors import ConfigError, WorkloadError
from infrarsi.execution.script_source import ScriptKind, ScriptSource, option_name, read_script
from infrarsi.workload import BUILTIN_PREFIX, Launcher, builtin_space_path, space_file

if TYPE_CHECKING:
    from infrarsi.search import SearchSpace

LAUNCHER_VALUE_OPTIONS: dict[str, tuple[str, ...]] = {
    "deepspeed": (
        "num_gpus",
        "num_nodes",
        "include",
        "exclude",
        "hostfile",
        "master_port",
        "master_addr",
        "node_rank",
        "launcher",
        "launcher_args",
        "elastic_training",
        "min_elastic_nodes",
        "max_elastic_nodes",
        "ssh_port",
        "venv_script",
    ),
    "torchrun": (
        "nproc_per_node",
        "nnodes",
        "node_rank",
        "master_addr",
        "master_port",
        "rdzv_backend",
        "rdzv_endpoint",
        "rdzv_id",
        "rdzv_conf",
        "max_restarts",
        "monitor_interval",
        "start_method",
        "role",
        "log_dir",
        "redirects",
        "tee",
        "local_addr",
        "logs_specs",
        "local_ranks_filter",
    ),
    "python": (),
}
"""Launcher options that take a value (``--opt V`` or ``--opt=V``), by launcher; dashes and
underscores are the same."""

LAUNCHER_FLAGS: dict[str, tuple[str, ...]] = {
    "deepspeed": (
        "no_python",
        "no_local_rank",
        "force_multi",
        "save_pid",
        "enable_each_rank_log",
        "bind_cores_to_rank",
        "no_ssh_check",
        "no_ssh",
    ),
    "torchrun": ("standalone", "no_python", "run_path"),
    "python": ("u", "B", "O", "OO", "W", "X"),
}
"""Launcher options without a value, by launcher."""

SEQ_LEN_ARGS = (
    "seq_len",
    "seq_length",
    "max_seq_length",
    "max_seq_len",
    "block_size",
    "sequence_length",
    "context_length",
    "max_length",
    "model_max_length",
)
"""Script arguments that name the tokens per sequence, in the order they are looked for."""

STEPS_ARGS = ("max_steps", "steps", "train_steps", "num_steps", "total_steps", "max_iters", "iters")
"""Script arguments that name how many optimizer steps the script trains."""


HF_DEFAULT_MICRO_BATCH = 8
"""``TrainingArguments.per_device_train_batch_size``'s default."""


@dataclass(frozen=True)
class LaunchLine:
    """A launch line as the user types it, parsed."""

    launcher: Launcher
    """The launcher whose rank environment a trial reproduces."""
    script: str
    """The script, as typed (relative to the folder the line is run from, or absolute)."""
    args: list[str]
    """The script's own arguments, unchanged."""
    workers: int
    """Ranks in all (processes per node x nodes)."""
    nodes: int
    """Nodes the ranks are spread over."""
    launcher_options: dict[str, str] = field(default_factory=dict)
    """The launcher's own options as given (name without dashes -> value, ``""`` for a flag)."""


def _count(value: str, what: str, devices_available: int) -> int:
    if value in ("gpu", "auto", "cpu") and what == "--nproc_per_node":
        return max(devices_available, 1)
    if not re.fullmatch(r"[1-9][0-9]*", value):
        raise ConfigError(
            f"--script: launcher option {what}: rule: a process count >= 1; got {value!r}. "
            f"Fix: e.g. {what} 2 (an elastic range such as 1:4 is not tuned: pin it)"
        )
    return int(value)


def parse_launch_line(text: str, *, devices_available: int = 0) -> LaunchLine:
    """Parse ``text`` (see the module docstring); ``devices_available`` is the world size of a
    launcher told none (``deepspeed`` without ``--num_gpus``: every visible GPU, at least one)."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise ConfigError(
            f"--script: rule: a command line with balanced quotes; {text!r}: {e}"
        ) from None
    if not words:
        raise ConfigError(
            '--script: rule: the launch line you run today, e.g. --script "deepspeed --num_gpus 2 '
            'train.py --deepspeed ds.json"; got an empty line'
        )
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        raise ConfigError(
            f"--script: rule: the line starts with the launcher; got the environment setting "
            f"{words[0]!r}. Fix: export it before running infrarsi, and pass the line without it"
        )
    exe = Path(words[0]).name
    rest = words[1:]
    launcher: Launcher
    if re.fullmatch(r"python(3(\.[0-9]+)?)?", exe) and rest[:2] in (
        ["-m", "torch.distributed.run"],
        ["-m", "torch.distributed.launch"],
    ):
        launcher, rest = "torchrun", rest[2:]
    elif re.fullmatch(r"python(3(\.[0-9]+)?)?", exe):
        launcher = "python"
    elif exe == "deepspeed":
        launcher = "deepspeed"
    elif exe == "torchrun":
        launcher = "torchrun"
    else:
        raise ConfigError(
            f"--script: launcher {words[0]!r}: rule: one of deepspeed, torchrun (or python -m "
            f"torch.distributed.run), python. Fix: pass the line you run with one of them, or write "
            f"the workload's script: block by hand (docs/YOUR_JOB.md)"
        )
    values, flags = LAUNCHER_VALUE_OPTIONS[launcher], LAUNCHER_FLAGS[launcher]
    opts: dict[str, str] = {}
    i = 0
    while i < len(rest) and rest[i].startswith("-"):
        word = rest[i]
        name, eq, val = word.partition("=")
        key = option_name(name)
        if key in ("m", "module"):
            raise ConfigError(
                f"--script: {word!r}: rule: infrarsi runs a script file (train.py), not a module. "
                f"Fix: name the module's file instead"
            )
        if key in values:
            if not eq:
                if i + 1 >= len(rest):
                    raise ConfigError(f"--script: launcher option {name} needs a value; got none")
                i, val = i + 1, rest[i + 1]
            opts[key] = val
        elif key in flags and not eq:
            opts[key] = ""
        else:
            raise ConfigError(
                f"--script: {launcher} option {word!r}: rule: a launcher option infrarsi knows "
                f"({', '.join('--' + k for k in (*values, *flags))}). Fix: drop it from the line"
            )
        i += 1
    if i >= len(rest):
        raise ConfigError(
            f"--script: rule: the line names the training script after the launcher's options; "
            f"{text!r} has none. Fix: e.g. {launcher} train.py --deepspeed ds.json"
        )
    script, args = rest[i], rest[i + 1 :]
    if not script.endswith(".py"):
        raise ConfigError(
            f"--script: script {script!r}: rule: a Python file (*.py). Fix: name your training "
            f"script"
        )
    nodes = 1
    if launcher == "deepspeed":
        if "hostfile" in opts or "launcher" in opts:
            raise ConfigError(
                "--script: --hostfile/--launcher: rule: infrarsi places the ranks on its Ray cluster "
                "itself. Fix: drop them, and give --num_nodes and --num_gpus (per node)"
            )
        nodes = (
            _count(opts["num_nodes"], "--num_nodes", devices_available)
            if "num_nodes" in opts
            else 1
        )
        if "num_gpus" in opts:
            per_node = _count(opts["num_gpus"], "--num_gpus", devices_available)
        elif "include" in opts:  # localhost:0,1 -> 2 devices
            per_node = max(len(opts["include"].split(":", 1)[-1].split(",")), 1)
        else:
            per_node = max(devices_available, 1)
    elif launcher == "torchrun":
        nodes = _count(opts["nnodes"], "--nnodes", devices_available) if "nnodes" in opts else 1
        per_node = (
            _count(opts["nproc_per_node"], "--nproc_per_node", devices_available)
            if "nproc_per_node" in opts
            else 1
        )
    else:
        per_node = 1
    return LaunchLine(
        launcher=launcher,
        script=script,
        args=list(args),
        workers=per_node * nodes,
        nodes=nodes,
        launcher_options=opts,
    )


def arg_value(args: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the first of ``names`` given in ``args`` (``--name V`` or ``--name=V``; a flag
    without a value is ``"true"``); None when none is given."""
    for n in names:
        for i, a in enumerate(args):
            name, eq, val = a.partition("=")
            if not a.startswith("--") or option_name(name) != option_name(n):
                continue
            if eq:
                return val
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                return args[i + 1]
            return "true"
    return None


@dataclass
class ScriptWorkload:
    """The workload ``init --script`` writes, and what it tells the user about it."""

    workload: dict[str, Any]
    """The workload YAML as a mapping."""
    path: Path
    """Where it is written (in the folder the launch line is run from)."""
    kind: ScriptKind
    """How the script reaches its engine."""
    notes: list[str] = field(default_factory=list)
    """Lines for the user: where each baseline value came from, and each one that could not be
    read or mapped to a knob (with why)."""


def _truthy(value: Any) -> bool:
    return str(value).lower() in ("true", "1", "yes")


def _batch(
    cfg: dict[str, Any],
    args: list[str],
    src: ScriptSource,
    world: int,
    where: str,
    notes: list[str],
) -> tuple[int, int]:
    """(micro-batch per rank, global batch) from the DeepSpeed config, else the Trainer's flags."""

    def number(key: str, hf_args: tuple[str, ...], hf_default: int | None) -> int | None:
        v = cfg.get(key)
        if v == "auto" or v is None:
            if src.kind != "hf_trainer" or not hf_args:
                return None
            raw = arg_value(args, hf_args)
            if raw is None:
                raw = src.defaults.get(hf_args[0])
            if raw is None:
                if hf_default is not None:
                    notes.append(
                        f"{key}: not on the line; the Trainer's default {hf_default} ({hf_args[0]})"
                    )
                return hf_default
            v = raw
        try:
            n = int(v)
        except (TypeError, ValueError):
            raise WorkloadError(
                f"{where}: {key}: rule: a whole number of sequences; got {v!r}. Fix your "
                f"DeepSpeed config or launch line"
            ) from None
        return n

    mbs = number(
        "train_micro_batch_size_per_gpu", ("per_device_train_batch_size",), HF_DEFAULT_MICRO_BATCH
    )
    gas = number("gradient_accumulation_steps", ("gradient_accumulation_steps",), 1)
    tbs = number("train_batch_size", (), None)
    if tbs is None:
        if mbs is None:
            raise WorkloadError(
                f"{where}: rule: the DeepSpeed config sets the batch (train_batch_size or "
                f"train_micro_batch_size_per_gpu); it sets neither. Fix: add them to it"
            )
        tbs = mbs * (gas or 1) * world
    elif mbs is None:
        mbs = tbs // ((gas or 1) * world) if tbs % ((gas or 1) * world) == 0 else 0
    if mbs <= 0 or tbs != mbs * (gas or 1) * world:
        raise WorkloadError(
            f"{where}: rule: train_batch_size = micro-batch x accumulation x world size; got "
            f"{tbs} != {mbs} x {gas or 1} x {world}. Fix the DeepSpeed config (or the launcher's "
            f"process count)"
        )
    return mbs, tbs


def baseline_from_config(
    cfg: dict[str, Any], args: list[str], src: ScriptSource, micro_batch: int, notes: list[str]
) -> dict[str, Any]:
    """The knob values the script's DeepSpeed config and arguments ship (before the space's check)."""
    zero = cfg.get("zero_optimization") or {}
    out: dict[str, Any] = {
        "zero_stage": int(zero.get("stage", 0) or 0),
        "micro_batch_size": micro_batch,
    }
    hf = src.kind == "hf_trainer"

    def enabled(key: str, flag: str) -> bool:
        v = (cfg.get(key) or {}).get("enabled", False)
        if v == "auto":
            return hf and _truthy(arg_value(args, (flag,)) or src.defaults.get(flag, False))
        return bool(v)

    if enabled("fp16", "fp16"):
        raise WorkloadError(
            "--script: the DeepSpeed config (or --fp16) trains in fp16, which the search space's "
            "dtype knob (fp32, bf16) cannot express as the baseline. Fix: train the baseline in "
            "bf16 or fp32, or write the workload by hand with a space that has fp16"
        )
    out["dtype"] = "bf16" if enabled("bf16", "bf16") else "fp32"
    for key in ("offload_optimizer", "offload_param"):
        dev = (
            (zero.get(key) or {}).get("device", "none")
            if isinstance(zero.get(key), dict)
            else "none"
        )
        if dev not in ("none", None):
            out[key] = True
            if dev != "cpu":
                notes.append(f"{key}: the config offloads to {dev!r}; the knob offloads to cpu")
    if "overlap_comm" in zero and zero["overlap_comm"] != "auto":
        out["overlap_comm"] = bool(zero["overlap_comm"])
    if "reduce_bucket_size" in zero:
        out["reduce_bucket_size"] = zero["reduce_bucket_size"]
    if hf:
        gc = arg_value(args, ("gradient_checkpointing",)) or src.defaults.get(
            "gradient_checkpointing", False
        )
        out["activation_checkpointing"] = "full" if _truthy(gc) else "none"
    return out


def _fit_to_space(derived: dict[str, Any], space: SearchSpace, notes: list[str]) -> dict[str, Any]:
    """``derived`` less the values the space cannot hold (each noted with why)."""
    from infrarsi.errors import SearchSpaceError

    kept: dict[str, Any] = {}
    for name, value in derived.items():
        if name not in space.names:
            notes.append(
                f"{name}={value!r}: the space {space.file} has no such knob; the script keeps it as is"
            )
            continue
        try:
            kept[name] = space.knob(name).canonical(value)
        except SearchSpaceError:
            knob = space.knob(name)
            notes.append(
                f"{name}={value!r}: not a value of the knob ({list(knob.values)}); the baseline takes "
                f"{knob.default!r}"
            )
    full = space.resolve({k.name: kept.get(k.name, k.default) for k in space.knobs})
    return {k: v for k, v in kept.items() if full[k] == v}


DEFAULT_SPACE = "deepspeed_dense"
"""The space a script's workload gets without ``--space``: the shipped dense DeepSpeed one."""


def default_space() -> Path:
    """The file of ``DEFAULT_SPACE``, shipped with infrarsi (``builtin:deepspeed_dense``)."""
    return builtin_space_path(DEFAULT_SPACE)


def _relative(target: Path, folder: Path) -> str:
    try:
        return os.path.relpath(target, folder)
    except ValueError:  # another drive
        return str(target)


def script_workload(
    line: LaunchLine,
    *,
    cwd: Path,
    space: Path | None = None,
    seq_len: int | None = None,
    device: Literal["cpu", "cuda"] = "cpu",
) -> ScriptWorkload:
    """The workload of ``line`` run from ``cwd`` (see the module docstring)."""
    from infrarsi.execution.script_config import script_ds_config
    from infrarsi.execution.script_preflight import config_arg
    from infrarsi.search import SearchSpace
    from infrarsi.workload import StepsSpec

    cwd = cwd.resolve()
    script = (cwd / line.script).resolve()
    if not script.is_file():
        raise ConfigError(
            f"--script: script {line.script!r}: rule: a file, relative to the folder the line is run "
            f"from ({cwd}); it is {script}, which is not a file. Fix: run init from the folder you "
            f"launch from, or fix the path"
        )
    src = read_script(script)
    what = {
        "hf_trainer": "a Hugging Face Trainer script",
        "deepspeed": "calls deepspeed.initialize",
    }.get(src.kind, "plain torch, no DeepSpeed")
    notes: list[str] = [
        f"script: {line.script} ({what}), "
        f"launcher {line.launcher}, {line.workers} ranks on {line.nodes} node(s), device {device}"
    ]
    name = config_arg(line.args)
    if name is None and src.kind == "torch":
        raise ConfigError(
            f"--script: script {line.script!r}: rule: infrarsi reaches a script through DeepSpeed (its own "
            f"deepspeed.initialize, or a Trainer's --deepspeed ds.json); this one imports neither deepspeed nor "
            f"a transformers Trainer, and plain torch (DDP/FSDP) scripts are not tuned yet. Fix: launch it with a "
            f"DeepSpeed config, or write an entry-point job (docs/YOUR_JOB.md)"
        )
    if name is None:
        raise ConfigError(
            f"--script: rule: the script's arguments name its DeepSpeed config (--deepspeed_config "
            f"FILE, or --deepspeed FILE for a Trainer script); {line.args} names none. Fix: add it; "
            f"infrarsi merges each trial's knobs into it"
        )
    try:
        cfg = script_ds_config(None, name, None, cwd=cwd)
    except WorkloadError as e:
        raise WorkloadError(f"--script: {e}") from None
    where = f"--script: DeepSpeed config {name!r} ({cwd / name})"
    mbs, global_batch = _batch(cfg, line.args, src, line.workers, where, notes)
    if seq_len is None:
        raw = arg_value(line.args, SEQ_LEN_ARGS)
        origin = "the line"
        if raw is None:
            raw = next((src.defaults[k] for k in SEQ_LEN_ARGS if k in src.defaults), None)
            origin = "the script's default"
        if raw is None:
            raise ConfigError(
                f"--script: rule: infrarsi must know the tokens per sequence the script trains (the "
                f"contract fixes tokens per step); neither the line nor the script's argument "
                f"defaults name one ({', '.join('--' + a for a in SEQ_LEN_ARGS[:4])}...). Fix: pass "
                f"--seq-len N to init"
            )
        try:
            seq_len = int(raw)
        except (TypeError, ValueError):
            raise ConfigError(
                f"--script: the sequence length {raw!r} from {origin} is not a whole number. Fix: "
                f"pass --seq-len N to init"
            ) from None
        notes.append(f"tokens per sequence: {seq_len} (from {origin})")
    steps = StepsSpec()
    total = steps.warmup + steps.measured
    raw_steps = arg_value(line.args, STEPS_ARGS)
    if raw_steps is None:
        raw_steps = next((src.defaults[k] for k in STEPS_ARGS if k in src.defaults), None)
    if (
        raw_steps is not None
        and str(raw_steps).lstrip("-").isdigit()
        and 0 < int(raw_steps) < total
    ):
        raise ConfigError(
            f"--script: rule: the script trains at least a trial's {total} optimizer steps; it "
            f"trains {raw_steps}. Fix: raise its step count on the line (e.g. --max_steps {total})"
        )
    space_path = space_file(space).resolve() if space else default_space()
    if not space_path.is_file():
        raise ConfigError(
            f"--space {str(space_path)!r}: rule: a search-space YAML file. Fix: pass --space"
        )
    sp = SearchSpace.from_yaml(space_path)
    derived = baseline_from_config(cfg, line.args, src, mbs, notes)
    baseline = _fit_to_space(derived, sp, notes)
    notes.append(
        f"baseline from {name}"
        + (" and the Trainer's flags" if src.kind == "hf_trainer" else "")
        + f": {baseline}; global batch {global_batch} sequences x {seq_len} tokens"
    )
    if (
        space is None
    ):  # shipped spaces by name: the YAML works in a wheel install and a checkout alike
        space_name = BUILTIN_PREFIX + DEFAULT_SPACE
    elif str(space).startswith(BUILTIN_PREFIX):
        space_name = str(space)
    else:
        space_name = _relative(space_path, cwd)
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", script.stem) or "script"
    out = cwd / f"{stem}.infrarsi.yaml"
    workload: dict[str, Any] = {
        "name": f"{stem}_script",
        "script": {
            "path": _relative(script, cwd),
            "args": list(line.args),
            "launcher": line.launcher,
        },
        "data": {"seq_len": seq_len},
        "tokens_per_step": global_batch * seq_len,
        "steps": {"warmup": steps.warmup, "measured": steps.measured},
        "resources": {"workers": line.workers, "nodes": line.nodes, "device": device},
        "baseline": baseline,
        "search_space": space_name,
    }
    return ScriptWorkload(workload=workload, path=out, kind=src.kind, notes=notes)


def visible_devices() -> tuple[Literal["cpu", "cuda"], int]:
    """The device kind trials would run on here, and how many GPUs are visible (0 on CPU)."""
    import torch

    return ("cuda", torch.cuda.device_count()) if torch.cuda.is_available() else ("cpu", 0)


def workload_from_launch_line(
    command: str, *, cwd: Path | None = None, space: Path | None = None, seq_len: int | None = None
) -> ScriptWorkload:
    """Parse ``command``, read its script and DeepSpeed config, check the workload and write it
    (``write_script_workload``); what ``infrarsi init --script`` runs before the usual ``init``."""
    from infrarsi.workload import Workload

    device, count = visible_devices()
    line = parse_launch_line(command, devices_available=count)
    sw = script_workload(line, cwd=cwd or Path.cwd(), space=space, seq_len=seq_len, device=device)
    Workload.from_dict(
        dict(sw.workload), source=str(sw.path)
    )  # a workload that loads, before it is written
    write_script_workload(sw, command)
    return sw


def init_workload_argument(
    workload: Path | None,
    script: str | None,
    *,
    space: Path | None,
    seq_len: int | None,
    say: Callable[[str], Any] = print,
) -> Path:
    """The workload ``init`` locks: ``WORKLOAD``, or the one written from ``--script`` (its notes
    handed to ``say``); ``ConfigError`` unless exactly one of them is given."""
    if script is None or workload is not None:
        if workload is None or script is not None:
            raise ConfigError(
                'init: rule: name the job once: a WORKLOAD YAML, or --script "the launch line you '
                'run today". Fix: pass exactly one of them'
            )
        return workload
    sw = workload_from_launch_line(script, space=space, seq_len=seq_len)
    say(f"workload written: {sw.path}")
    for note in sw.notes:
        say(f"  {note}")
    return sw.path


def write_script_workload(sw: ScriptWorkload, command: str) -> Path:
    """Write ``sw`` to ``sw.path`` with the launch line in a comment; an existing file with other
    content is refused (``ConfigError``): it is the user's."""
    text = (
        f"# Written by `infrarsi init --script`, from the launch line:\n#   {command}\n"
        + yaml.safe_dump(sw.workload, sort_keys=False)
    )
    if sw.path.exists() and sw.path.read_text() != text:
        raise ConfigError(
            f"--script: the workload file {sw.path} exists with other content. Fix: remove or rename "
            f"it (or pass it as the WORKLOAD argument instead of --script)"
        )
    sw.path.write_text(text)
    return sw.path


__all__ = [
    "LaunchLine",
    "ScriptWorkload",
    "arg_value",
    "baseline_from_config",
    "default_space",
    "init_workload_argument",
    "parse_launch_line",
    "script_workload",
    "visible_devices",
    "workload_from_launch_line",
    "write_script_workload",
]
