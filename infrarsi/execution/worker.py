"""``TrainWorker``: the Ray actor that is one rank of a trial group.

One actor per rank, placed in its own placement-group bundle (see ``group.py``). Its life:

1. ``__init__``: take the rank's exclusive CPU cores (``core_lease``: pinned to them, or unpinned
   and the reason recorded), set the environment (before torch is imported, so that
   ``OMP_NUM_THREADS`` and friends take effect) and the torch thread count. On cuda the rank's
   GPUs are the ones Ray assigned (its ``CUDA_VISIBLE_DEVICES``); an environment given for the
   trial cannot replace them.
2. ``info`` / ``free_port``: where it runs, so the group can rendezvous at rank 0's address.
3. ``init_process_group``: ``torch.distributed`` with gloo (CPU) or nccl (CUDA) and a timeout.
4. ``run(spec, entry)``: one trial, by calling the entry function (default
   ``infrarsi.execution.rank_loop:run_rank``). A warm pool calls it once per trial; the engine is
   rebuilt inside every call, the process and its process group are kept.
5. ``shutdown``: ``dist.destroy_process_group()`` before the process exits (without it one run
   aborted at exit with "terminate called without an active exception").

Why plain actors and not Ray Train's ``TorchTrainer``: plain actors in a placement group started
and initialised DeepSpeed in about 4 s here against about 17 s for ``TorchTrainer``, and they can
stay warm across trials, which a ``TorchTrainer.fit()`` cannot.
"""

from __future__ import annotations

import datetime
import importlib
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

DEFAULT_ENTRY = "infrarsi.execution.rank_loop:run_rank"
"""The function a worker calls for one trial: ``run_rank(spec: dict) -> dict`` (a RankResult)."""
SCRIPT_ENTRY = "infrarsi.execution.script_job:run_script_rank"
"""The function a worker calls for one trial of a workload's own script (``script:``)."""


def load_entry(entry: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Import ``module:function``."""
    module_name, _, func_name = entry.partition(":")
    if not module_name or not func_name:
        raise ValueError(f"entry {entry!r} must look like 'package.module:function'.")
    module = importlib.import_module(module_name)
    fn = getattr(module, func_name, None)
    if fn is None:
        raise ValueError(f"entry {entry!r}: module {module_name!r} has no attribute {func_name!r}.")
    return fn  # type: ignore[no-any-return]


def failed_rank_result(rank: int, status: str, error: str) -> dict[str, Any]:
    """A RankResult for a rank whose entry raised (or whose actor died)."""
    return {
        "rank": rank,
        "status": status,
        "error": error,
        "step_times_s": [],
        "warmup_steps": 0,
        "loss": [],
        "tokens_seen": [],
        "optimizer_steps": 0,
        "peak_memory_bytes": None,
        "memory_censored": status == "oom",
    }


class TrainWorker:
    """One rank of a trial group (wrapped with ``ray.remote`` by ``TrialGroup``)."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        device: str,
        env: dict[str, str],
        threads: int = 1,
        cores: int = 0,
    ) -> None:
        from infrarsi.execution.core_lease import CoreLease, acquire

        self.cores = acquire(cores) if cores > 0 else CoreLease(wanted=0, note="not requested")
        """This rank's CPU cores (``core_lease``); held until the process ends or ``shutdown``."""
        owned = (
            {"CUDA_VISIBLE_DEVICES"} if device == "cuda" else set()
        )  # Ray's GPU assignment owns it
        os.environ.update({k: str(v) for k, v in env.items() if k not in owned})
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        self.rank = rank
        """Global rank of this worker (also its bundle index)."""
        self.world_size = world_size
        """Number of ranks in the group."""
        self.device = device
        """``cpu`` or ``cuda``."""
        self.env = dict(env)
        """Environment the process was started with (a different one needs a fresh process)."""
        self._pg_ready = False
        import torch

        torch.set_num_threads(max(1, int(threads)))

    def info(self) -> dict[str, Any]:
        """Where this rank runs: node id, IP, host name, pid, visible GPUs."""
        import ray

        ctx = ray.get_runtime_context()
        return {
            "rank": self.rank,
            "node_id": ctx.get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "actor_id": ctx.get_actor_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            **self.cores.record(),
        }

    def free_port(self) -> int:
        """A TCP port that was free on this node a moment ago (for the rendezvous store)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return int(s.getsockname()[1])

    def init_process_group(
        self,
        master_addr: str,
        master_port: int,
        local_rank: int,
        local_world_size: int,
        timeout_s: float,
    ) -> float:
        """Join the group's ``torch.distributed`` process group; returns the seconds it took."""
        import torch
        import torch.distributed as dist

        t0 = time.perf_counter()
        os.environ.update(
            {
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
                "RANK": str(self.rank),
                "WORLD_SIZE": str(self.world_size),
                "LOCAL_RANK": str(local_rank),
                "LOCAL_WORLD_SIZE": str(local_world_size),
            }
        )
        backend = "nccl" if self.device == "cuda" else "gloo"
        kwargs: dict[str, Any] = {}
        if self.device == "cuda":
            torch.cuda.set_device(0)  # Ray sets CUDA_VISIBLE_DEVICES to this bundle's GPU(s)
            kwargs["device_id"] = torch.device("cuda", 0)
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
            **kwargs,
        )
        self._pg_ready = True
        import gc

        import deepspeed  # noqa: F401  (its first import takes seconds: paid here, once per worker, not in a trial's setup_time_s)

        gc.collect()
        gc.freeze()  # the imports are long-lived: a trial's garbage collection need not walk them

        return time.perf_counter() - t0

    def run(self, spec: dict[str, Any], entry: str = DEFAULT_ENTRY) -> dict[str, Any]:
        """Run one trial on this rank; never raises (an exception becomes a ``failed`` result).
        Shipped code (``code_package``, ``reference_code_package``: the driver's folders are on
        another node) is unpacked on this node first and imported from there."""
        try:
            spec = _local_code(spec)
            code_dir = spec.get("code_dir")
            if code_dir and code_dir not in sys.path:
                sys.path.insert(0, str(code_dir))
            fn = load_entry(entry)
            result = dict(fn(spec))
        except MemoryError as e:
            return failed_rank_result(self.rank, "oom", f"MemoryError: {e}")
        except Exception as e:
            status = "oom" if type(e).__name__ == "OutOfMemoryError" else "failed"
            return failed_rank_result(
                self.rank, status, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
            )
        result.setdefault("rank", self.rank)
        return result

    def probe_peak_flops(self) -> float:
        """Measured peak FLOP/s of this rank's device (``infrarsi.execution.flops``)."""
        from infrarsi.execution.flops import peak_flops_per_s

        return float(peak_flops_per_s(self.device))

    def shutdown(self) -> bool:
        """Destroy the process group (call before the actor is killed)."""
        if self._pg_ready:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self._pg_ready = False
        self.cores.release()
        return True


def _local_code(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with ``code_dir``/``reference_code_dir`` pointing at this node's unpacked copy of
    each shipped package (fetched from the object store only when not unpacked here yet)."""
    from infrarsi.execution.code_package import cache_root, materialize

    out = dict(spec)
    for package_key, dir_key in (
        ("code_package", "code_dir"),
        ("reference_code_package", "reference_code_dir"),
    ):
        pkg = spec.get(package_key)
        if not pkg:
            continue
        here = cache_root() / pkg["digest"]
        if not here.is_dir():
            import ray

            here = materialize(pkg["digest"], ray.get(pkg["ref"]))
        out[dir_key] = str(here)
    return out
