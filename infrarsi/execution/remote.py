"""A ``TrialRunner`` as a named Ray actor, so that Ray Tune trainables share one warm pool.

Create it in the driver (which then owns it; it dies with the driver), before ``Tuner.fit()``::

    handle = get_or_create_remote_runner("study-runner", workload, memory_capacity_bytes=cap)

and in a trainable reach it by name and run a trial (the actor runs one trial at a time, so
trials never share the group's devices)::

    handle = get_or_create_remote_runner("study-runner")
    result = ray.get(handle.run.remote(config, trial_id=tid, stage="run"))   # a TrialResult

The actor takes ``num_cpus=0``: the trial group's placement group reserves the real resources.
"""

from __future__ import annotations

from typing import Any

from infrarsi.errors import TrialError
from infrarsi.execution.runner import TrialRunner
from infrarsi.result import TrialResult
from infrarsi.workload import Workload


class RemoteRunner:
    """Actor wrapper of ``TrialRunner`` (``num_cpus=0``): Tune trainables share its warm pool."""

    def __init__(self, workload: dict[str, Any], workload_path: str | None, kwargs: dict[str, Any]) -> None:
        wl = Workload.from_dict(workload, source=workload_path or "<workload>")
        self.runner = TrialRunner(wl, **kwargs)

    def run(self, config: dict[str, Any], **kwargs: Any) -> TrialResult:
        return self.runner.run(config, **kwargs)

    def close(self) -> None:
        self.runner.close()


def get_or_create_remote_runner(name: str, workload: Workload | None = None, **kwargs: Any) -> Any:
    """The named ``RemoteRunner`` actor, created on first call (call it in the driver first, so
    the driver owns it). Later calls, e.g. in a trainable, may pass only ``name``.
    ``kwargs`` are ``TrialRunner`` keyword arguments (memory_capacity_bytes, code_dir, ...)."""
    import ray

    try:
        return ray.get_actor(name)
    except ValueError:
        if workload is None:
            raise TrialError(f"no remote runner named {name!r} exists yet; create it with a workload first.") from None
    cls = ray.remote(num_cpus=0, max_restarts=0)(RemoteRunner)
    return cls.options(name=name, get_if_exists=True).remote(workload.to_yaml_dict(), workload.path, kwargs)
