"""Import a training job's entry point from its code directory and check what it returns.

``load_job(code_dir, entry_point, ctx)`` imports ``module:function`` afresh from ``code_dir``
(a warm worker may see another code dir, or a patched worktree of it, in its next trial: the
modules of the entry point's top-level package are dropped from ``sys.modules`` first), calls it
with the ``JobContext`` and checks that it returned a ``TrainingJob``. Every failure is a
``JobError`` that names the entry point, the folder and the fix.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infrarsi.errors import JobError
from infrarsi.job import JobContext, ModelShape, TrainingJob
from infrarsi.workload import Workload


def _drop_modules(top: str) -> None:
    for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
        del sys.modules[name]


_LAST: dict[str, Any] = {}
"""The last import: ``key`` (folder, entry point, the folder's modification times) -> ``fn``. A
warm worker's next trial from the same unchanged folder reuses it (the common case: every
trial and its eval reference come from one folder); any other folder is imported afresh."""


def _folder_key(folder: str, entry_point: str) -> tuple[Any, ...]:
    top = Path(folder) / entry_point.partition(":")[0].split(".")[0]
    paths = sorted(top.rglob("*.py")) if top.is_dir() else [top.with_suffix(".py")]
    return (folder, entry_point, tuple((str(p), p.stat().st_mtime_ns) for p in paths if p.exists()))


def import_entry(
    code_dir: str | Path, entry_point: str, *, where: str = "model.entry_point"
) -> Callable[[JobContext], Any]:
    """The function ``entry_point`` (``module:function``) imported afresh from ``code_dir`` (or
    the previous import, when it came from the same folder and its files are unchanged)."""
    folder = str(Path(code_dir).resolve())
    key = _folder_key(folder, entry_point) if Path(folder).is_dir() else None
    if key is not None and _LAST.get("key") == key:
        return _LAST["fn"]  # type: ignore[no-any-return]
    fn = _import_entry(folder, entry_point, where=where)
    _LAST.update(key=key, fn=fn)
    return fn


def _import_entry(folder: str, entry_point: str, *, where: str) -> Callable[[JobContext], Any]:
    module_name, _, func_name = entry_point.partition(":")
    if not module_name or not func_name:
        raise JobError(
            f"{where}: {entry_point!r} is not 'module:function'; e.g. 'my_job:make_job'."
        )
    if not Path(folder).is_dir():
        raise JobError(
            f"{where}: code_dir {folder!r} is not a folder; set model.code_dir to the folder "
            f"holding {module_name.split('.')[0]!r} (relative to the workload YAML)."
        )
    _drop_modules(module_name.split(".")[0])
    if folder in sys.path:
        sys.path.remove(folder)
    sys.path.insert(0, folder)
    importlib.invalidate_caches()
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        tb = traceback.format_exc(limit=-3)
        raise JobError(
            f"{where}: cannot import module {module_name!r} from {folder}: {type(e).__name__}: {e}. "
            f"Check model.code_dir and that the module imports on its own.\n{tb}"
        ) from None
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise JobError(
            f"{where}: module {module_name!r} ({getattr(module, '__file__', folder)}) has no function "
            f"{func_name!r}; define `def {func_name}(ctx: infrarsi.job.JobContext) -> TrainingJob`."
        )
    return fn  # type: ignore[no-any-return]


def load_job(
    code_dir: str | Path, entry_point: str, ctx: JobContext, *, where: str = "model.entry_point"
) -> TrainingJob:
    """Call the entry point with ``ctx``; a ``JobError`` unless it returns a well-formed ``TrainingJob``."""
    fn = import_entry(code_dir, entry_point, where=where)
    try:
        job = fn(ctx)
    except JobError:
        raise
    except Exception as e:
        tb = traceback.format_exc(limit=-3)
        raise JobError(
            f"{where}: {entry_point}(ctx) raised {type(e).__name__}: {e}\n{tb}"
        ) from None
    return check_job(job, entry_point, where=where)


def check_job(job: Any, entry_point: str, *, where: str = "model.entry_point") -> TrainingJob:
    """``job`` if it is a well-formed ``TrainingJob``, else a ``JobError`` naming the field."""
    if not isinstance(job, TrainingJob):
        raise JobError(
            f"{where}: {entry_point}(ctx) returned {type(job).__name__}, not infrarsi.job.TrainingJob; "
            f"return TrainingJob(build_model=..., shape=ModelShape(...))."
        )
    problems = []
    if not callable(job.build_model):
        problems.append("build_model must be a callable returning the model (not the model itself)")
    if not isinstance(job.shape, ModelShape):
        problems.append(f"shape must be an infrarsi.job.ModelShape, got {type(job.shape).__name__}")
    else:
        for f in ("n_layers", "dim", "vocab_size"):
            v = getattr(job.shape, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                problems.append(f"shape.{f} must be a positive int, got {v!r}")
    for f in ("forward", "loss", "global_batch", "eval_batch"):
        v = getattr(job, f)
        if v is not None and not callable(v):
            problems.append(f"{f} must be callable or None, got {type(v).__name__}")
    if problems:
        raise JobError(
            f"{where}: {entry_point}(ctx) returned a TrainingJob with " + "; ".join(problems) + "."
        )
    return job


def preflight(workload: Workload, *, code_dir: str | Path | None = None) -> TrainingJob:
    """What ``init`` checks before any trial, in this process and without a device: the entry
    point imports and returns a well-formed ``TrainingJob``, its model builds (on the meta
    device: no memory, no weights) into a ``torch.nn.Module``, and its own data, or the
    workload's token file, gives batches of the right shape inside the vocabulary. A
    ``JobError`` (exit 2 from the CLI) names the workload file, the field and the fix."""
    import torch

    from infrarsi.execution.data_sources import make_source
    from infrarsi.execution.runner import default_code_dir

    where = f"{workload.path or workload.name}: model.entry_point"
    entry, args = workload.job_model().entry()
    folder = code_dir if code_dir is not None else default_code_dir(workload)
    ctx = JobContext(
        args=args,
        options={},
        device=workload.resources.device,
        rank=0,
        world_size=workload.world_size,
        seq_len=workload.data.seq_len,
        reference=True,
    )
    job = load_job(folder, entry, ctx, where=where)
    try:
        with torch.device("meta"):
            model = job.build_model()
    except Exception as e:
        raise JobError(
            f"{where}: {entry}: build_model() raised {type(e).__name__}: {e} (it is called on the meta "
            f"device here: build the model in place, do not move it or read weight values)"
        ) from None
    if not isinstance(model, torch.nn.Module):
        raise JobError(
            f"{where}: {entry}: build_model() returned {type(model).__name__}, not a torch.nn.Module."
        )
    gbs = workload.global_batch_size
    data_path = workload.data_path()
    try:
        source = make_source(
            workload.data,
            job.shape.vocab_size,
            job=job,
            data_path=str(data_path) if data_path else None,
        )
        b = source.global_batch(0, gbs)
    except JobError:
        raise
    except Exception as e:
        raise JobError(
            f"{where}: the job's data (global_batch(0, {gbs})) failed: {type(e).__name__}: {e}"
        ) from None
    want = (gbs, workload.data.seq_len)
    for name in ("inputs", "targets"):
        t = getattr(b, name, None)
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != want:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise JobError(
                f"{where}: global_batch(0, {gbs}).{name} must be a [{gbs}, {workload.data.seq_len}] "
                f"tensor of token ids (tokens_per_step / seq_len rows of data.seq_len), got {got}."
            )
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= job.shape.vocab_size):
            raise JobError(
                f"{where}: global_batch(0, {gbs}).{name} holds token ids outside [0, "
                f"shape.vocab_size={job.shape.vocab_size})."
            )
    return job


__all__ = ["check_job", "import_entry", "load_job", "preflight"]
