"""The launcher's world for a user's script on one rank, and the harness's ``deepspeed.initialize``.

``launched(argv, cwd, script_dir, env, run)`` is a context manager: inside it the process looks
to the script as a ``deepspeed``/``torchrun`` launch would (environment, ``sys.argv``, working
directory, the script's folder first on ``sys.path``), ``deepspeed.initialize`` is the harness's
(``run.initialize``; also where accelerate or transformers hold DeepSpeed's under their own
name: ``rebind``), and the harness's process group stays up (``init_process_group`` joins it,
``destroy_process_group`` does nothing). Everything is undone on exit, and the modules the
script imported from its own folder are dropped, so the next trial (or a restart of the same
one) imports a fresh, possibly patched, copy. ``script_job`` runs a trial inside it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch.distributed as dist


class LaunchedRun(Protocol):
    """What ``launched`` hands ``deepspeed.initialize`` to: a script run (``script_job.ScriptRun``)."""

    def initialize(self, real: Any, *a: Any, **k: Any) -> Any: ...


def script_argv(script: str, args: list[str], launcher: str, local_rank: int) -> list[str]:
    """``sys.argv`` of the script on a rank: what the launcher would hand it."""
    argv = [script, *args]
    if launcher == "deepspeed":
        argv.append(f"--local_rank={local_rank}")
    return argv


_ACTIVE: list[LaunchedRun] = []
"""The script run in progress in this process (at most one)."""
_REAL: dict[str, Any] = {}
"""The functions ``launched`` replaces, as they were before the first script run."""


def _harness_initialize(*a: Any, **k: Any) -> Any:
    """``deepspeed.initialize`` while a script runs. One stable function: a helper module the
    script imported in an earlier trial (``from deepspeed import initialize``, cached in
    ``sys.modules``) reaches the current run; outside a run it is DeepSpeed's own."""
    if not _ACTIVE:
        return _REAL["initialize"](*a, **k)
    return _ACTIVE[-1].initialize(_REAL["initialize"], *a, **k)


def _init_process_group(*a: Any, **k: Any) -> None:
    """The harness's group is already up: a script's own ``init_process_group`` joins it."""
    if not dist.is_initialized():
        _REAL["init_process_group"](*a, **k)


def _destroy_process_group(*a: Any, **k: Any) -> None:
    """The harness's group outlives the trial (a warm worker runs the next one in it)."""
    return None


REBIND_PREFIXES = ("accelerate", "transformers")
"""Packages whose modules may hold DeepSpeed's ``initialize`` under their own name, imported
before a run (``from deepspeed import initialize as ds_initialize``): the Trainer's way in."""


def rebind(prefixes: tuple[str, ...], old: Any, new: Any) -> list[tuple[Any, str]]:
    """Point every module-level name bound to ``old`` in the loaded modules under ``prefixes`` at
    ``new``; returns the (module, name) pairs changed, for the caller to restore."""
    changed = []
    for mod_name, module in list(sys.modules.items()):
        if module is None or mod_name.split(".")[0] not in prefixes:
            continue
        for name, value in list(vars(module).items()):
            if value is old:
                setattr(module, name, new)
                changed.append((module, name))
    return changed


@contextlib.contextmanager
def launched(
    argv: list[str], cwd: str, script_dir: str, env: dict[str, str], run: LaunchedRun
) -> Iterator[None]:
    """The launcher's world for the script, and the harness's ``deepspeed.initialize``; every
    change undone on exit, and the modules the script imported from its own folder dropped (the
    next trial may run a patched copy)."""
    import deepspeed

    if not _REAL:
        _REAL.update(
            initialize=deepspeed.initialize,
            init_process_group=dist.init_process_group,
            destroy_process_group=dist.destroy_process_group,
        )
    saved_env = {k: os.environ.get(k) for k in env}
    saved = (list(sys.argv), os.getcwd(), list(sys.path))
    before = set(sys.modules)
    os.environ.update(env)
    sys.argv = list(argv)
    sys.path.insert(0, script_dir)
    os.chdir(cwd)
    deepspeed.initialize = _harness_initialize
    rebound = rebind(REBIND_PREFIXES, _REAL["initialize"], _harness_initialize)
    dist.init_process_group = _init_process_group
    dist.destroy_process_group = _destroy_process_group
    _ACTIVE.append(run)
    try:
        yield
    finally:
        _ACTIVE.clear()
        deepspeed.initialize = _REAL["initialize"]
        for module, name in rebound:
            setattr(module, name, _REAL["initialize"])
        dist.init_process_group = _REAL["init_process_group"]
        dist.destroy_process_group = _REAL["destroy_process_group"]
        sys.argv, cwd0, sys.path[:] = saved[0], saved[1], saved[2]
        os.chdir(cwd0)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        root = str(Path(script_dir).resolve())
        for name in set(sys.modules) - before:
            f = getattr(sys.modules.get(name), "__file__", None)
            if f and str(Path(f).resolve()).startswith(root + os.sep):
                del sys.modules[name]


__all__ = ["REBIND_PREFIXES", "LaunchedRun", "launched", "rebind", "script_argv"]
