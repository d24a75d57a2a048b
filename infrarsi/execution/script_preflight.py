"""What ``init`` checks of a script workload before any trial, without running the script.

``script_preflight(workload)`` (a ``WorkloadError``, exit 2, naming the file, the field, the
rule, the value and the fix):

- ``script.path`` is a Python file inside the job's git repository (``Workload.script_layout``);
- the script compiles (``compile``: a syntax check; the script is not run here);
- a DeepSpeed config named in ``script.args`` (``--deepspeed_config FILE``, or ``--deepspeed
  FILE`` as Hugging Face scripts take it) is a JSON object, relative to the workload YAML's folder;
- its numeric ``train_batch_size``, if any, is the contract's global batch (``tokens_per_step /
  data.seq_len``): the harness sets the batch keys from the contract, and a script that trains
  another batch is another job.
"""

from __future__ import annotations

from pathlib import Path

from infrarsi.errors import WorkloadError
from infrarsi.execution.script_config import script_ds_config
from infrarsi.workload import Workload


def config_arg(args: list[str]) -> str | None:
    """The DeepSpeed config file named in a script's arguments (None: none named)."""
    for i, a in enumerate(args):
        for flag in ("--deepspeed_config", "--deepspeed"):
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
            if a == flag and i + 1 < len(args) and not args[i + 1].startswith("-"):
                return args[i + 1]
    return None


def script_preflight(wl: Workload) -> None:
    """Check a script workload (see the module docstring)."""
    if wl.script is None:
        raise WorkloadError(f"{wl.path or wl.name}: field 'script': not set")
    where = f"{wl.path or wl.name}: field 'script"
    wl.script_layout()  # a file inside the job's repository
    path = wl.script_path()
    if path is None:
        raise WorkloadError(f"{where}.path': not set")
    try:
        compile(path.read_text(), str(path), "exec")
    except (SyntaxError, ValueError, UnicodeDecodeError) as e:
        raise WorkloadError(
            f"{where}.path': rule: a Python script that compiles; {wl.script.path!r} does not: "
            f"{type(e).__name__}: {e}. Fix the script"
        ) from None
    name = config_arg(list(wl.script.args))
    if name is None:
        return
    folder = path.parent if not wl.path else Path(wl.path).resolve().parent
    try:
        cfg = script_ds_config(None, name, None, cwd=folder)
    except WorkloadError as e:
        raise WorkloadError(f"{where}.args': {e}") from None
    tbs = cfg.get("train_batch_size")
    if isinstance(tbs, int) and not isinstance(tbs, bool) and tbs != wl.global_batch_size:
        raise WorkloadError(
            f"{where}.args': rule: the script's DeepSpeed config {name!r} trains train_batch_size={tbs} sequences "
            f"per step, but the workload's tokens_per_step / data.seq_len = {wl.tokens_per_step} / "
            f"{wl.data.seq_len} = {wl.global_batch_size}. Fix: make them agree (or set train_batch_size: auto)"
        )


__all__ = ["config_arg", "script_preflight"]
