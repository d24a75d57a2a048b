"""``apply`` for a script workload: the winner written into what the script itself reads.

A script workload (``script:`` in the workload YAML) runs the user's unchanged training script, so
an infrarsi-only ``deepspeed_config.json`` is not something it reads. ``write_script_files`` (called
by ``apply`` inside the new branch's worktree) also writes:

- **the script's own DeepSpeed config** (the file its arguments name: ``--deepspeed_config FILE``,
  or a Trainer's ``--deepspeed FILE``), the winning trial's knob keys merged in by the same merge
  the trial made (``script_config.merge_trial_keys`` of the keys the trial's logged engine config
  holds, ``trial_keys``): the user's other keys kept, in their order, as indented JSON. For a
  Trainer script the ``"auto"`` values transformers fills from ``TrainingArguments`` (batch keys,
  ``bf16``/``fp16`` ``enabled``) stay ``"auto"``, as does every other ``"auto"`` of the user's;
  for a script of its own, the file is exactly the engine config the winning trial logged. Either
  way each value written is checked against that logged config (``ApplyError`` naming the key when
  the file at the base commit is not the one the trial merged into);
- **the launch line** (``infrarsi/<study>/launch.sh``, and in its README): the workload's launcher
  and arguments, run from the workload YAML's folder, with a Trainer's
  ``--per_device_train_batch_size``, ``--gradient_accumulation_steps``, ``--bf16``/``--fp16`` and
  ``--gradient_checkpointing`` set as the trial set them (``script_hf.trainer_overrides``), and the
  environment a knob needs at process start (``threads_per_worker``: ``OMP_NUM_THREADS``).

The workload YAML itself (and so ``script.args``) is not edited: it is the study's contract.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infrarsi.errors import ApplyError, ConfigError, InfrarsiError
from infrarsi.execution.script_config import (
    BATCH_KEYS,
    merge_trial_config,
    merge_trial_keys,
    script_ds_config,
    trial_keys,
)
from infrarsi.execution.script_preflight import config_arg
from infrarsi.execution.script_source import option_name, read_script
from infrarsi.result import TrialResult
from infrarsi.study.contract import Contract
from infrarsi.study.verify_report import VerifiedCandidate
from infrarsi.workload import Workload, script_root

TRAINER_ARGS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "bf16",
    "fp16",
    "gradient_checkpointing",
    "auto_find_batch_size",
)
"""The ``TrainingArguments`` fields a trial sets (``script_hf.apply_to_args``), so ``apply``
writes them on a Trainer script's launch line."""

TRAINER_AUTO_KEYS = (*BATCH_KEYS, "bf16.enabled", "fp16.enabled")
"""Config keys transformers fills from ``TrainingArguments`` when they are ``"auto"``: a Trainer
script's config keeps them ``"auto"`` and the launch line carries the values."""


@dataclass
class ScriptApplied:
    """What ``write_script_files`` wrote for a script workload."""

    paths: list[Path] = field(default_factory=list)
    """Files written in the worktree (the script's config, ``launch.sh``)."""
    config_file: str | None = None
    """The script's DeepSpeed config, relative to the repository (None: its arguments name none)."""
    command: str = ""
    """The launcher, the script and the winning arguments, run from ``cwd``."""
    env: dict[str, str] = field(default_factory=dict)
    """The environment the winning knobs need at process start (``process_env``)."""
    cwd: str = "."
    """The folder it runs from (the workload YAML's), relative to the repository."""
    changed_args: list[str] = field(default_factory=list)
    """``--name value`` of each argument the winner sets on the line."""

    @property
    def launch_line(self) -> str:
        """``command`` with ``env`` before it, as a shell line."""
        return " ".join(
            [*(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())), self.command]
        )

    def message(self) -> str:
        """Lines for the commit message."""
        cfg = (
            f"{self.config_file}: the winning DeepSpeed keys merged in (as the trial ran them)"
            if self.config_file
            else "no DeepSpeed config file on the line: merge deepspeed_config.json's keys where "
            "the script builds its config"
        )
        args = ", ".join(self.changed_args) if self.changed_args else "unchanged"
        return f"Script: {cfg}; launch line (launch.sh, README): arguments {args}\n"


def _leaves(node: Any, where: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_leaves(v, f"{where}.{k}" if where else str(k)))
        return out
    return {where: node}


