"""Reproduce a reference workload: one whole study (``tune_stage``), then one row of results.

    .venv/bin/python -m benchmarks.reproduce WORKLOAD [--out DIR] [--trials N] [--address ADDR] [--quick]

``WORKLOAD`` is a YAML path or a name of ``REFERENCE`` (``dense_1node``, ``moe_multinode_debug``,
...). The study runs init, doctor, run, verify and report into ``--out`` (default
``studies/reproduce/<name>-<UTC time>``) with the experience bank off (a reproduction must not
depend on earlier studies on this machine), then a row is appended to
``benchmarks/results/reproduce.md`` and ``reproduce.jsonl`` (``--results`` names another folder).

The row (``study_row``) is read from the study directory alone, through the report's own loader
(``infrarsi.report.data.load_study``): baseline and verified-best ``step_time_s``,
``tokens_per_s`` and MFU (medians of the rows verify measured them in, else the doctor's / run's,
named in ``*_source``), the speed-up and its bootstrap 95% CI exactly as ``verify.json`` holds them
(``best``: median of the paired baseline/candidate ratios), the trials, the device-hours (every
trial's ``device_seconds`` / 3600, doctor and verify included) and the failed-trial cost (the same
sum over the trials whose status is not ``ok``).

Hardware: a ``cuda`` workload's row names the GPU (the trials' ``device_name``), devices and nodes;
a CPU debug flavour's row says ``CPU (debug flavour)``. A multi-node workload needs a cluster:
``--address`` (or ``RAY_ADDRESS``) for GPUs; for a CPU debug flavour without one, a local
``ray.cluster_utils.Cluster`` with one raylet per node stands in (all on this machine).

``--quick``: 2 run trials, 2 doctor repeats, verify of the top candidate in 1 round of 2 pairs (a
smoke run; its row says so). Otherwise ``--trials`` (default 14) and the stages' defaults (3
doctor repeats, top 3 candidates, 3 pairs, 2 rounds).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shlex
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.machine import cpu_model, git_state  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
"""Where ``reproduce.md`` and ``reproduce.jsonl`` are written by default."""
CHECK_SAMPLE = 512
"""Random valid configs ``check_workload`` builds when a space is too large to list."""
DEFAULT_TRIALS = 14
"""Run trials of a full reproduction (the demo's budget)."""
FULL = {"doctor_repeats": 3, "top_k": 3, "pairs": 3, "rounds": 2}
"""Stage settings of a full reproduction (``tune_stage``'s defaults)."""
QUICK = {"trials": 2, "doctor_repeats": 2, "top_k": 1, "pairs": 2, "rounds": 1}
"""``--quick``: the smallest study every stage accepts."""


@dataclass(frozen=True)
class Reference:
    """One reference workload and its CPU debug flavour."""

    name: str
    """Workload name (``workloads/<name>.yaml``)."""
    what: str
    """The model and the job, in a few words."""
    gpus: str
    """The devices it is sized for."""
    debug: str
    """Its CPU debug flavour's name."""


REFERENCE: tuple[Reference, ...] = (
    Reference(
        "dense_1node",
        "Llama-3-8B (dense `8b`), seq 8192, 0.5M tokens/step, bf16",
        "8 x 80 GB, 1 node",
        "dense_1node_debug",
    ),
    Reference(
        "dense_multinode",
        "the same 8B job, 1M tokens/step (8 sequences per GPU)",
        "16 x 80 GB, 2 nodes",
        "dense_multinode_debug",
    ),
    Reference(
        "moe_1node",
        "Mixtral-8x7B shape cut to 6 layers (9.0B parameters, 8 experts, top-2), seq 8192, bf16",
        "8 x 80 GB, 1 node",
        "moe_1node_debug",
    ),
    Reference(
        "moe_multinode",
        "the same MoE with each expert split in two (16 experts, top-4) so expert "
        "parallelism spans both nodes",
        "16 x 80 GB, 2 nodes",
        "moe_multinode_debug",
    ),
)
"""The four reference workloads (``workloads/<name>.yaml``) and their debug flavours."""

MD_HEADER = """# Reference workloads: reproduction runs

One row per `python -m benchmarks.reproduce WORKLOAD` run (appended; raw rows with every field in
`reproduce.jsonl` beside this file). Each row is one whole study (init, doctor, run, verify,
report) of the workload on the hardware named. `step_time_s`, `tokens_per_s` and MFU are medians
over the trials that measured the baseline and the verified best (verify's trials when verify ran);
the speed-up is verify's: median of the paired `baseline_step_time_s / candidate_step_time_s`
ratios, bootstrap 95% CI, "not accepted" when no candidate cleared the doctor's noise margin.
Device-hours = devices x wall seconds of every trial (doctor and verify included) / 3600; failed =
the same over the trials that did not end `ok` (OOM, failed, timeout, nan, invariant violation).
A "CPU (debug flavour)" row ran the tiny CPU version of a reference workload: it shows that the
whole study runs, not how the GPU workload performs.

"""
MD_COLUMNS = (
    "date (UTC)", "workload", "hardware", "trials run / all", "baseline → best step_time_s",
    "baseline → best tokens_per_s", "baseline → best MFU", "speed-up (95% CI)",
    "device_hours (failed)", "study wall_s", "commit", "notes",
)  # fmt: skip
MD_HEADER += "| " + " | ".join(MD_COLUMNS) + " |\n" + "|---" * len(MD_COLUMNS) + "|\n"
"""Heading and column names of ``reproduce.md`` (written once, when the file is new)."""


def resolve_workload(arg: str) -> Path:
    """A YAML path as given, or ``workloads/<arg>.yaml`` for a bare name."""
    p = Path(arg)
    if p.suffix in (".yaml", ".yml"):
        return p
    return ROOT / "workloads" / f"{arg}.yaml"


def check_workload(path: str | Path) -> dict[str, Any]:
    """Everything about a workload that can go wrong before a trial, checked without a device:
    it loads; its search space loads and every knob has a handler; its entry point imports and
    its model builds on the meta device (``job_loader.preflight``); the baseline is a valid config
    of the space; the global batch divides over the ranks; every valid config of the space builds
    a DeepSpeed config (micro-batch sizes divide the per-rank batch; a space too large to list:
    the baseline, its one-knob moves and ``CHECK_SAMPLE`` seeded random configs), and where the
    space allows ``expert_parallel`` the experts divide over the ranks. Raises on the first problem; returns a
    summary (name, world size, nodes, global batch, parameters, configs checked)."""
    import numpy as np
    import torch

    from infrarsi.errors import WorkloadError
    from infrarsi.execution.job_loader import preflight
    from infrarsi.execution.knobs import check_handlers
    from infrarsi.execution.knobs.deepspeed import build_trial
    from infrarsi.search import SearchSpace
    from infrarsi.workload import Workload

    wl = Workload.from_yaml(path)
    space = SearchSpace.from_yaml(wl.search_space_path())
    check_handlers(space.names, source=str(wl.search_space_path()))
    job = preflight(wl)
    with torch.device("meta"):
        num_params = sum(p.numel() for p in job.build_model().parameters())
    space.validate(dict(wl.baseline), where=f"{path}: baseline")
    if wl.global_batch_size % wl.world_size:
        raise WorkloadError(
            f"{path}: {wl.global_batch_size} sequences per step do not divide over "
            f"{wl.world_size} ranks"
        )
    configs = space.enumerate()
    if configs is None:  # too many to list: the baseline, its one-knob moves and a seeded sample
        base = space.validate(dict(wl.baseline))
        sample = space.sample(np.random.default_rng(0), CHECK_SAMPLE)
        configs = list({space.key(c): c for c in [base, *space.neighbours(base), *sample]}.values())
    for cfg in configs:
        build_trial(wl, cfg, wl.world_size, num_params, job.shape.dim)
    allows_ep = "expert_parallel" in space.names and True in space.knob("expert_parallel").values
    if allows_ep and job.shape.num_experts % wl.world_size:
        raise WorkloadError(
            f"{path}: the space allows expert_parallel (ep_size = world size = {wl.world_size}) "
            f"but the model has {job.shape.num_experts} experts per layer"
        )
    return {
        "name": wl.name,
        "world_size": wl.world_size,
        "nodes": wl.resources.nodes,
        "device": wl.resources.device,
        "global_batch_size": wl.global_batch_size,
        "num_params": int(num_params),
        "configs": len(configs),
    }


def local_cluster_plan(
    nodes: int, workers: int, cpus_per_worker: float, device: str, address: str | None
) -> list[int] | None:
    """The logical CPUs of each raylet of the local ``ray.cluster_utils.Cluster`` a run needs,
    or None when it needs none (one node, or a cluster given by ``address``/``RAY_ADDRESS``).
    Each raylet gets its share of the ranks' CPUs plus one. A multi-node GPU workload without
    an address is an error: its nodes must be real."""
    if nodes <= 1 or address:
        return None
    if device == "cuda":
        raise SystemExit(
            f"a {nodes}-node GPU workload needs a Ray cluster of {nodes} GPU nodes: pass --address "
            "(or set RAY_ADDRESS) to its head"
        )
    per_node = math.ceil(workers / nodes)
    return [math.ceil(per_node * cpus_per_worker) + 1] * nodes


def start_local_cluster(cpus: list[int]) -> Any:
    """A ``ray.cluster_utils.Cluster`` of ``len(cpus)`` raylets on this machine, this process
    connected to it; returns the cluster (``shutdown_cluster`` stops it)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": cpus[0], "include_dashboard": False}
    )
    for n in cpus[1:]:
        cluster.add_node(num_cpus=n)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    return cluster


def shutdown_cluster(cluster: Any) -> None:
    import ray

    ray.shutdown()
    cluster.shutdown()


def study_row(study_dir: str | Path) -> dict[str, Any]:
    """The results row of a finished (or partly finished) study directory: see the module
    docstring. Figures absent from the study are None."""
    from infrarsi.report.data import load_study

    data = load_study(study_dir)
    trials = data.trials
    wl = data.contract.workload
    res = wl.get("resources", {})
    device = str(res.get("device", "cpu"))
    names = sorted(
        {str(r.hardware.get("device_name")) for r in trials if r.hardware.get("device_name")}
    )
    nodes = max((int(r.nodes) for r in trials if r.ok), default=int(res.get("nodes", 1)))
    devices = max((int(r.world_size) for r in trials if r.world_size), default=None)
    if devices is None:
        devices = int(res.get("workers", 1)) * int(res.get("devices_per_worker", 1))
    cpu = next((str(r.hardware["cpu"]) for r in trials if r.hardware.get("cpu")), "")
    if device == "cuda":
        hardware = f"{', '.join(names) or 'GPU (name not reported)'} x {devices}, {nodes} node{'s' * (nodes > 1)}"
    else:
        hardware = f"CPU (debug flavour): {devices} ranks on {nodes} node{'s' * (nodes > 1)}"
    verify_best = data.verify.best if data.verify is not None else None
    accepted = verify_best is not None and verify_best.accepted
    base, best = data.baseline, data.best
    not_ok = [r for r in trials if not r.ok]
    statuses: dict[str, int] = {}
    for r in trials:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    base_cfg = base.config if base is not None else {}
    best_cfg = best.config if best is not None else {}
    return {
        "workload": str(wl.get("name", "")),
        "device": device,
        "device_name": ", ".join(names) if names else None,
        "devices": devices,
        "nodes": nodes,
        "cpu": cpu,
        "hardware": hardware,
        "debug_flavour": device != "cuda",
        "simulated": data.simulated,
        "baseline_step_time_s": base.step_time_s if base else None,
        "best_step_time_s": best.step_time_s if best else None,
        "baseline_tokens_per_s": base.tokens_per_s if base else None,
        "best_tokens_per_s": best.tokens_per_s if best else None,
        "baseline_mfu": base.mfu if base else None,
        "best_mfu": best.mfu if best else None,
        "baseline_source": base.source if base else None,
        "best_source": best.source if best else None,
        "best_verified": accepted,
        "speedup": verify_best.speedup if verify_best is not None and accepted else None,
        "speedup_ci_low": verify_best.ci_low if verify_best is not None and accepted else None,
        "speedup_ci_high": verify_best.ci_high if verify_best is not None and accepted else None,
        "noise_margin": data.verify.noise_margin if data.verify is not None else None,
        "best_config_diff": {
            k: [base_cfg.get(k), v] for k, v in best_cfg.items() if base_cfg.get(k) != v
        },
        "trials_run": sum(1 for r in trials if r.stage == "run"),
        "trials_all": len(trials),
        "trial_statuses": statuses,
        "device_hours": sum(float(r.device_seconds) for r in trials) / 3600.0,
        "failed_device_hours": sum(float(r.device_seconds) for r in not_ok) / 3600.0,
        "study_dir": str(Path(study_dir)),
    }


def _num(x: Any, fmt: str) -> str:
    return "-" if x is None else format(float(x), fmt)


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100.0 * float(x):.3g}%"


def markdown_row(row: dict[str, Any]) -> str:
    """One line of ``reproduce.md``'s table."""
    if row.get("speedup") is not None:
        speed = (
            f"{row['speedup']:.2f}x ({_num(row.get('speedup_ci_low'), '.2f')}-"
            f"{_num(row.get('speedup_ci_high'), '.2f')}x)"
        )
    else:
        speed = "not accepted"
    cells = [
        str(row.get("date_utc", "")),
        f"`{row['workload']}`",
        row["hardware"],
        f"{row['trials_run']} / {row['trials_all']}",
        f"{_num(row['baseline_step_time_s'], '.3g')} → {_num(row['best_step_time_s'], '.3g')}",
        f"{_num(row['baseline_tokens_per_s'], '.4g')} → {_num(row['best_tokens_per_s'], '.4g')}",
        f"{_pct(row['baseline_mfu'])} → {_pct(row['best_mfu'])}",
        speed,
        f"{row['device_hours']:.3f} ({row['failed_device_hours']:.3f})",
        _num(row.get("wall_s"), ".0f"),
        f"`{row.get('commit', 'unknown')}`" + (" (dirty)" if row.get("dirty") else ""),
        str(row.get("notes", "")),
    ]
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


def append_row(row: dict[str, Any], results_dir: str | Path = RESULTS) -> tuple[Path, Path]:
    """Append ``row`` to ``reproduce.jsonl`` and ``reproduce.md`` in ``results_dir`` (the markdown
    heading is written when the file is new); returns both paths."""
    d = Path(results_dir)
    d.mkdir(parents=True, exist_ok=True)
    jl, md = d / "reproduce.jsonl", d / "reproduce.md"
    with jl.open("a") as f:
        f.write(json.dumps(row, sort_keys=True, default=str) + "\n")
    if not md.exists():
        md.write_text(MD_HEADER)
    with md.open("a") as f:
        f.write(markdown_row(row) + "\n")
    return jl, md


class LoadSampler:
    """The highest 1-minute load average seen, sampled every ``every_s`` seconds in a thread
    while the study runs (with the value before it started, it tells a shared machine)."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.start = os.getloadavg()[0]
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(every_s,), daemon=True)

    def _poll(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.peak = max(self.peak, os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, os.getloadavg()[0])


def row_notes(row: dict[str, Any], *, quick: bool, load_start: float, load_peak: float) -> str:
    """The row's notes: how it ran and on what machine (the CPU model, cores and load average
    say whether it was shared: the study's own ranks account for about one per rank)."""
    parts = []
    if row["debug_flavour"]:
        cpu = row.get("cpu_model") or row.get("cpu") or "unknown CPU"
        parts.append(
            f"ran on CPU ({cpu}, {row.get('cpu_count') or os.cpu_count()} cores), not a GPU figure"
        )
    if quick:
        parts.append("--quick (2 run trials, verify 1 round of 2 pairs)")
    parts.append(
        f"1-min load average {load_start:.1f} before, at most {load_peak:.1f} during "
        f"({row['devices']} of it the study's own ranks)"
    )
    if not row["best_verified"]:
        parts.append("no candidate accepted by verify: 'best' is the top candidate, unverified")
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument(
        "workload", help="a workload YAML, or a name of a reference workload (dense_1node_debug...)"
    )
    ap.add_argument(
        "--out", help="the study directory (default studies/reproduce/<name>-<UTC time>)"
    )
    ap.add_argument(
        "--trials",
        type=int,
        default=None,
        help=f"run trials (default {DEFAULT_TRIALS}; 2 with --quick)",
    )
    ap.add_argument(
        "--address",
        default=None,
        help="Ray address of the cluster (default RAY_ADDRESS, else local)",
    )
    ap.add_argument(
        "--quick", action="store_true", help="a smoke run: 2 trials, 2 doctor repeats, verify 1x2"
    )
    ap.add_argument(
        "--results", default=str(RESULTS), help="folder of reproduce.md / reproduce.jsonl"
    )
    ap.add_argument("--notes", default="", help="free text added to the row's notes")
    args = ap.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    from infrarsi.stages.tune import tune_stage
    from infrarsi.workload import Workload

    path = resolve_workload(args.workload)
    summary = check_workload(path)
    wl = Workload.from_yaml(path)
    settings = dict(QUICK) if args.quick else {"trials": DEFAULT_TRIALS, **FULL}
    if args.trials is not None:
        settings["trials"] = args.trials
    stamp = dt.datetime.now(dt.timezone.utc)
    out = (
        Path(args.out)
        if args.out
        else ROOT / "studies" / "reproduce" / f"{wl.name}-{stamp:%Y%m%d-%H%M%S}"
    )
    address = args.address or os.environ.get("RAY_ADDRESS") or None
    plan = local_cluster_plan(
        wl.resources.nodes,
        wl.resources.workers,
        wl.resources.cpus_per_worker,
        wl.resources.device,
        address,
    )
    print(
        f"reproduce: {summary} -> {out}; settings {settings}"
        + (f"; local cluster of {len(plan)} raylets, CPUs {plan}" if plan else ""),
        flush=True,
    )
    cluster = start_local_cluster(plan) if plan else None
    t0 = time.time()
    try:
        with LoadSampler() as load:
            tune_stage(
                path,
                out,
                trials=settings["trials"],
                address=cluster.address if cluster else address,
                doctor_repeats=settings["doctor_repeats"],
                top_k=settings["top_k"],
                pairs=settings["pairs"],
                rounds=settings["rounds"],
                progress=False,
                bank="off",
                request=f"reproduce the reference workload {wl.name}",
            )
    finally:
        if cluster is not None:
            shutdown_cluster(cluster)
    wall = time.time() - t0
    row = study_row(out)
    commit, dirty = git_state()
    row.update(
        {
            "date_utc": f"{stamp:%Y-%m-%d %H:%M}",
            "workload_file": str(path),
            "wall_s": wall,
            "quick": bool(args.quick),
            "trials_requested": settings["trials"],
            "settings": settings,
            "commit": commit,
            "dirty": dirty,
            "command": "python -m benchmarks.reproduce "
            + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
            "cpu_model": cpu_model(),
            "cpu_count": os.cpu_count(),
            "loadavg_1m_start": load.start,
            "loadavg_1m_peak": load.peak,
            "local_cluster_raylets": len(plan) if plan else None,
        }
    )
    notes = row_notes(row, quick=args.quick, load_start=load.start, load_peak=load.peak)
    row["notes"] = "; ".join(p for p in (notes, args.notes) if p)
    jl, md = append_row(row, args.results)
    print(markdown_row(row))
    print(f"reproduce: appended to {md} and {jl}", flush=True)
    return row


if __name__ == "__main__":
    main()
