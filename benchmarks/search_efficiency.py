"""Search efficiency of infrarsi against its peers, side by side on the same problems, budgets
and seeds.

Searchers: infrarsi, infrarsi with censoring off (OOMs dropped), infrarsi with pairing off,
infrarsi with the analytic prior off, infrarsi without intensification (an incumbent measured
once is not re-run), random, grid, a DeepSpeed-autotuner-style ramp, Ax (Sobol -> BoTorch Modular, OOM failed) and
Optuna TPE with constraints. Problems: see ``benchmarks/problems.py``.

Per (problem, searcher, seed) one run of ``max(budgets)`` trials. Reported per searcher:
- best-found/oracle at each budget: the noiseless step time of the config the searcher would
  recommend after that many trials (infrarsi: ``Optimizer.best()``; peers: the lowest measured
  time), over the oracle (best noiseless feasible config, by enumeration); median and IQR over
  seeds; a searcher with nothing feasible yet scores inf;
- wasted device-time fraction: device-seconds of oom + failed trials over all device-seconds
  of the run up to that budget (setup time included: an OOM costs its setup plus part of a
  step), median over seeds;
- ``ask()`` latency: wall seconds per ask on this machine, median and p90 over all asks.

Usage::

    python -m benchmarks.search_efficiency                      # full: 3 problems x 8 searchers x 8 seeds
    python -m benchmarks.search_efficiency --quick              # smoke: peers, 2 seeds, budget 12
    python -m benchmarks.search_efficiency --searchers infrarsi random --seeds 8 --workers 2

Raw runs are appended to ``<out>/search_efficiency_runs.<tag>.jsonl`` (a rerun skips runs
finished in any of them, so several invocations can run at once with different tags), then
summarised into ``<out>/search_efficiency.json`` and ``.md`` (a hand-written ``## Notes`` section at
the end of the ``.md`` is kept).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import platform
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks.peers import PEERS, Observation
from benchmarks.problems import PROBLEMS, TABULAR_PATH, BenchProblem

if TYPE_CHECKING:  # the search core is imported on first use (``search_core_sha``)
    from infrarsi.search import AskInfo

OUT = Path(__file__).resolve().parent / "results"
BUDGETS = (12, 24, 48)
INFRARSI: dict[str, dict[str, Any]] = {
    "infrarsi": {},
    "infrarsi_no_censoring": {"settings": {"censoring": False}},
    "infrarsi_no_pairing": {"settings": {"pairing": False}},
    "infrarsi_no_prior": {"prior": None},
    "infrarsi_no_intensify": {"settings": {"intensify": False}},
}
"""infrarsi's arms: ``Optimizer`` keyword arguments (``settings``: ``OptimizerSettings`` fields)."""
SEARCHERS = (*INFRARSI, "random", "grid", "ramp", "ax", "optuna_tpe")
QUICK_SEARCHERS = ("random", "grid", "ramp")


class InfrarsiPeer:
    """infrarsi's ``Optimizer`` behind the benchmark's ask/tell surface."""

    def __init__(self, problem: BenchProblem, seed: int, **options: Any) -> None:
        from infrarsi.search import Optimizer

        options = {"prior": problem.prior, **options}
        self.opt = Optimizer(
            problem.space,
            memory_capacity=problem.capacity,
            seed=seed,
            baseline=problem.baseline,
            **options,
        )

    def ask(self) -> dict[str, Any]:
        return dict(self.opt.ask())

    def tell(self, config: dict[str, Any], obs: Observation) -> None:
        from infrarsi.search import Outcome

        self.opt.tell(
            config,
            Outcome(
                status=obs.status,
                step_time=obs.step_time_s,
                peak_memory=obs.peak_memory_bytes or None,
            ),
        )

    def best(self) -> dict[str, Any] | None:
        return self.opt.best()

    @property
    def last_ask_info(self) -> AskInfo | None:
        """Why the last single ``ask`` asked its config."""
        from infrarsi.search import AskInfo

        info = self.opt.last_ask_info
        return info if isinstance(info, AskInfo) else None