def _ordered_like(new: Any, old: Any) -> Any:
    """``new`` with its keys in ``old``'s order (new keys after them), at every depth."""
    if not isinstance(new, dict) or not isinstance(old, dict):
        return new
    keys = [k for k in old if k in new] + [k for k in new if k not in old]
    return {k: _ordered_like(new[k], old.get(k)) for k in keys}


def _engine_config(best: VerifiedCandidate, rows: list[TrialResult]) -> tuple[dict[str, Any], str]:
    """The DeepSpeed config the winner's verify trials built their engine from, and a trial id."""
    logged = [
        (r.extra.ds_config, r.trial_id)
        for r in rows
        if r.trial_id in best.trial_ids and isinstance(r.extra.ds_config, dict)
    ]
    if not logged:
        raise ApplyError(
            f"the verify trials of the winner ({', '.join(best.trial_ids)}) logged no DeepSpeed "
            f"config (extra.ds_config): apply writes into the script's config only what a trial "
            f"ran. Re-run `infrarsi verify` with this infrarsi."
        )
    first, tid = logged[0]
    for cfg, other in logged[1:]:
        if cfg != first:
            raise ApplyError(
                f"verify trials {tid} and {other} of the winner built different DeepSpeed configs; "
                f"apply cannot tell which one to write. Re-run `infrarsi verify`."
            )
    return dict(first), tid


def script_file_config(
    script: dict[str, Any],
    engine: dict[str, Any],
    knobs: list[str],
    *,
    trainer: bool,
    num_params: int,
) -> dict[str, Any]:
    """The script's config ``script`` with the trial's knob keys of ``engine`` (the config its
    engine was built from) merged in, as the trial merged them; a Trainer script keeps
    ``TRAINER_AUTO_KEYS`` (and all its other ``"auto"``) for transformers to fill."""
    client = bool(engine.get("zero_allow_untested_optimizer")) and (
        not (engine.get("zero_optimization") or {}).get("offload_optimizer")
        or engine.get("zero_force_ds_cpu_optimizer") is False
    )
    part = trial_keys(engine, knobs)
    if not trainer:
        out = merge_trial_config(
            script, part, knobs, num_params=num_params, hidden_size=0, client_optimizer=client
        )
        return _ordered_like(out, script)  # type: ignore[no-any-return]
    out = merge_trial_keys(script, part, knobs, client_optimizer=client)
    for key in TRAINER_AUTO_KEYS:
        top, _, sub = key.partition(".")
        was = script.get(top)
        if not sub and was == "auto":
            out[top] = "auto"
        elif sub and isinstance(was, dict) and was.get(sub) == "auto":
            out[top] = {**(out.get(top) or {}), sub: "auto"}
    return _ordered_like(out, script)  # type: ignore[no-any-return]


ACCELERATE_OWNED: dict[str, str] = {
    "steps_per_print": "accelerate's DeepSpeedPlugin sets it to infinity (DeepSpeed's logging "
    "off) whatever the file says",
}
"""Keys of a Trainer script's DeepSpeed config that accelerate overwrites before the engine is
built, with why: the file's value never reaches the engine, so it is not compared."""


def check_ran(written: dict[str, Any], engine: dict[str, Any], *, trainer: bool) -> list[str]:
    """Each way ``written`` differs from the engine config the trial ran (``key: here X, trial Y``):
    every value that is not ``"auto"`` must be the engine's, and a script of its own's file must
    hold no more and no fewer keys (a Trainer's config gains keys transformers fills, and loses
    to accelerate the keys of ``ACCELERATE_OWNED``)."""
    mine, ran = _leaves(written), _leaves(engine)
    keys = (
        [k for k in mine if k not in ACCELERATE_OWNED]
        if trainer
        else [*mine, *(k for k in ran if k not in mine)]
    )
    missing = object()
    out = []
    for k in keys:
        here, there = mine.get(k, missing), ran.get(k, missing)
        if here == "auto" and trainer:
            continue
        if here != there:
            out.append(
                f"{k}: {'absent' if here is missing else json.dumps(here)} here, "
                f"{'absent' if there is missing else json.dumps(there)} in the trial"
            )
    return out


