"""Trial overhead, cold vs warm: the share of a trial's wall time spent outside its measured steps.

    .venv/bin/python -m benchmarks.trial_overhead [--trials 3] [--workload workloads/dense_debug.yaml]

- *cold*: every trial gets a fresh worker group (new Ray actor processes, torch/DeepSpeed imports,
  rendezvous, first DeepSpeed engine in the process) -- what a one-shot launcher pays.
- *warm*: one group kept alive by the ``WorkerPool``; the first (cold) trial primes it and is not
  counted, the next ``--trials`` reuse it (only the engine is rebuilt).

Per trial, ``wall_s`` = group acquire + the trial's run on the ranks (submission to last answer),
``measured_s`` = the sum of the measured step times (max over ranks), and
``overhead_share = 1 - measured_s / wall_s`` (set-up, warm-up steps, eval, result collection).
Ray itself is started once beforehand and not counted. Target: warm <= 15% on the dense debug
workload. Results go to ``benchmarks/results/trial_overhead.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from infrarsi.execution.runner import TrialRunner, init_ray  # noqa: E402
from infrarsi.result import TrialResult  # noqa: E402
from infrarsi.workload import Workload  # noqa: E402

CONFIG = {"zero_stage": 2, "micro_batch_size": 4}
"""The knob config every trial runs (the demo's)."""


def breakdown(res: TrialResult) -> dict[str, Any]:
    """Where one trial's wall time went."""
    wall = float(res.extra.acquire_s or 0.0) + float(res.extra.trial_wall_s or 0.0)
    measured = float(sum(res.step_time_samples_s))
    out: dict[str, Any] = {
        "trial_id": res.trial_id,
        "status": res.status,
        "warm": res.extra.warm,
        "wall_s": round(wall, 3),
        "measured_s": round(measured, 3),
        "acquire_s": round(float(res.extra.acquire_s or 0.0), 3),
        "setup_time_s": round(res.setup_time_s or 0.0, 3),
        "warmup_time_s": round(res.warmup_time_s or 0.0, 3),
        "step_time_s": res.step_time_s,
        "end_checks_s": round(float(res.extra.end_checks_time_s or 0.0), 3),
        "overhead_share": round(1.0 - measured / wall, 4) if wall > 0 else None,
    }
    out["other_s"] = round(
        wall
        - measured
        - out["acquire_s"]
        - out["setup_time_s"]
        - out["warmup_time_s"]
        - out["end_checks_s"],
        3,
    )
    return out


def run(workload_path: str, trials: int) -> dict[str, Any]:
    wl = Workload.from_yaml(workload_path)
    init_ray()
    load_before = os.getloadavg()
    cold, warm = [], []
    with TrialRunner(wl, warm=False) as runner:
        for i in range(trials):
            cold.append(breakdown(runner.run(CONFIG, trial_id=f"cold-{i}")))
            print("cold", cold[-1], flush=True)
    with TrialRunner(wl, warm=True) as runner:
        prime = breakdown(runner.run(CONFIG, trial_id="warm-prime"))
        print("prime", prime, flush=True)
        for i in range(trials):
            warm.append(breakdown(runner.run(CONFIG, trial_id=f"warm-{i}")))
            print("warm", warm[-1], flush=True)

    def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
        ok = [r for r in rows if r["status"] == "ok"]
        return {
            "trials": len(rows),
            "ok": len(ok),
            "median_overhead_share": statistics.median(r["overhead_share"] for r in ok)
            if ok
            else None,
            "median_wall_s": statistics.median(r["wall_s"] for r in ok) if ok else None,
            "median_measured_s": statistics.median(r["measured_s"] for r in ok) if ok else None,
        }

    return {
        "workload": workload_path,
        "config": CONFIG,
        "steps": {"warmup": wl.steps.warmup, "measured": wl.steps.measured},
        "cold": summary(cold),
        "warm": summary(warm),
        "cold_trials": cold,
        "warm_trials": warm,
        "warm_prime_trial": prime,
        "target_warm_overhead_share": 0.15,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpu_count": os.cpu_count(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write(result: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "trial_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    c, w = result["cold"], result["warm"]

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    lines = [
        "# Trial overhead: cold vs warm worker groups",
        "",
        f"Measured {result['measured_at']} on {result['cpu_count']} CPU cores (load average "
        f"{result['loadavg_before'][0]:.1f} before, {result['loadavg_after'][0]:.1f} after), "
        f"workload `{result['workload']}` ({result['steps']['warmup']} warm-up + "
        f"{result['steps']['measured']} measured steps), config `{json.dumps(result['config'])}`.",
        "",
        "`overhead_share = 1 - (sum of measured step times) / (group acquire + trial run wall time)`.",
        "Cold: a fresh group (actor processes, imports, rendezvous, first engine) per trial. Warm: "
        "one group reused by the pool; the priming trial is not counted. Ray starts once, uncounted.",
        "",
        "| mode | trials ok | median overhead share | median wall s | median measured s |",
        "|---|---|---|---|---|",
        *(
            f"| {name} | {r['ok']}/{r['trials']} | {pct(r['median_overhead_share'])} "
            f"| {r['median_wall_s']} | {r['median_measured_s']} |"
            for name, r in (("cold", c), ("warm", w))
        ),
        "",
        f"Target: warm <= {pct(result['target_warm_overhead_share'])}.",
        "",
        f"The workload's own warm-up steps alone put a floor of about "
        f"{pct(result['steps']['warmup'] / (result['steps']['warmup'] + result['steps']['measured']))} "
        "under the share (when a warm-up step is as slow as a measured one).",
        "",
        "Per trial (seconds): acquire = group start (0 when warm), setup = engine build on the ranks,",
        "warmup = warm-up steps, checks = the end-of-trial checks (parameter checksum, eval loss), other = the rest "
        "(engine teardown, Ray calls).",
        "",
        "| trial | warm | wall | acquire | setup | warmup | measured | checks | other | overhead |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in [*result["cold_trials"], result["warm_prime_trial"], *result["warm_trials"]]:
        lines.append(
            f"| {r['trial_id']} | {r['warm']} | {r['wall_s']} | {r['acquire_s']} | {r['setup_time_s']} | "
            f"{r['warmup_time_s']} | {r['measured_s']} | {r.get('end_checks_s', '-')} | {r.get('other_s', '-')} | "
            f"{pct(r['overhead_share'])} |"
        )
    (out_dir / "trial_overhead.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="workloads/dense_debug.yaml")
    ap.add_argument("--trials", type=int, default=3, help="counted trials per mode")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.chdir(ROOT)
    result = run(args.workload, args.trials)
    write(result, Path(args.out))
    print(json.dumps({"cold": result["cold"], "warm": result["warm"]}, indent=2))


if __name__ == "__main__":
    main()
