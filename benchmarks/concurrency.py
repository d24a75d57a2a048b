"""Concurrent trials against one at a time: a discrete-event simulation of a cluster of ``--slots``
trial slots (issue 17, item 1's benchmark; target: at least 3x less simulated wall time to reach
the same best-found at 4 slots than at 1, and best-found/oracle no more than 1% worse at equal
trial counts).

No Ray: the optimizer (``infrarsi.search.Optimizer``, through ``search_efficiency.InfrarsiPeer``)
is driven by an event loop over simulated time. A slot holds the devices of one trial (one node
for ``surrogate_1node``, two for ``surrogate_2node``). Whenever a slot is free, the loop calls
``ask()`` (the trials still running are the optimizer's ``pending`` configs: asked, not told);
the trial is drawn from the problem (``benchmarks/problems.py``: the surrogate's noise, stragglers,
crashes and OOMs) and ends at its start plus its simulated wall time (``Draw.wall_s``: setup plus
steps; an OOM dies in its first step). Outcomes are told in completion order (ties: ask order).
The time ``ask()`` takes on this machine is not simulated time. One slot is the same loop.

Per (problem, seed): the 1-slot run asks ``--trials`` N trials. Its best-found (the noiseless
step time of ``Optimizer.best()``, as in ``search_efficiency.py``) after N tells is the target.
The K-slot run keeps its slots busy until N trials are told and the target is reached, or
``--max-factor`` x N trials are told. Measured:

- ``reach_sim_wall_s``: simulated seconds from the start until the first tell after which
  ``best()`` is a config whose noiseless step time is at most the target (the 1-slot run's own
  first such tell for the 1-slot run); ``time_ratio`` = 1-slot / K-slot, paired by seed;
- ``ratio_at_n``: best-found/oracle after N tells (equal completed-trial counts; the K-slot run
  then still has up to K-1 trials running), and at N/2;
- ``makespan_sim_wall_s``: simulated seconds until the N-th tell; ``device_s``: devices x seconds
  of the trials told by then; ``within_sim_wall_s``: until best-found/oracle <= 1 + ``--within``.

Usage::

    python -m benchmarks.concurrency                 # 2 problems x 8 seeds, N = 24, 4 slots
    python -m benchmarks.concurrency --quick         # smoke: surrogate_1node, 2 seeds, N = 8
    python -m benchmarks.concurrency --seeds 16 --trials 32 --problems surrogate_2node
    python -m benchmarks.concurrency --seeds 16 --workers 2 \\
        --problems surrogate_1node surrogate_2node tabular_dense_debug

Results: ``benchmarks/results/concurrency.json`` (summary and every run) and ``concurrency.md``.

Why one module: a benchmark is one command; its simulation, runs and summary belong together.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import json
import math
import platform
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.machine import cpu_model, git_state
from benchmarks.peers import Observation
from benchmarks.problems import PROBLEMS, BenchProblem
from benchmarks.search_efficiency import InfrarsiPeer, search_core_sha

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results"
PROBLEM_NAMES = ("surrogate_1node", "surrogate_2node")
"""Problems of the full run."""


@dataclass(frozen=True)
class TrialEvent:
    """One simulated trial of a run, from its ask to its tell."""

    index: int
    """Ask order, from 0 (also the draw's trial index)."""
    config: dict[str, Any]
    """The config asked."""
    status: str
    """ok | oom | failed."""
    start_sim_s: float
    """Simulated seconds from the run's start when the trial was asked and started."""
    end_sim_s: float
    """Simulated seconds from the run's start when it ended and was told."""
    device_s: float
    """Devices x simulated seconds the trial held them."""
    in_flight_at_ask: int
    """Trials running (asked, not told) when it was asked."""
    pending_keys_at_ask: tuple[str, ...]
    """``space.key`` of the optimizer's pending configs right before the ask."""
    phase: str | None
    """``AskInfo.phase`` of the ask (design, bo, bo-local, replicate, repair...)."""
    ask_s: float
    """Wall seconds ``ask()`` took on this machine (not simulated time)."""


@dataclass(frozen=True)
class Tell:
    """The state after one tell."""

    told: int
    """Trials told so far, this one included."""
    sim_wall_s: float
    """Simulated seconds from the run's start."""
    best_true_s: float
    """Noiseless step time (seconds) of ``best()`` after this tell (inf: nothing feasible yet)."""
    in_flight: int
    """Trials still running after this tell."""


def simulate(
    problem: BenchProblem,
    seed: int,
    slots: int,
    n_trials: int,
    *,
    target_true_s: float | None = None,
    max_trials: int | None = None,
    **options: Any,
) -> tuple[list[TrialEvent], list[Tell]]:
    """One event-driven run of infrarsi's optimizer on ``problem`` with ``slots`` trial slots.

    It asks until ``n_trials`` trials are told; with ``target_true_s``, it keeps asking after that
    until a tell brings ``best()`` to a noiseless step time <= ``target_true_s``, or
    ``max_trials`` (default ``n_trials``) trials are asked. Before the ``n_trials``-th tell the
    run does not depend on the target. ``options`` go to ``Optimizer``. Returns the trials in ask
    order and the state after each tell.
    """
    if slots < 1 or n_trials < 1:
        raise ValueError(
            f"simulate: rule: slots >= 1 and n_trials >= 1; got slots={slots}, n_trials={n_trials}"
        )
    cap = max(n_trials, max_trials or n_trials)
    peer = InfrarsiPeer(problem, seed, **options)
    running: list[
        tuple[float, int, dict[str, Any], Any, dict[str, Any]]
    ] = []  # (end, index, config, draw, ask fields)
    events: dict[int, TrialEvent] = {}
    tells: list[Tell] = []
    now, asked, reached = 0.0, 0, False

    def want_more() -> bool:
        told = len(tells)
        if asked >= cap:
            return False
        if target_true_s is None:
            return asked < n_trials
        return told < n_trials or not reached

    while True:
        while len(running) < slots and want_more():
            pending = tuple(sorted(peer.opt.pending))
            t0 = time.perf_counter()
            cfg = problem.space.validate(peer.ask())
            ask_s = time.perf_counter() - t0
            info = peer.last_ask_info
            draw = problem.trial(cfg, seed, asked)
            fields: dict[str, Any] = {
                "in_flight_at_ask": len(running),
                "pending_keys_at_ask": pending,
                "ask_s": ask_s,
                "phase": None if info is None else info.phase,
            }
            heapq.heappush(running, (now + draw.wall_s, asked, cfg, draw, fields))
            events[asked] = TrialEvent(
                asked, cfg, draw.status, now, now + draw.wall_s, draw.device_seconds, **fields
            )
            asked += 1
        if not running:
            break
        end, _i, cfg, draw, _f = heapq.heappop(running)
        now = end
        peer.tell(cfg, Observation(draw.status, draw.step_time_s, draw.peak_memory_bytes))
        best_true = problem.true_time(peer.best())
        tells.append(Tell(len(tells) + 1, now, best_true, len(running)))
        if target_true_s is not None and best_true <= target_true_s * (1 + 1e-12):
            reached = True
        if target_true_s is None and len(tells) >= n_trials:
            break
    return [events[i] for i in sorted(events)], tells


def first_reach_s(tells: Sequence[Tell], target_true_s: float) -> float | None:
    """Simulated seconds of the first tell with ``best_true_s <= target_true_s`` (None: never)."""
    for t in tells:
        if t.best_true_s <= target_true_s * (1 + 1e-12):
            return t.sim_wall_s
    return None


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _at(tells: Sequence[Tell], told: int) -> Tell:
    return tells[min(told, len(tells)) - 1]


@functools.cache
def _problem(name: str) -> BenchProblem:
    return PROBLEMS[name]()


def run_pair(
    problem_name: str, seed: int, n_trials: int, slots: int, max_factor: float, within: float
) -> dict[str, Any]:
    """The 1-slot run and the ``slots``-slot run of one (problem, seed), and their measures."""
    import torch

    torch.set_num_threads(1)
    problem = _problem(problem_name)
    started = time.time()
    ev1, t1 = simulate(problem, seed, 1, n_trials)
    target = t1[n_trials - 1].best_true_s
    evk, tk = simulate(
        problem,
        seed,
        slots,
        n_trials,
        target_true_s=target if math.isfinite(target) else None,
        max_trials=math.ceil(max_factor * n_trials),
    )
    oracle = problem.oracle_time

    def measures(events: list[TrialEvent], tells: list[Tell]) -> dict[str, Any]:
        at_n, at_half = _at(tells, n_trials), _at(tells, max(1, n_trials // 2))
        told = {e.index for e in events if e.end_sim_s <= at_n.sim_wall_s}
        return {
            "ratio_at_n": _finite(at_n.best_true_s / oracle),
            "ratio_at_half_n": _finite(at_half.best_true_s / oracle),
            "makespan_sim_wall_s": at_n.sim_wall_s,
            "device_s": sum(e.device_s for e in events if e.index in told),
            "reach_sim_wall_s": _finite(first_reach_s(tells, target))
            if math.isfinite(target)
            else None,
            "within_sim_wall_s": first_reach_s(tells, oracle * (1 + within)),
            "trials_asked": len(events),
            "trials_told": len(tells),
            "max_in_flight": max(e.in_flight_at_ask for e in events) + 1,
            "oom_or_failed": sum(e.status != "ok" for e in events if e.index in told),
            "ask_s_median": float(np.median([e.ask_s for e in events])),
            "phases": {
                p: sum(e.phase == p for e in events) for p in sorted({str(e.phase) for e in events})
            },
            "trials": [
                {
                    "index": e.index,
                    "status": e.status,
                    "start_sim_s": e.start_sim_s,
                    "end_sim_s": e.end_sim_s,
                    "phase": e.phase,
                    "in_flight_at_ask": e.in_flight_at_ask,
                    "true_time_s": _finite(problem.true_time(e.config)),
                    "config": e.config,
                }
                for e in events
            ],
            "best_true_s_by_tell": [_finite(t.best_true_s) for t in tells],
        }

    m1, mk = measures(ev1, t1), measures(evk, tk)
    r1, rk = m1["reach_sim_wall_s"], mk["reach_sim_wall_s"]
    return {
        "problem": problem_name,
        "seed": seed,
        "n_trials": n_trials,
        "slots": slots,
        "oracle_time_s": oracle,
        "target_true_s": _finite(target),
        "c1": m1,
        f"c{slots}": mk,
        "time_ratio": None if r1 is None or rk is None or rk <= 0 else r1 / rk,
        "makespan_ratio": m1["makespan_sim_wall_s"] / mk["makespan_sim_wall_s"],
        "quality_ratio": None
        if m1["ratio_at_n"] is None or mk["ratio_at_n"] is None
        else mk["ratio_at_n"] / m1["ratio_at_n"],
        "wall_s": time.time() - started,
        "search_core_sha": search_core_sha(),
    }


def _q(values: Sequence[float | None], q: float) -> float | None:
    """The ``q`` quantile (linear interpolation), None (never, nothing feasible) counted as +inf:
    a quantile that interpolates towards one is inf."""
    xs = sorted(math.inf if v is None else float(v) for v in values)
    if not xs:
        return None
    pos = q * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    if hi == lo or pos == lo:
        return xs[lo]
    if not math.isfinite(xs[hi]):
        return math.inf
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarise(runs: list[dict[str, Any]], slots: int) -> dict[str, Any]:
    """Per problem: medians and spread over seeds of each measure, for 1 slot and ``slots``."""
    ck = f"c{slots}"
    out: dict[str, Any] = {}
    for prob in sorted({r["problem"] for r in runs}):
        rs = [r for r in runs if r["problem"] == prob]
        row: dict[str, Any] = {"seeds": len(rs), "n_trials": rs[0]["n_trials"]}
        for c in ("c1", ck):
            ms = [r[c] for r in rs]
            row[c] = {
                f"{k}_{stat}": _q([m[k] for m in ms], q)
                for k in (
                    "ratio_at_n",
                    "ratio_at_half_n",
                    "makespan_sim_wall_s",
                    "device_s",
                    "reach_sim_wall_s",
                    "within_sim_wall_s",
                )
                for stat, q in (("median", 0.5), ("q25", 0.25), ("q75", 0.75))
            }
            row[c]["ratio_at_n_mean"] = float(
                np.mean([m["ratio_at_n"] if m["ratio_at_n"] is not None else math.inf for m in ms])
            )
            row[c]["ratio_at_n_max"] = _q([m["ratio_at_n"] for m in ms], 1.0)
            row[c]["within_reached"] = sum(m["within_sim_wall_s"] is not None for m in ms)
            row[c]["reached"] = sum(m["reach_sim_wall_s"] is not None for m in ms)
            row[c]["oom_or_failed_mean"] = float(np.mean([m["oom_or_failed"] for m in ms]))
            row[c]["trials_told_median"] = _q([m["trials_told"] for m in ms], 0.5)
            row[c]["max_in_flight"] = max(m["max_in_flight"] for m in ms)
        tr = [r["time_ratio"] for r in rs]
        row["time_ratio"] = {
            "median": _q([0.0 if x is None else x for x in tr], 0.5),
            "q25": _q([0.0 if x is None else x for x in tr], 0.25),
            "q75": _q([0.0 if x is None else x for x in tr], 0.75),
            "min": _q([0.0 if x is None else x for x in tr], 0.0),
            "censored": tr.count(None),
        }
        w1 = [r["c1"]["within_sim_wall_s"] for r in rs]
        wk = [r[ck]["within_sim_wall_s"] for r in rs]
        both = [
            a / b for a, b in zip(w1, wk, strict=True) if a is not None and b is not None and b > 0
        ]
        row["within_time_ratio"] = {
            "median": _q(both, 0.5),
            "q25": _q(both, 0.25),
            "q75": _q(both, 0.75),
            "both_reached": len(both),
            "only_c1": sum(a is not None and b is None for a, b in zip(w1, wk, strict=True)),
            f"only_{ck}": sum(a is None and b is not None for a, b in zip(w1, wk, strict=True)),
        }
        mr = [r["makespan_ratio"] for r in rs]
        row["makespan_ratio"] = {"median": _q(mr, 0.5), "q25": _q(mr, 0.25), "q75": _q(mr, 0.75)}
        qr = [r["quality_ratio"] for r in rs]
        row["quality_ratio"] = {
            "median": _q(qr, 0.5),
            "q25": _q(qr, 0.25),
            "q75": _q(qr, 0.75),
            "max": _q(qr, 1.0),
            "worse_seeds": sum(x is None or x > 1 + 1e-12 for x in qr),
        }
        m1, mk = row["c1"]["ratio_at_n_median"], row[ck]["ratio_at_n_median"]
        row["median_quality_ratio"] = None if m1 is None or mk is None else mk / m1
        row["mean_quality_ratio"] = row[ck]["ratio_at_n_mean"] / row["c1"]["ratio_at_n_mean"]
        out[prob] = row
    return out


def _json_safe(x: Any) -> Any:
    """``x`` with every non-finite float as None (strict JSON; None reads "never" or "nothing feasible")."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "never" if x is None or not math.isfinite(x) else format(x, fmt)


def to_markdown(result: dict[str, Any]) -> str:
    meta, summary = result["meta"], result["summary"]
    k = meta["slots"]
    ck = f"c{k}"
    lines = [
        "# Concurrent trials: simulated cluster",
        "",
        f"Generated {meta['generated']} by `{meta['command']}` at commit `{meta['commit']}`"
        f"{' (with uncommitted changes)' if meta['dirty'] else ''}, `infrarsi/search` sha256 prefix "
        f"{', '.join(meta['search_core_sha'])}, on {meta['machine']}. Simulated time does not depend on the machine."
        + (
            f" Summary rebuilt from the saved runs (`--summarise-only`) {meta['summarised']}."
            if meta.get("summarised")
            else ""
        ),
        "",
        "## What is measured, and how",
        "",
        meta["how"],
        "",
        "## Results",
        "",
        f"Medians over seeds, [25%, 75%] in brackets. c1: one slot; {ck}: {k} slots. N = trials told.",
        "",
        f"| problem | seeds | N | time to the c1 best-found, c1 / {ck} (min; censored) | makespan@N c1 / {ck} "
        f"| best-found/oracle@N c1 | @N {ck} | {ck}/c1 of the medians (of the means) | seeds {ck} worse@N "
        f"| @N/2 c1 / {ck} |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for prob, row in summary.items():
        c1, cx, tr, mr = row["c1"], row[ck], row["time_ratio"], row["makespan_ratio"]
        lines.append(
            f"| {prob} | {row['seeds']} | {row['n_trials']} | **{_f(tr['median'], '.2f')}x** [{_f(tr['q25'], '.2f')}, "
            f"{_f(tr['q75'], '.2f')}] (min {_f(tr['min'], '.2f')}; {tr['censored']}) | {_f(mr['median'], '.2f')}x "
            f"| {_f(c1['ratio_at_n_median'])} [{_f(c1['ratio_at_n_q25'])}, {_f(c1['ratio_at_n_q75'])}] "
            f"| {_f(cx['ratio_at_n_median'])} [{_f(cx['ratio_at_n_q25'])}, {_f(cx['ratio_at_n_q75'])}] "
            f"| **{_f(row['median_quality_ratio'], '.4f')}** ({_f(row['mean_quality_ratio'], '.4f')}) "
            f"| {row['quality_ratio']['worse_seeds']}/{row['seeds']} (worst {_f(row['quality_ratio']['max'], '.3f')}) "
            f"| {_f(c1['ratio_at_half_n_median'])} / {_f(cx['ratio_at_half_n_median'])} |"
        )
    lines += [
        "",
        "Simulated seconds (medians [25%, 75%]):",
        "",
        f"| problem | slots | reach the c1 best-found (reached) | makespan@N "
        f"| within {meta['within']:.0%} of the oracle (reached) | device-s@N | OOM+failed@N (mean) "
        "| trials told (median) | most in flight |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for prob, row in summary.items():
        for c, name in (("c1", 1), (ck, k)):
            m = row[c]
            lines.append(
                f"| {prob} | {name} | {_f(m['reach_sim_wall_s_median'], '.0f')} "
                f"[{_f(m['reach_sim_wall_s_q25'], '.0f')}, "
                f"{_f(m['reach_sim_wall_s_q75'], '.0f')}] ({m['reached']}/{row['seeds']}) "
                f"| {_f(m['makespan_sim_wall_s_median'], '.0f')} | {_f(m['within_sim_wall_s_median'], '.0f')} "
                f"({m['within_reached']}/{row['seeds']}) | {_f(m['device_s_median'], '.0f')} "
                f"| {m['oom_or_failed_mean']:.1f} | {_f(m['trials_told_median'], '.0f')} | {m['max_in_flight']} |"
            )
    lines += [
        "",
        f"Time to within {meta['within']:.0%} of the oracle, c1 / {ck}, paired by seed over the seeds where "
        "both runs got there (medians [25%, 75%]):",
        "",
    ]
    for prob, row in summary.items():
        w = row["within_time_ratio"]
        lines.append(
            f"- {prob}: {_f(w['median'], '.2f')}x [{_f(w['q25'], '.2f')}, {_f(w['q75'], '.2f')}] over "
            f"{w['both_reached']}/{row['seeds']} seeds (only c1 got there: {w['only_c1']}; only {ck}: "
            f"{w[f'only_{ck}']})"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: surrogate_1node, 2 seeds, 8 trials"
    )
    ap.add_argument(
        "--problems",
        nargs="*",
        default=None,
        help=f"subset of {list(PROBLEMS)} (default {list(PROBLEM_NAMES)})",
    )
    ap.add_argument(
        "--seeds", type=int, default=8, help="seeds 0..N-1 per problem (>= 8 for the report)"
    )
    ap.add_argument(
        "--trials", type=int, default=24, help="N: trials told at which both runs are compared"
    )
    ap.add_argument(
        "--slots", type=int, default=4, help="trial slots of the simulated cluster (one trial each)"
    )
    ap.add_argument(
        "--max-factor",
        type=float,
        default=2.0,
        help="the multi-slot run stops at this many times N trials if it has not reached the target",
    )
    ap.add_argument(
        "--within",
        type=float,
        default=0.02,
        help="within_sim_wall_s: best-found/oracle <= 1 + this",
    )
    ap.add_argument("--workers", type=int, default=1, help="parallel processes (one thread each)")
    ap.add_argument("--out", type=Path, default=OUT, help="results directory")
    ap.add_argument(
        "--summarise-only",
        action="store_true",
        help="rebuild the summary and .md from the runs in <out>/concurrency.json (no new runs)",
    )
    args = ap.parse_args(argv)
    if args.summarise_only:
        return _resummarise(args.out)
    if args.quick:
        problems, seeds, n = (
            args.problems or ["surrogate_1node"],
            min(args.seeds, 2),
            min(args.trials, 8),
        )
    else:
        problems, seeds, n = args.problems or list(PROBLEM_NAMES), args.seeds, args.trials
    unknown = [p for p in problems if p not in PROBLEMS]
    if unknown:
        raise SystemExit(f"unknown problem(s) {unknown}; known: {list(PROBLEMS)}")
    commit, dirty = (
        git_state()
    )  # the code that runs (read before the runs: a commit during them does not count)
    jobs = [
        (p, s, n, args.slots, args.max_factor, args.within) for p in problems for s in range(seeds)
    ]
    runs = []

    def show(r: dict[str, Any]) -> None:
        print(
            f"{r['problem']} seed {r['seed']}: time c1/c{args.slots} {_f(r['time_ratio'], '.2f')}, best/oracle@{n} "
            f"c1 {_f(r['c1']['ratio_at_n'])} c{args.slots} {_f(r[f'c{args.slots}']['ratio_at_n'])} "
            f"({r['wall_s']:.0f} s)",
            flush=True,
        )

    if args.workers <= 1:
        for job in jobs:
            runs.append(run_pair(*job))
            show(runs[-1])
    else:  # each (problem, seed) is deterministic: the same runs as one process, in the same order
        with ProcessPoolExecutor(args.workers) as ex:
            for r in ex.map(run_pair, *zip(*jobs, strict=True)):
                runs.append(r)
                show(r)
    cmd = " ".join(["python -m benchmarks.concurrency", *(sys.argv[1:] if argv is None else argv)])
    meta = {
        "generated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": cmd.strip(),
        "commit": commit,
        "dirty": dirty,
        "search_core_sha": sorted({r["search_core_sha"] for r in runs}),
        "machine": f"{cpu_model()}, {platform.machine()}, Python {platform.python_version()}",
        "problems": problems,
        "seeds": seeds,
        "n_trials": n,
        "slots": args.slots,
        "max_factor": args.max_factor,
        "within": args.within,
        "how": (
            f"A discrete-event simulation, no Ray. A cluster of {args.slots} trial slots (one slot holds one trial's "
            "devices: 1 node of 8 simulated H100s on surrogate_1node, 2 nodes on surrogate_2node); whenever a slot is "
            "free the loop calls infrarsi's `Optimizer.ask()` (the running trials are its pending configs), draws the "
            "trial from the surrogate (noise CV 4%, stragglers 4%, crashes 1.5%, OOMs; `benchmarks/problems.py`) and "
            "ends it at its start plus its simulated wall time (setup + steps; an OOM dies in its first step); "
            "outcomes are told in completion order. `ask()` latency on this machine is not added to simulated time. "
            f"Per seed the 1-slot run asks N = {n} trials; its target is the noiseless step time of its `best()` after "
            f"N tells. The {args.slots}-slot run keeps its slots busy until N tells and the target is reached (or "
            f"{args.max_factor:g} x N trials). **Time to the c1 best-found**: simulated seconds until the first tell "
            "after which `best()` has a noiseless step time <= the target (each run; a run that never gets there is "
            "censored: counted as ratio 0 in the quantiles); the ratio is paired by seed. **best-found/oracle@N**: "
            "the noiseless step time of `best()` after N tells (the multi-slot run then has up to slots-1 trials "
            "still running) over the best feasible config by enumeration. **makespan@N**: simulated seconds until "
            "the N-th tell. **device-s**: devices x simulated seconds of the trials told by then. "
            f"**within {args.within:.0%}**: simulated seconds until best-found/oracle <= {1 + args.within:g}."
        ),
    }
    result = _json_safe({"meta": meta, "summary": summarise(runs, args.slots), "runs": runs})
    _write(result, args.out)
    return result


def _resummarise(out: Path) -> dict[str, Any]:
    """The summary and .md of the runs saved in ``out``, rebuilt by this version of ``summarise``."""
    result = json.loads((out / "concurrency.json").read_text())
    commit, dirty = git_state()
    result["meta"]["summarised"] = (
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} at commit {commit}"
        f"{' (with uncommitted changes)' if dirty else ''}"
    )
    result["summary"] = _json_safe(summarise(result["runs"], result["meta"]["slots"]))
    _write(result, out)
    return result


def _write(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    # meta and summary readable; each run's event trace on one line
    runs = ",\n".join(json.dumps(r, allow_nan=False, separators=(",", ":")) for r in result["runs"])
    head = json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1, allow_nan=False)
    (out / "concurrency.json").write_text(head[:-2] + ',\n "runs": [\n' + runs + "\n]}\n")
    md = to_markdown(result)
    md_path = out / "concurrency.md"
    old = md_path.read_text() if md_path.exists() else ""
    notes = old[old.index("\n## Notes") :] if "\n## Notes" in old else ""  # hand-written: kept
    md_path.write_text(md.rstrip("\n") + "\n" + notes)
    print(md)


if __name__ == "__main__":
    main()