def set_option(args: list[str], name: str, value: Any, default: Any = None) -> list[str]:
    """``args`` with option ``--name`` set to ``value``, in place where it is given (its spelling
    kept, ``--name V`` or ``--name=V``), else appended. ``True`` is the bare flag; ``False`` drops
    the option, and writes ``--name false`` when the script's own ``default`` is true."""
    out: list[str] = []
    at: int | None = None
    i = 0
    while i < len(args):
        a = args[i]
        key, eq, _ = a.partition("=")
        if a.startswith("--") and option_name(key) == name:
            if not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
                i += 1
            at = len(out) if at is None else at
            spelled = key
        else:
            out.append(a)
        i += 1
    flag = spelled if at is not None else f"--{name}"
    if value is True:
        new = [flag]
    elif value is False:
        new = [flag, "false"] if str(default).lower() in ("true", "1") else []
    else:
        new = [flag, str(value)]
    pos = len(out) if at is None else at
    return [*out[:pos], *new, *out[pos:]]


def changed_options(old: list[str], new: list[str], names: tuple[str, ...]) -> list[str]:
    """``--name value`` (``--name`` for a flag, ``--name (removed)``) of each of ``names`` whose
    value differs between the argument lists ``old`` and ``new``."""
    from infrarsi.stages.init_script import arg_value

    out = []
    for n in names:
        was, now = arg_value(old, (n,)), arg_value(new, (n,))
        if was != now:
            out.append(f"--{n}" + {None: " (removed)", "true": ""}.get(now, f" {now}"))
    return out


def trainer_args(
    args: list[str],
    engine: dict[str, Any],
    config: dict[str, Any],
    world: int,
    defaults: dict[str, Any],
) -> list[str]:
    """A Trainer script's arguments with the fields the trial set on ``TrainingArguments``
    (``script_hf.apply_to_args``): micro-batch, accumulation, precision, checkpointing, and
    ``auto_find_batch_size`` off."""
    from infrarsi.execution.script_hf import trainer_overrides

    try:
        ov = trainer_overrides(engine, config, world)
    except InfrarsiError as e:
        raise ApplyError(f"cannot write the winner's Trainer arguments: {e}") from None
    out = set_option(args, "per_device_train_batch_size", ov.per_device_train_batch_size)
    out = set_option(out, "gradient_accumulation_steps", ov.gradient_accumulation_steps)
    fields: list[tuple[str, Any]] = [("auto_find_batch_size", False)]
    if ov.bf16 is not None:
        fields += [("bf16", ov.bf16), ("fp16", False)]
    if ov.gradient_checkpointing is not None:
        fields.append(("gradient_checkpointing", ov.gradient_checkpointing))
    for name, value in fields:
        out = set_option(out, name, value, defaults.get(name))
    return out


def launch_command(wl: Workload, args: list[str]) -> str:
    """The command that launches the script as the trials did: its launcher with the workload's
    ranks per node and nodes, the script and ``args``."""
    assert wl.script is not None
    per_node, nodes = wl.world_size // wl.resources.nodes, wl.resources.nodes
    launcher = {
        "deepspeed": ["deepspeed", "--num_gpus", str(per_node)]
        + (["--num_nodes", str(nodes)] if nodes > 1 else []),
        "torchrun": ["torchrun", "--nproc_per_node", str(per_node)]
        + (["--nnodes", str(nodes)] if nodes > 1 else []),
        "python": ["python"],
    }[wl.script.launcher]
    return shlex.join([*launcher, wl.script.path, *args])


def _repo_relative(path: Path, root: Path, what: str) -> Path:
    if not path.is_relative_to(root):
        raise ApplyError(
            f"{what} {path} lies outside the job's repository {root}; apply writes only inside the "
            f"new branch. Keep it in the repository (relative to the workload YAML)."
        )
    return path.relative_to(root)