def make_searcher(name: str, problem: BenchProblem, seed: int) -> Any:
    if name in INFRARSI:
        from infrarsi.search import OptimizerSettings

        options = dict(INFRARSI[name])
        if "settings" in options:
            options["settings"] = OptimizerSettings.from_dict(options["settings"])
        return InfrarsiPeer(problem, seed, **options)
    if name not in PEERS:
        raise SystemExit(f"unknown searcher {name!r}; known: {list(SEARCHERS)}")
    return PEERS[name](problem.space, problem.capacity, seed, problem.baseline)


@functools.cache
def _problem(name: str) -> BenchProblem:
    return PROBLEMS[name]()


def run_one(problem_name: str, searcher: str, seed: int, budgets: Sequence[int]) -> dict[str, Any]:
    """One run: ``max(budgets)`` trials of ``searcher`` on ``problem_name`` with ``seed``."""
    import torch

    torch.set_num_threads(1)
    problem = _problem(problem_name)
    started = time.time()
    sha = search_core_sha()  # the sources as this process imported them
    s = make_searcher(searcher, problem, seed)
    trials: list[dict[str, Any]] = []
    at_budget: dict[str, Any] = {}
    for i in range(max(budgets)):
        t0 = time.perf_counter()
        cfg = s.ask()
        ask_s = time.perf_counter() - t0
        cfg = problem.space.validate(cfg)
        d = problem.trial(cfg, seed, i)
        s.tell(cfg, Observation(d.status, d.step_time_s, d.peak_memory_bytes))
        info = s.last_ask_info if isinstance(s, InfrarsiPeer) else None
        trials.append(
            {
                "status": d.status,
                "device_s": d.device_seconds,
                "ask_s": ask_s,
                "true_time_s": _finite(problem.true_time(cfg)),
                "measured_s": d.step_time_s,
                "config": cfg,
                "phase": None if info is None else info.phase,
                "p_fit": None if info is None else info.p_fit,
                "repair": info is not None and info.repair_of is not None,
            }
        )
        if i + 1 in budgets:
            best = s.best()
            tt = problem.true_time(best)
            wasted = sum(t["device_s"] for t in trials if t["status"] != "ok")
            at_budget[str(i + 1)] = {
                "ratio": _finite(tt / problem.oracle_time),
                "best": best,
                "wasted_fraction": wasted / max(1e-9, sum(t["device_s"] for t in trials)),
                "ooms": sum(t["status"] == "oom" for t in trials),
                "failed": sum(t["status"] == "failed" for t in trials),
            }
    return {
        "problem": problem_name,
        "searcher": searcher,
        "seed": seed,
        "budgets": list(budgets),
        "oracle_time_s": problem.oracle_time,
        "at_budget": at_budget,
        "trials": trials,
        "wall_s": time.time() - started,
        "retries": getattr(s, "retries", 0),
        "search_core_sha": sha,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


@functools.cache
def search_core_sha() -> str:
    """sha256 (first 12 hex) of the ``infrarsi/search`` sources, read once per process right
    before the process first imports them (so it names the code the runs used)."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent / "infrarsi" / "search"
    for path in sorted(root.rglob("*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def _finite(x: float) -> float | None:
    return None if not math.isfinite(x) else float(x)


def _q(values: list[float], q: float) -> float:
    return float(np.quantile(np.array(values, dtype=float), q))


def summarise(runs: list[dict[str, Any]], budgets: Sequence[int]) -> dict[str, Any]:
    """Aggregate raw runs: per problem, per searcher, per budget."""
    out: dict[str, Any] = {}
    for r in runs:
        out.setdefault(r["problem"], {}).setdefault(r["searcher"], []).append(r)
    summary: dict[str, Any] = {}
    for prob, by_s in out.items():
        summary[prob] = {}
        for name, rs in by_s.items():
            row: dict[str, Any] = {"seeds": len(rs), "budgets": {}}
            for b in budgets:
                got = [r["at_budget"].get(str(b)) for r in rs if str(b) in r["at_budget"]]
                if not got:
                    continue
                ratios = [g["ratio"] if g["ratio"] is not None else math.inf for g in got]
                wasted = [g["wasted_fraction"] for g in got]
                row["budgets"][str(b)] = {
                    "n": len(got),
                    "ratio_median": _q(ratios, 0.5),
                    "ratio_q25": _q(ratios, 0.25),
                    "ratio_q75": _q(ratios, 0.75),
                    "within_3pct": sum(x <= 1.03 for x in ratios) / len(ratios),
                    "wasted_median": _q(wasted, 0.5),
                    "wasted_q75": _q(wasted, 0.75),
                    "ooms_mean": float(np.mean([g["ooms"] for g in got])),
                    "failed_mean": float(np.mean([g["failed"] for g in got])),
                }
            asks = [t["ask_s"] for r in rs for t in r["trials"]]
            row["ask_s_median"], row["ask_s_p90"] = _q(asks, 0.5), _q(asks, 0.9)
            row["run_wall_s_median"] = _q([r["wall_s"] for r in rs], 0.5)
            row["search_core_sha"] = sorted({r.get("search_core_sha", "?") for r in rs})
            summary[prob][name] = row
    return summary


def _fmt(x: float) -> str:
    return "inf" if not math.isfinite(x) else f"{x:.3f}"


def to_markdown(summary: dict[str, Any], budgets: Sequence[int], meta: dict[str, Any]) -> str:
    lines = [
        "# Search efficiency",
        "",
        f"Generated {meta['generated']} on {meta['machine']}.",
        "",
        meta["how"],
        "",
    ]
    for prob, rows in summary.items():
        lines += [
            f"## {prob}",
            "",
            "best-found/oracle: median [IQR] over seeds; wasted: median fraction of device time in OOM+failed trials "
            "(mean number of OOM+failed trials in parentheses).",
            "",
        ]
        head = (
            "| searcher | seeds | "
            + " | ".join(f"ratio@{b}" for b in budgets)
            + " | "
            + " | ".join(f"wasted@{b}" for b in budgets)
            + " | ask s (median/p90) |"
        )
        lines += [head, "|" + "---|" * (3 + 2 * len(budgets))]
        for name, row in rows.items():
            cells = []
            for b in budgets:
                v = row["budgets"].get(str(b))
                n = "" if v is None or v["n"] == row["seeds"] else f" (n={v['n']})"
                cells.append(
                    "-"
                    if v is None
                    else f"{_fmt(v['ratio_median'])} [{_fmt(v['ratio_q25'])}, {_fmt(v['ratio_q75'])}]{n}"
                )
            for b in budgets:
                v = row["budgets"].get(str(b))
                cells.append(
                    "-"
                    if v is None
                    else f"{v['wasted_median']:.1%} ({v['ooms_mean'] + v['failed_mean']:.1f})"
                )
            lines.append(
                f"| {name} | {row['seeds']} | "
                + " | ".join(cells)
                + f" | {row['ask_s_median']:.3f} / {row['ask_s_p90']:.3f} |"
            )
        shas = sorted(
            {
                s
                for name, row in rows.items()
                if name.startswith("infrarsi")
                for s in row["search_core_sha"]
            }
        )
        if shas:
            lines.append(
                f"infrarsi runs used `infrarsi/search` sources with sha256 prefix {', '.join(shas)}."
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: peers only, 2 seeds, budget 12, 1-node surrogate",
    )
    ap.add_argument("--searchers", nargs="*", default=None, help=f"subset of {list(SEARCHERS)}")
    ap.add_argument("--problems", nargs="*", default=None, help=f"subset of {list(PROBLEMS)}")
    ap.add_argument(
        "--seeds", type=int, default=8, help="seeds 0..N-1 per searcher (>= 8 for the report)"
    )
    ap.add_argument(
        "--budgets",
        type=int,
        nargs="*",
        default=list(BUDGETS),
        help="trials at which best-found is scored",
    )
    ap.add_argument("--workers", type=int, default=1, help="parallel processes (one thread each)")
    ap.add_argument("--out", type=Path, default=OUT, help="results directory")
    ap.add_argument(
        "--tag",
        default="main",
        help="raw runs go to search_efficiency_runs.<tag>.jsonl (one per concurrent invocation)",
    )
    ap.add_argument(
        "--summarise-only", action="store_true", help="only rebuild the summary from the jsonl"
    )
    args = ap.parse_args(argv)
    if args.quick:
        searchers = args.searchers or list(QUICK_SEARCHERS)
        problems = args.problems or ["surrogate_1node"]
        seeds, budgets = min(args.seeds, 2), [12]
    else:
        searchers = args.searchers or list(SEARCHERS)
        problems = args.problems or [
            p for p in PROBLEMS if p != "tabular_dense_debug" or TABULAR_PATH.exists()
        ]
        seeds, budgets = args.seeds, sorted(args.budgets)
    args.out.mkdir(parents=True, exist_ok=True)
    raw = args.out / f"search_efficiency_runs.{args.tag}.jsonl"
    done: dict[tuple[str, str, int], dict[str, Any]] = {}
    for path in sorted(args.out.glob("search_efficiency_runs.*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line
            key = (r["problem"], r["searcher"], r["seed"])
            if key not in done or max(r["budgets"]) > max(done[key]["budgets"]):
                done[key] = r  # the longest run of each (problem, searcher, seed) is kept
    jobs = [
        (p, s, k)
        for k in range(seeds)
        for s in searchers
        for p in problems
        if (p, s, k) not in done or max(done[(p, s, k)]["budgets"]) < max(budgets)
    ]
    if not args.summarise_only and jobs:
        with raw.open("a") as f:
            if args.workers <= 1:
                for job in jobs:
                    r = run_one(*job, budgets)
                    done[job] = r
                    f.write(json.dumps(r) + "\n")
                    f.flush()
            else:
                with ProcessPoolExecutor(args.workers) as ex:
                    futs = {ex.submit(run_one, *job, budgets): job for job in jobs}
                    for fut in as_completed(futs):
                        r = fut.result()
                        done[futs[fut]] = r
                        f.write(json.dumps(r) + "\n")
                        f.flush()
    runs = [
        r
        for key, r in done.items()
        if key[0] in problems and key[1] in searchers and key[2] < seeds
    ]
    summary = summarise(runs, budgets)
    meta = {
        "generated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "how": (
            f"Budgets {budgets}, seeds 0..{seeds - 1}. Each run asks, runs and tells one trial at a time. "
            "Surrogate problems draw trials from the analytic model with its noise (lognormal CV 4%), "
            "stragglers (4%) and random crashes (1.5%); best-found/oracle uses the noiseless step time of "
            "the recommended config over the best noiseless feasible config found by enumeration. "
            "Wasted = device-seconds of OOM+failed trials / all device-seconds (45 s setup included per trial). "
            "ask() latency is wall time on this machine, shared with other work."
        ),
        "searchers": searchers,
        "problems": problems,
    }
    result = {"meta": meta, "summary": summary}
    (args.out / "search_efficiency.json").write_text(json.dumps(result, indent=2))
    md_path = args.out / "search_efficiency.md"
    old_md = md_path.read_text() if md_path.exists() else ""
    notes = (
        old_md[old_md.index("\n## Notes") :] if "\n## Notes" in old_md else ""
    )  # hand-written: kept
    md_path.write_text(to_markdown(summary, budgets, meta).rstrip("\n") + "\n" + notes)
    print(to_markdown(summary, budgets, meta))
    return result


if __name__ == "__main__":
    main()
