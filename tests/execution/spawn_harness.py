"""Dev harness: run ``run_rank`` on N local processes with gloo (no Ray). For development and
for unit-level multi-rank checks; the must-show tests go through the Ray trial runner."""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(
    rank: int,
    world: int,
    port: int,
    specs: list[dict[str, Any]],
    out_dir: str,
    knob_modules: tuple[str, ...] = (),
) -> None:
    import datetime
    import importlib

    import torch
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
    )
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120)
    )
    from infrarsi.execution.rank_loop import run_rank

    for module in knob_modules:  # knobs registered outside the package, as a rank would import them
        importlib.import_module(module)

    results = [run_rank(s) for s in specs]
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def run_specs(
    specs: list[dict[str, Any]], world: int = 2, knob_modules: tuple[str, ...] = ()
) -> list[list[dict[str, Any]]]:
    """Run ``specs`` one after another in one process group (warm); returns per spec the list
    of rank results. Each rank first imports ``knob_modules`` (modules that register knobs)."""
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(
            _worker,
            args=(world, _free_port(), specs, d, tuple(knob_modules)),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        per_rank = [json.loads(Path(d, f"rank{r}.json").read_text()) for r in range(world)]
    return [[per_rank[r][i] for r in range(world)] for i in range(len(specs))]


def make_spec(
    workload: str | dict[str, Any],
    config: dict[str, Any],
    *,
    capacity: int | None = None,
    warmup: int = 1,
    measured: int = 3,
    trial_id: str = "t",
    **wl_over: Any,
) -> dict[str, Any]:
    from infrarsi.workload import Workload

    wl = (
        Workload.from_yaml(REPO / workload)
        if isinstance(workload, str)
        else Workload.from_dict(workload)
    )
    d = wl.to_yaml_dict()
    d["steps"] = {"warmup": warmup, "measured": measured}
    d.update(wl_over)
    return {
        "workload": d,
        "config": config,
        "trial_id": trial_id,
        "memory_capacity_bytes": capacity,
        "code_dir": str(REPO),
        "peak_flops_per_s": 2.5e10,
        "seed": 0,
    }


if (
    __name__ == "__main__"
):  # quick manual check: python tests/execution/spawn_harness.py '{"zero_stage": 2}'
    cfgs = [json.loads(a) for a in sys.argv[1:]] or [{}]
    for res in run_specs([make_spec("workloads/dense_debug.yaml", c) for c in cfgs]):
        for r in res:
            r.pop("ds_config")
            print(json.dumps(r)[:1500])