def write_script_files(
    wt: Path,
    out: Path,
    contract: Contract,
    best: VerifiedCandidate,
    rows: list[TrialResult],
) -> ScriptApplied | None:
    """For a script workload, write the winner into the script's own DeepSpeed config in ``wt``
    (the new branch's worktree) and its launch line into ``out/launch.sh`` and ``out/README.md``
    (see the module docstring); None (nothing written) for an entry-point workload."""
    if not contract.workload.get("script"):
        return None
    from infrarsi.execution.knobs.registry import process_env

    wl = contract.workload_model()
    assert wl.script is not None
    if not contract.workload_path:
        raise ApplyError(
            "the contract names no workload file: apply cannot find the script's files"
        )
    folder = Path(contract.workload_path).resolve().parent
    root = script_root(folder)
    cwd = _repo_relative(folder, root, "the workload YAML's folder")
    script = wt / _repo_relative((folder / wl.script.path).resolve(), root, "the script")
    try:
        src = read_script(script)
    except ConfigError as e:
        raise ApplyError(f"the script is not in the branch's base commit: {e}") from None
    trainer = src.kind == "hf_trainer"
    engine, tid = _engine_config(best, rows)
    config = dict(best.config)
    res = ScriptApplied(cwd=str(cwd))
    name = config_arg(list(wl.script.args))
    if name is not None:
        rel = _repo_relative((folder / name).resolve(), root, f"the DeepSpeed config {name!r}")
        target = wt / rel
        num_params = next((r.extra.num_params for r in rows if r.trial_id == tid), None)
        try:  # as the trial read it
            mine = script_ds_config(None, str(target), None)
            new = script_file_config(
                mine, engine, list(config), trainer=trainer, num_params=int(num_params or 1)
            )
        except InfrarsiError as e:
            raise ApplyError(f"{rel}: {e}") from None
        diff = check_ran(new, engine, trainer=trainer)
        if diff:
            raise ApplyError(
                f"{rel} at the base commit is not the config the winning trial {tid} merged into: "
                f"{'; '.join(diff[:5])}. apply writes exactly what verify measured: restore the "
                f"file as the study ran it, or re-run the study on the new one."
            )
        indent = re.search(r"\n([ \t]+)\S", target.read_text())
        target.write_text(json.dumps(new, indent=indent.group(1) if indent else 2) + "\n")
        res.config_file, res.paths = str(rel), [target]
    args = list(wl.script.args)
    if trainer:
        args = trainer_args(args, engine, config, wl.world_size, src.defaults)
        res.changed_args = changed_options(list(wl.script.args), args, TRAINER_ARGS)
    res.command, res.env = launch_command(wl, args), process_env(config)
    res.paths.append(_write_launch(out, wt / cwd, res))
    _readme_section(out / "README.md", res)
    return res


def _write_launch(out: Path, run_dir: Path, res: ScriptApplied) -> Path:
    up = os.path.relpath(run_dir, out)
    p = out / "launch.sh"
    p.write_text(
        "#!/bin/sh\n# Written by `infrarsi apply`: the winning launch line, run from the workload "
        "YAML's folder.\n# Launcher options of your own (--hostfile, --master_port) go before "
        "the script.\nset -e\n"
        + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(res.env.items()))
        + f'cd "$(dirname "$0")/{up}"\nexec {res.command} "$@"\n'
    )
    p.chmod(0o755)
    return p


def _readme_section(readme: Path, res: ScriptApplied) -> None:
    cfg = (
        f"- `{res.config_file}`: your script's DeepSpeed config, with the winning keys merged in "
        f"exactly as the winning trial merged them (your other keys kept"
        + (', and `"auto"` for the Trainer to fill from its arguments)\n')
        if res.config_file
        else "- no DeepSpeed config file is named on the line: merge `deepspeed_config.json`'s keys "
        "where your script builds its config\n"
    )
    args = (
        "with the winning arguments " + ", ".join(f"`{a}`" for a in res.changed_args)
        if res.changed_args
        else "with your arguments unchanged (the knobs live in the config)"
    )
    readme.write_text(
        readme.read_text()
        + f"\n## Run it\n\nYour script reads the winner from this branch:\n\n{cfg}"
        f"- `launch.sh`: the launch line, {args}; run from `{res.cwd}`:\n\n"
        f"```sh\n{res.launch_line}\n```\n\n"
        '`deepspeed_config.json` is the engine config the winning trial built (every `"auto"` '
        "resolved), kept as evidence. The workload YAML (the study's contract) is unchanged: its "
        "`script.args` are the baseline's.\n"
    )


__all__ = [
    "ACCELERATE_OWNED",
    "TRAINER_ARGS",
    "TRAINER_AUTO_KEYS",
    "ScriptApplied",
    "changed_options",
    "check_ran",
    "launch_command",
    "script_file_config",
    "set_option",
    "trainer_args",
    "write_script_files",
]
