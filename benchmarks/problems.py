"""Benchmark problems for ``search_efficiency.py``: a space, a capacity, a baseline, a noisy
trial function and its noiseless truth (for the oracle).

- ``surrogate_1node`` / ``surrogate_2node``: the analytic surrogate of an ~8B dense model on
  8 / 16 H100-80GB (``workloads/surrogate_dense_*.yaml``), evaluated directly (no Ray). A trial
  is drawn with the same noise, stragglers and crashes as the ``surrogate`` backend; the truth is
  the noiseless model; the oracle is the best noiseless feasible config by enumeration.
- ``surrogate_2node_wide``: the 2-node problem over ``search_spaces/surrogate_gpu_wide.yaml``
  (36,936 configs, above the optimizer's exhaustive-scoring cap, so its sampled-candidate path
  runs).
- ``tabular_dense_debug``: real CPU trials of ``workloads/dense_debug.yaml`` measured once and
  stored in ``benchmarks/data/tabular_dense_debug.parquet`` (see ``make_tabular.py``); a trial
  returns one stored replicate; the truth is the median of the replicates.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.adversarial import DEPARTURES, adversarial_problem
from benchmarks.bench_problem import BenchProblem, Draw, TrialSource
from infrarsi.execution.surrogate.backend import problem_for
from infrarsi.execution.surrogate.model import evaluate
from infrarsi.search.space import SearchSpace
from infrarsi.units import parse_size
from infrarsi.workload import Workload
from infrarsi.workload_prior import prior_for_workload

ROOT = Path(__file__).resolve().parent.parent
TABULAR_PATH = ROOT / "benchmarks" / "data" / "tabular_dense_debug.parquet"


def surrogate_problem(
    workload_path: str | Path, name: str, space_path: str | Path | None = None
) -> BenchProblem:
    """The workload's analytic problem over its own search space, or over ``space_path``."""
    wl = Workload.from_yaml(workload_path)
    cap = parse_size(wl.memory_capacity or "80GB")
    prob = problem_for(wl, cap)
    space = SearchSpace.from_yaml(space_path or wl.search_space_path())
    rows = space.enumerate()
    if rows is None:
        raise ValueError(f"{space.file}: too large to enumerate for the oracle")
    truth = {}
    for cfg in rows:
        ev = evaluate(prob, cfg)
        truth[space.key(cfg)] = ev.step_time_s if ev.fits else math.inf
    baseline = space.validate(wl.baseline)
    return BenchProblem(
        name, space, float(cap), baseline, truth, prob, prior_for_workload(wl), prob.world_size
    )


def tabular_problem(path: Path = TABULAR_PATH) -> BenchProblem:
    import json

    import pyarrow.parquet as pq

    table = pq.read_table(path)
    meta = table.schema.metadata or {}
    space = SearchSpace.from_yaml(meta[b"search_space"].decode())
    cap = float(meta[b"memory_capacity_bytes"].decode())
    baseline = json.loads(meta[b"baseline"].decode())
    by_key: dict[str, list[dict[str, Any]]] = {}
    for r in table.to_pylist():
        cfg = space.validate(json.loads(r["config"]))
        by_key.setdefault(space.key(cfg), []).append(r)
    truth = {}
    for key, rs in by_key.items():
        ok = [r["step_time_s"] for r in rs if r["status"] == "ok"]
        truth[key] = (
            float(np.median(ok)) if ok and all(r["status"] != "oom" for r in rs) else math.inf
        )
    missing = [r for r in (space.enumerate() or []) if space.key(r) not in by_key]
    if missing:
        raise ValueError(
            f"{path}: the table must hold every config of its space; {len(missing)} missing, e.g. {missing[0]}"
        )
    wl = Workload.from_yaml(
        ROOT / "workloads" / "dense_debug.yaml"
    )  # the workload the table measured
    return BenchProblem(
        "tabular_dense_debug",
        space,
        cap,
        space.validate(baseline),
        truth,
        by_key,
        prior_for_workload(wl),
        wl.world_size,
    )


PROBLEMS = {
    "surrogate_1node": lambda: surrogate_problem(
        ROOT / "workloads" / "surrogate_dense_1node.yaml", "surrogate_1node"
    ),
    "surrogate_2node": lambda: surrogate_problem(
        ROOT / "workloads" / "surrogate_dense_2node.yaml", "surrogate_2node"
    ),
    "surrogate_2node_wide": lambda: surrogate_problem(
        ROOT / "workloads" / "surrogate_dense_2node.yaml",
        "surrogate_2node_wide",
        ROOT / "search_spaces" / "surrogate_gpu_wide.yaml",
    ),
    "tabular_dense_debug": tabular_problem,
    **{name: (lambda n=name: adversarial_problem(n)) for name in DEPARTURES},
}
"""Problem name -> builder (the adversarial surrogates of ``adversarial.py`` included)."""

__all__ = ["PROBLEMS", "ROOT", "TABULAR_PATH", "BenchProblem", "Draw", "TrialSource"]
