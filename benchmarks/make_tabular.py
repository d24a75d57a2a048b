"""Measure the tabular benchmark: real CPU trials of ``workloads/dense_debug.yaml``.

Every config of a small factorial subset of ``search_spaces/deepspeed_dense.yaml`` (ZeRO stage
x micro-batch x activation checkpointing, fp32, other knobs at their defaults: 3 x 4 x 2 = 24
configs) is trained once for real with ``infrarsi.execution.runner.TrialRunner`` (2 gloo ranks,
DeepSpeed, warm worker pool, 1 warm-up + 2 measured steps) with no memory limit. The capacity
of the table is then set at a quantile of the measured peaks (``--capacity-quantile``), and a
config whose measured peak exceeds it is stored as ``oom`` (censored at the capacity), costing
its setup plus one step of device time: the engine's watchdog would have killed it at that
threshold. The result is ``benchmarks/data/tabular_dense_debug.parquet`` with the space, the
capacity and the baseline in its schema metadata.

Usage: ``python -m benchmarks.make_tabular [--quantile 0.7]`` (about 5-20 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "data" / "tabular_dense_debug.parquet"
SPACE = """\
name: tabular-dense-debug
objective: step_time
knobs:
  - name: zero_stage
    type: choice
    values: [0, 2, 3]
    memory: saver
  - name: micro_batch_size
    type: int
    values: [1, 2, 4, 8]
    memory: hungry
  - name: activation_checkpointing
    type: choice
    values: [none, full]
    memory: saver
"""
BASELINE = {"zero_stage": 3, "micro_batch_size": 1, "activation_checkpointing": "full"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quantile", type=float, default=0.7, help="capacity = this quantile of measured peaks"
    )
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    from infrarsi.execution.runner import TrialRunner
    from infrarsi.search.space import SearchSpace
    from infrarsi.workload import Workload

    space = SearchSpace.from_yaml(SPACE)
    wl = Workload.from_yaml(ROOT / "workloads" / "dense_debug.yaml")
    wl = wl.model_copy(update={"steps": wl.steps.model_copy(update={"warmup": 1, "measured": 2})})
    wl.path = str(ROOT / "workloads" / "dense_debug.yaml")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = []
    started = time.time()
    try:
        with TrialRunner(wl) as runner:
            for i, cfg in enumerate(space.enumerate() or []):
                full = {**cfg, "dtype": "fp32"}
                r = runner.run(full, trial_id=f"tab-{i:03d}", stage="trial")
                rows.append(
                    {
                        "config": json.dumps(cfg),
                        "status": r.status,
                        "step_time_s": r.step_time_s,
                        "peak_memory_bytes": r.peak_memory_bytes,
                        "device_seconds": r.device_seconds,
                        "setup_time_s": r.setup_time_s,
                        "memory_measure": r.memory_measure,
                        "error": r.error[:300],
                    }
                )
                print(i, cfg, r.status, r.step_time_s, r.peak_memory_bytes, flush=True)
    finally:
        ray.shutdown()
    peaks = [r["peak_memory_bytes"] for r in rows if r["status"] == "ok" and r["peak_memory_bytes"]]
    cap = float(np.quantile(peaks, args.quantile))
    for r in rows:
        if r["status"] == "ok" and r["peak_memory_bytes"] and r["peak_memory_bytes"] > cap:
            step = r["step_time_s"] or 0.0
            r.update(
                status="oom",
                step_time_s=None,
                peak_memory_bytes=int(cap),
                device_seconds=2 * ((r["setup_time_s"] or 0.0) + step),
            )
    meta = {
        "search_space": SPACE,
        "memory_capacity_bytes": str(int(cap)),
        "baseline": json.dumps(BASELINE),
        "workload": "workloads/dense_debug.yaml (warmup 1, measured 2, fp32)",
        "made": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "how": __doc__ or "",
        "wall_s": f"{time.time() - started:.0f}",
    }
    table = pa.Table.from_pylist(rows).replace_schema_metadata(meta)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, args.out)
    print(
        f"wrote {args.out}: {len(rows)} configs, capacity {cap / 2**20:.1f} MiB, "
        f"{sum(r['status'] == 'oom' for r in rows)} oom, {sum(r['status'] == 'failed' for r in rows)} failed"
    )


if __name__ == "__main__":
    main()
