"""``Optimizer.ask()`` latency against the number of observations (target: median <= 1 s with up
to 100 observations on 2 cores).

    .venv/bin/python -m benchmarks.ask_latency [--trials 100] [--seeds 2] \\
        [--problems surrogate_2node surrogate_2node_wide]

One process, one torch thread (the optimizer's default), nothing else should run. Per problem and
seed, one run of ``--trials`` ask/tell rounds on the benchmark problem (``benchmarks/problems.py``,
the same noisy trials as ``search_efficiency.py``); each ``ask()`` is timed with
``time.perf_counter`` and filed under the number of observations it was asked with. The process's
first ask is timed too (it pays torch/GPyTorch warm-up) and reported on its own. Results go to
``benchmarks/results/ask_latency.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.machine import cpu_model  # noqa: E402
from benchmarks.peers import Observation  # noqa: E402
from benchmarks.problems import PROBLEMS  # noqa: E402
from benchmarks.search_efficiency import InfrarsiPeer, search_core_sha  # noqa: E402

OUT = ROOT / "benchmarks" / "results"
WINDOWS = ((1, 25), (26, 50), (51, 75), (76, 100), (101, 10**9))
"""Observation-count windows the latencies are summarised over (inclusive)."""


def run(problem_name: str, seed: int, trials: int) -> list[tuple[int, float, str]]:
    """``(observations before the ask, ask seconds, phase)`` for each ask of one run."""
    problem = PROBLEMS[problem_name]()
    peer = InfrarsiPeer(problem, seed)
    out: list[tuple[int, float, str]] = []
    for i in range(trials):
        t0 = time.perf_counter()
        cfg = problem.space.validate(peer.ask())
        info = peer.last_ask_info
        out.append((i, time.perf_counter() - t0, str(None if info is None else info.phase)))
        d = problem.trial(cfg, seed, i)
        peer.tell(cfg, Observation(d.status, d.step_time_s, d.peak_memory_bytes))
    return out


def speed_probe_s(repeats: int = 5) -> float:
    """Median seconds of a fixed reference fit: the step-time GP (``fit_time_gp``, 40 L-BFGS
    iterations from the prior) on 80 seeded synthetic points with 14 features. Asks are mostly
    such fits, so latencies measured on two machines compare after dividing by this."""
    import torch

    from infrarsi.search.models.time_gp import fit_time_gp

    g = torch.Generator().manual_seed(0)
    X = torch.rand(80, 14, generator=g, dtype=torch.float64)
    y = (X[:, :4].sum(-1) + 0.05 * torch.randn(80, generator=g, dtype=torch.float64)).log1p()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fit_time_gp(X, y, maxiter=40)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def summarise(rows: Sequence[tuple[int, float, str]]) -> list[dict[str, Any]]:
    """Median / p90 / max ask seconds per observation window (the first ask left out)."""
    out = []
    for lo, hi in WINDOWS:
        xs = [s for n, s, _ in rows if lo <= n <= hi]
        if xs:
            out.append(
                {
                    "observations": f"{lo}-{hi}" if hi < 10**9 else f">={lo}",
                    "asks": len(xs),
                    "median_s": float(np.median(xs)),
                    "p90_s": float(np.quantile(xs, 0.9)),
                    "max_s": float(max(xs)),
                }
            )
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=100, help="ask/tell rounds per run")
    ap.add_argument("--seeds", type=int, default=2, help="runs per problem (seeds 0..N-1)")
    ap.add_argument(
        "--problems",
        nargs="*",
        default=["surrogate_2node", "surrogate_2node_wide"],
        help=f"of {list(PROBLEMS)}",
    )
    ap.add_argument("--out", type=Path, default=OUT, help="results directory")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    result: dict[str, Any] = {"problems": {}, "search_core_sha": search_core_sha()}
    first_ask_s = None
    for name in args.problems:
        rows: list[tuple[int, float, str]] = []
        for seed in range(args.seeds):
            r = run(name, seed, args.trials)
            if first_ask_s is None:
                first_ask_s = r[0][1]
            rows += r[1:] if seed == 0 and name == args.problems[0] else r
        result["problems"][name] = {
            "runs": args.seeds,
            "windows": summarise(rows),
            "configs": len(PROBLEMS[name]().truth),
        }
    result["first_ask_s"] = first_ask_s
    probe = speed_probe_s()  # after the runs: the first ask above pays the process's warm-up
    result["meta"] = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{cpu_model()} ({platform.machine()}), {os.cpu_count()} cores, Python {platform.python_version()}",
        "speed_probe_s": probe,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "trials": args.trials,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ask_latency.json").write_text(json.dumps(result, indent=2))
    lines = [
        "# ask() latency against the number of observations",
        "",
        f"Measured {result['meta']['measured_at']} on {result['meta']['machine']} (load average "
        f"{load_before:.1f} before, {result['meta']['load_after']:.1f} after), search core "
        f"`{result['search_core_sha']}`, by "
        f"`python -m benchmarks.ask_latency --trials {args.trials} --seeds {args.seeds}`.",
        "",
        "One process, one torch thread; each `ask()` timed with `time.perf_counter`, filed under the number of "
        "observations told before it. The process's first ask (torch/GPyTorch warm-up) is left out of the "
        f"windows: it took {first_ask_s:.2f} s. Target: median <= 1 s with up to 100 observations.",
        "",
        f"Machine speed probe (`speed_probe_s`: median of 5 reference step-time GP fits, 80 points, 14 "
        f"features, 40 L-BFGS iterations): {probe:.3f} s. Latencies from two machines compare after "
        "dividing by it.",
        "",
        "| problem | configs | observations | asks | median s | p90 s | max s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, p in result["problems"].items():
        for w in p["windows"]:
            lines.append(
                f"| {name} | {p['configs']} | {w['observations']} | {w['asks']} | {w['median_s']:.3f} | "
                f"{w['p90_s']:.3f} | {w['max_s']:.3f} |"
            )
    (args.out / "ask_latency.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return result


if __name__ == "__main__":
    main()
