"""Soak: many trials through the whole stack on a local multi-raylet Ray cluster, under faults.

    python -m benchmarks.soak --quick       # 60 surrogate trials + a short debug-workload run
    python -m benchmarks.soak               # 120 surrogate trials, a longer debug run

What runs. A ``ray.cluster_utils.Cluster`` in a child process (a head with no CPUs and no
``memory`` resource, and two worker raylets of 2 CPUs each; the child takes commands on its stdin,
so a raylet can be removed mid-run). The driver and the study executor stay on the head; every
Tune trial actor (the surrogate's asks ``{cpu: 0, memory: 1}``) and every rank runs on a worker
raylet, where a raylet kill meets it. Each phase is a study driven by the real CLI as subprocesses (``python -m infrarsi
init/doctor/run ... --address ADDR``): ``run --concurrency 2`` (surrogate) or the concurrency the
cluster holds (debug workload, one 2-rank trial per raylet), then ``run --resume`` whenever a
harness ended before its budget (SIGKILLed by the soak, or stopped by a fault).

Faults, planned by a seeded RNG at random points of the budget (run rows logged) and logged with
timestamps:

- ``actor_kill``: SIGKILL of a live actor of the run: a Ray Tune trial actor (surrogate), or a
  ``TrainWorker`` rank actor of a trial in flight (debug workload); never the study executor;
- ``raylet_kill``: ``Cluster.remove_node(allow_graceful=False)`` of a worker raylet holding an
  actor of the run (never the head, which holds the driver and the executor), then a fresh
  raylet of the same size is added;
- ``harness_sigkill``: SIGKILL of the ``infrarsi run`` process group while a trial is in flight,
  then ``run --resume`` (which takes over the dead harness's study lock);
- ``duplicate_launch``: a second ``infrarsi run STUDY --resume`` started on the same study while
  the harness runs and holds the study lock (a user starting it twice): it must be refused with exit 2 naming the holder
  (``infrarsi.study.lock``); one that gets in would show in ``trials_duplicated``, and is counted
  in ``duplicate_launches_admitted``;
- ``oom``: injected through the capacity: the surrogate study is made with a per-device
  ``--memory-capacity`` at a random quantile (seeded) of the modelled peaks of the search space's
  configs (made with ``--no-analytic-prior``: the prior's memory formulas would steer the
  search clear of them), the debug study at 160 MiB, so the search meets configs that do not fit; each ``oom``
  row is the backend's own (the surrogate's model, the ranks' memory watchdog), none is written
  by the soak.

The surrogate workload sets ``surrogate.wall_clock_scale`` so each simulated trial holds its
Tune trial for a scaled copy of its simulated wall time (a few seconds): trials overlap and
faults meet trials in flight.

Accounting (``benchmarks/soak_accounting.py: account``, from the log afterwards plus what the soak saw
while it ran) is defined in ``FIELDS`` and written to ``benchmarks/results/soak.json`` and ``soak.md``.

Why one module: a benchmark is one command; its cluster, fault injection, runs and accounting
summary belong together (the ledger checks are ``soak_accounting``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.machine import cpu_model, git_state
from benchmarks.soak_accounting import FIELDS, account, tune_reported_ids
from benchmarks.soak_cluster import LocalCluster, cli, soak_env

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SURROGATE = ROOT / "tests" / "fixtures" / "stages" / "surrogate_small.yaml"
DENSE = ROOT / "workloads" / "dense_debug.yaml"


# ------------------------------------------------------------------------------- the phases
@dataclass
class Phase:
    """One study under faults."""

    name: str
    study: Path
    requested: int
    plan: list[tuple[int, str]]
    """(counted run rows at which to strike, fault kind), in order."""
    run_args: list[str]
    actor_class: str
    """Ray actor class name of the actors ``actor_kill`` targets."""
    deadline_s: float
    """Most seconds one harness run may take before the soak calls it hung (and kills it)."""
    faults: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    markers_seen: set[str] = field(default_factory=set)
    max_in_flight: int = 0
    actor_classes: set[str] = field(default_factory=set)
    t0: float = field(default_factory=time.monotonic)


class Soak:
    """Drives the harness of each phase and injects the planned faults."""

    def __init__(self, cluster: LocalCluster, rng: random.Random) -> None:
        import ray

        self.cluster = cluster
        self.rng = rng
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        self.job = ray.get_runtime_context().get_job_id()

    # ------------------------------------------------------------------ observation
    def actors(self) -> list[dict[str, Any]]:
        """Live actors of other drivers (the harness under test)."""
        import ray._private.state as ray_state

        return [
            a
            for a in ray_state.actors().values()
            if a["State"] == "ALIVE" and a["JobID"] != self.job and a["Pid"]
        ]

    @staticmethod
    def in_flight(study: Path) -> list[str]:
        from infrarsi.study.paths import StudyPaths

        return sorted(p.stem for p in StudyPaths(study).inflight.glob("run-*.json"))

    @staticmethod
    def counted(study: Path) -> int:
        from infrarsi.study.trial_log import read_trials, rows

        return sum(
            1 for r in rows(read_trials(study)) if r.stage == "run" and not r.extra.interrupted
        )

    def observe(self, ph: Phase) -> list[str]:
        now = self.in_flight(ph.study)
        ph.markers_seen.update(now)
        ph.max_in_flight = max(ph.max_in_flight, len(now))
        return now

    def _fault(self, ph: Phase, kind: str, **info: Any) -> None:
        rec = {
            "kind": kind,
            "t_s": round(time.monotonic() - ph.t0, 2),
            "at_unix": time.time(),
            **info,
        }
        ph.faults.append(rec)
        print(f"[soak {ph.name}] fault {json.dumps(rec, default=str)}", flush=True)

    # ------------------------------------------------------------------ faults
    def _wait_in_flight(
        self, ph: Phase, proc: subprocess.Popen[bytes], timeout_s: float = 60
    ) -> list[str]:
        end = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < end:
            now = self.observe(ph)
            if now:
                return now
            time.sleep(0.1)
        return []

    def actor_kill(self, ph: Phase, proc: subprocess.Popen[bytes]) -> None:
        flying = self._wait_in_flight(ph, proc)
        live = self.actors()
        ph.actor_classes.update(a["ActorClassName"] for a in live)
        targets = [a for a in live if a["ActorClassName"] == ph.actor_class]
        if not targets:
            self._fault(
                ph,
                "actor_kill",
                skipped="no live actor of class " + ph.actor_class,
                classes=sorted({a["ActorClassName"] for a in live}),
            )
            return
        a = self.rng.choice(sorted(targets, key=lambda x: x["ActorID"]))
        try:
            os.kill(int(a["Pid"]), signal.SIGKILL)
        except ProcessLookupError:
            self._fault(ph, "actor_kill", skipped="actor exited first", actor=a["ActorID"])
            return
        self._fault(
            ph,
            "actor_kill",
            actor=a["ActorID"],
            actor_class=a["ActorClassName"],
            pid=int(a["Pid"]),
            node=a["Address"]["NodeID"],
            in_flight=flying,
        )

    def raylet_kill(self, ph: Phase, proc: subprocess.Popen[bytes]) -> None:
        flying = self._wait_in_flight(ph, proc)
        live = self.actors()
        held = {a["Address"]["NodeID"] for a in live if a["ActorClassName"] != "StudyExecutor"}
        execs = {a["Address"]["NodeID"] for a in live if a["ActorClassName"] == "StudyExecutor"}
        choices = [n for n in self.cluster.workers if n not in execs]
        busy = [n for n in choices if n in held]
        if not choices:
            self._fault(ph, "raylet_kill", skipped="every worker raylet holds the executor")
            return
        node = self.rng.choice(sorted(busy or choices))
        ans = self.cluster.remove(node)
        self._fault(
            ph,
            "raylet_kill",
            node=node,
            held_actors_of_run=node in held,
            replacement=ans.get("added"),
            ok=bool(ans.get("ok")),
            in_flight=flying,
        )

    def duplicate_launch(
        self, ph: Phase, proc: subprocess.Popen[bytes], timeout_s: float = 120
    ) -> None:
        flying = self._wait_in_flight(ph, proc)
        end = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < end and not self.holds(ph, proc):
            time.sleep(0.1)  # a harness just (re)started may not hold the study yet
        if proc.poll() is not None or not self.holds(ph, proc):
            self._fault(
                ph, "duplicate_launch", skipped="the harness ended or never held the study lock"
            )
            return
        args = [
            "run",
            str(ph.study),
            "--trials",
            str(ph.requested),
            "--address",
            self.cluster.address,
            *ph.run_args,
            "--resume",
        ]
        r = subprocess.run(
            [sys.executable, "-m", "infrarsi", *args],
            env=soak_env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=ph.deadline_s,
        )
        self._fault(
            ph,
            "duplicate_launch",
            in_flight=flying,
            harness_pid=proc.pid,
            harness_alive=proc.poll() is None,
            **duplicate_launch_outcome(r.returncode, r.stderr),
        )

    @staticmethod
    def holds(ph: Phase, proc: subprocess.Popen[bytes]) -> bool:
        """Whether the harness process holds the study's lock now."""
        from infrarsi.study.lock import read_holder
        from infrarsi.study.paths import StudyPaths

        holder = read_holder(StudyPaths(ph.study).lock)
        return holder is not None and holder.pid == proc.pid

    def harness_sigkill(self, ph: Phase, proc: subprocess.Popen[bytes]) -> bool:
        flying = self._wait_in_flight(ph, proc)
        if proc.poll() is not None:
            return False
        held = [int(a["Pid"]) for a in self.actors()]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        from benchmarks.machine import wait_gone

        gone = wait_gone(held, 120)
        self._fault(
            ph,
            "harness_sigkill",
            in_flight=flying,
            actors_of_harness=len(held),
            actor_processes_outliving_it=gone,
        )
        return True

    # ------------------------------------------------------------------ the loop
    def run_phase(self, ph: Phase, max_runs: int = 12) -> None:
        plan = list(ph.plan)
        resume = False
        while len(ph.runs) < max_runs:
            args = [
                "run",
                str(ph.study),
                "--trials",
                str(ph.requested),
                "--address",
                self.cluster.address,
                *ph.run_args,
                *(["--resume"] if resume else []),
            ]
            out = ph.study.parent / f"{ph.name}-run{len(ph.runs)}.log"
            t_start = time.monotonic()
            with out.open("wb") as fh:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "infrarsi", *args],
                    env=soak_env(),
                    cwd=ROOT,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                why = self._drive(ph, proc, plan, t_start)
            rc = proc.returncode
            tail = out.read_text(errors="replace")[-1500:] if rc not in (0, -signal.SIGKILL) else ""
            rec = {
                "resume": resume,
                "rc": rc,
                "ended_by": why,
                "seconds": round(time.monotonic() - t_start, 1),
                "counted_after": self.counted(ph.study),
                "log": out.name,
            }
            if tail:
                rec["output_tail"] = tail
            ph.runs.append(rec)
            print(
                f"[soak {ph.name}] harness run {json.dumps({k: v for k, v in rec.items() if k != 'output_tail'})}",
                flush=True,
            )
            resume = True
            if rc == 0 and why == "exited":
                break

    def _drive(
        self, ph: Phase, proc: subprocess.Popen[bytes], plan: list[tuple[int, str]], t_start: float
    ) -> str:
        last_count = 0.0
        count = 0
        while proc.poll() is None:
            self.observe(ph)
            if time.monotonic() - t_start > ph.deadline_s:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)
                self._fault(ph, "hang_detected", after_s=ph.deadline_s)
                return "hung"
            if time.monotonic() - last_count > 1.0:
                count, last_count = self.counted(ph.study), time.monotonic()
            if plan and count >= plan[0][0]:
                _, kind = plan.pop(0)
                if kind == "harness_sigkill":
                    if self.harness_sigkill(ph, proc):
                        return "harness_sigkill"
                elif kind == "actor_kill":
                    self.actor_kill(ph, proc)
                elif kind == "raylet_kill":
                    self.raylet_kill(ph, proc)
                elif kind == "duplicate_launch":
                    self.duplicate_launch(ph, proc)
            time.sleep(0.2)
        self.observe(ph)
        return "exited"

    def close(self) -> None:
        import ray

        ray.shutdown()


def duplicate_launch_outcome(rc: int, stderr: str) -> dict[str, Any]:
    """What a duplicate ``run`` launch (started while the harness held the study) did:
    ``refused`` (exit 2 naming the run holding the study), its exit code and its message (from
    ``error:`` on, lines joined)."""
    text = " ".join(stderr.split())
    at = text.find("error:")
    return {
        "rc": rc,
        "refused": rc == 2 and "held by `run`" in text,
        "message": (text[at:] if at >= 0 else text[-600:])[:900],
    }


def surrogate_faults(trials: int) -> list[str]:
    """The fault kinds planned for the surrogate phase of ``trials`` run trials."""
    return (
        ["actor_kill"] * max(2, trials // 20)
        + ["raylet_kill"] * max(2, trials // 30)
        + ["harness_sigkill"] * max(1, trials // 60)
        + ["duplicate_launch"] * max(1, trials // 60)
    )


# ------------------------------------------------------------------------------- studies
def _plan(rng: random.Random, budget: int, kinds: list[str], lo: int = 3) -> list[tuple[int, str]]:
    """Each fault at a distinct random count of logged run rows in [lo, budget - 3)."""
    hi = max(lo + len(kinds), budget - 3)
    points = sorted(rng.sample(range(lo, hi), len(kinds)))
    order = list(kinds)
    rng.shuffle(order)
    return list(zip(points, order, strict=True))


def surrogate_capacity(rng: random.Random) -> tuple[int, float]:
    """A per-device capacity at a random quantile (0.25-0.5) of the modelled peaks of the valid
    configs of the surrogate study's space (so the search meets configs that do not fit), and the
    quantile."""
    import numpy as np

    from infrarsi.execution.surrogate.backend import problem_for
    from infrarsi.execution.surrogate.model import evaluate
    from infrarsi.search import SearchSpace
    from infrarsi.workload import Workload

    wl = Workload.from_yaml(str(SURROGATE))
    space = SearchSpace.from_yaml(wl.search_space_path())
    problem = problem_for(wl)
    configs = space.enumerate() or space.sample(np.random.default_rng(rng.randrange(2**31)), n=2000)
    peaks = [ev.peak_memory_bytes for ev in (evaluate(problem, c) for c in configs) if ev.valid]
    q = rng.uniform(0.25, 0.5)
    base = evaluate(problem, space.validate(wl.baseline)).peak_memory_bytes
    cap = max(float(np.quantile(peaks, q)), 1.25 * base)
    return int(cap), q


def surrogate_phase(
    work: Path, rng: random.Random, *, trials: int, address: str, scale: float
) -> Phase:
    import yaml

    data = yaml.safe_load(SURROGATE.read_text())
    data["surrogate"]["wall_clock_scale"] = scale
    data["search_space"] = str(ROOT / "search_spaces" / "surrogate_gpu.yaml")
    wl = work / "surrogate_soak.yaml"
    wl.write_text(yaml.safe_dump(data))
    cap, q = surrogate_capacity(rng)
    study = work / "surrogate"
    cli(
        "init",
        str(wl),
        "--study",
        str(study),
        "--memory-capacity",
        str(cap),
        "--trials",
        str(trials),
        "--no-analytic-prior",
    )  # the prior's memory formulas would steer the search clear of OOMs
    cli("doctor", str(study), "--repeats", "2", "--address", address)
    kinds = surrogate_faults(trials)
    ph = Phase(
        "surrogate",
        study,
        trials,
        _plan(rng, trials, kinds),
        ["--concurrency", "2"],
        actor_class="ImplicitFunc",
        deadline_s=900,
    )
    ph.faults.append(
        {
            "kind": "oom_capacity",
            "t_s": 0.0,
            "memory_capacity_bytes": cap,
            "quantile_of_modelled_peaks": round(q, 3),
        }
    )
    return ph


def debug_phase(work: Path, rng: random.Random, *, trials: int, address: str, full: bool) -> Phase:
    import yaml

    data = yaml.safe_load(DENSE.read_text())
    data["steps"] = {"warmup": 1, "measured": 2}
    data["search_space"] = str(ROOT / "search_spaces" / "deepspeed_dense.yaml")
    wl = work / "dense_soak.yaml"
    wl.write_text(yaml.safe_dump(data))
    study = work / "debug"
    cli(
        "init",
        str(wl),
        "--study",
        str(study),
        "--knob",
        "zero_stage",
        "--knob",
        "micro_batch_size",
        "--memory-capacity",
        "160MiB",
        "--trials",
        str(trials),
    )
    cli("doctor", str(study), "--repeats", "2", "--no-honest-change", "--address", address)
    kinds = ["actor_kill", "harness_sigkill", "duplicate_launch"] + (
        ["raylet_kill"] if full else []
    )
    plan = (
        _plan(rng, trials, kinds, lo=1)
        if trials > len(kinds) + 3
        else [(1 + i, k) for i, k in enumerate(kinds)]
    )
    ph = Phase("debug", study, trials, plan, [], actor_class="TrainWorker", deadline_s=900)
    ph.faults.append({"kind": "oom_capacity", "t_s": 0.0, "memory_capacity_bytes": 160 * 2**20})
    return ph


def summarize(ph: Phase) -> dict[str, Any]:
    from infrarsi.study.paths import InflightMarkers, StudyPaths
    from infrarsi.study.trial_log import read_trials, rows

    log_rows = rows(read_trials(ph.study))
    left = [m["trial_id"] for m in InflightMarkers(StudyPaths(ph.study)).leftovers()]
    acc = account(
        log_rows,
        requested=ph.requested,
        markers_seen=ph.markers_seen,
        leftover_markers=left,
        tune_reported=tune_reported_ids(ph.study),
    )
    by_kind: dict[str, int] = {}
    for f in ph.faults:
        if f["kind"] in ("oom_capacity", "hang_detected") or f.get("skipped"):
            continue
        by_kind[f["kind"]] = by_kind.get(f["kind"], 0) + 1
    by_kind["oom"] = acc["statuses"].get("oom", 0)
    return {
        **acc,
        "faults_injected": by_kind,
        "faults_skipped": sum(1 for f in ph.faults if f.get("skipped")),
        "faults": ph.faults,
        "harness_runs": ph.runs,
        "max_in_flight": ph.max_in_flight,
        "hangs": sum(1 for f in ph.faults if f["kind"] == "hang_detected"),
        "duplicate_launches_admitted": sum(
            1
            for f in ph.faults
            if f["kind"] == "duplicate_launch" and not f.get("skipped") and not f.get("refused")
        ),
        "actor_classes_seen": sorted(ph.actor_classes),
        "seconds": round(time.monotonic() - ph.t0, 1),
    }


def write_results(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
    lines = [
        "# Soak: the whole stack under faults on a local multi-raylet Ray cluster",
        "",
        f"`{result['command']}` on {result['machine']['cpu']} ({result['machine']['cpus']} CPUs), commit "
        f"`{result['commit']}`, {result['date_utc']}, seed {result['seed']}, {result['seconds']:.0f} s in all.",
        "",
        "| phase | requested | counted | lost | duplicated | interrupted | faults injected "
        "| harness runs | max in flight | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, ph in result["phases"].items():
        faults = ", ".join(f"{k} {v}" for k, v in sorted(ph["faults_injected"].items()))
        lines.append(
            f"| {name} | {ph['trials_requested']} | {ph['trials_counted']} | {ph['trials_lost']} | "
            f"{ph['trials_duplicated']} | {ph['trials_interrupted']} | {faults} | "
            f"{len(ph['harness_runs'])} | {ph['max_in_flight']} | {ph['seconds']:.0f} |"
        )
    lines += [
        "",
        f"Duplicate launches admitted (a second `infrarsi run` of a study not refused): "
        f"{result.get('duplicate_launches_admitted', 0)}.",
        "",
        "Device seconds of run rows by status (interrupted: a lower bound):",
        "",
    ]
    for name, ph in result["phases"].items():
        lines.append(
            f"- {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in ph["device_seconds"].items())
        )
    lines += ["", "## What each field means", ""]
    lines += [f"- `{k}`: {v}" for k, v in FIELDS.items()]
    lines += [
        "",
        "## How",
        "",
        (__doc__ or "").split("Faults,", 1)[0].split("What runs.", 1)[-1].strip(),
        "",
        "Faults" + (__doc__ or "").split("Faults", 1)[1].split("Accounting", 1)[0].rstrip(),
        "",
    ]
    (out / "soak.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="60 surrogate trials, 4 debug trials")
    ap.add_argument(
        "--trials", type=int, default=None, help="surrogate run budget (default 60 quick, 120)"
    )
    ap.add_argument(
        "--debug-trials", type=int, default=None, help="debug run budget (default 4 quick, 6)"
    )
    ap.add_argument("--no-debug", action="store_true", help="skip the debug-workload phase")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=0.02, help="surrogate wall_clock_scale")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument(
        "--work", type=Path, default=None, help="where the studies go (default: a temp dir)"
    )
    a = ap.parse_args(argv)

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    trials = a.trials or (60 if a.quick else 120)
    debug_trials = a.debug_trials or (4 if a.quick else 6)
    rng = random.Random(a.seed)
    work = a.work or Path(tempfile.mkdtemp(prefix="infrarsi-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    phases: dict[str, Any] = {}
    cluster = LocalCluster(workers=2, cpus=2)
    soak: Soak | None = None
    try:
        soak = Soak(cluster, rng)
        ph = surrogate_phase(work, rng, trials=trials, address=cluster.address, scale=a.scale)
        soak.run_phase(ph)
        phases["surrogate"] = summarize(ph)
        if not a.no_debug:
            ph = debug_phase(
                work, rng, trials=debug_trials, address=cluster.address, full=not a.quick
            )
            soak.run_phase(ph)
            phases["debug"] = summarize(ph)
    finally:
        if soak is not None:
            soak.close()
        cluster.close()
    sha, dirty = git_state()
    result = {
        "command": "python -m benchmarks.soak " + " ".join(sys.argv[1:] if argv is None else argv),
        "commit": sha + ("-dirty" if dirty else ""),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": {"cpu": cpu_model(), "cpus": os.cpu_count()},
        "seed": a.seed,
        "cluster": "ray.cluster_utils.Cluster: head (0 CPUs, no memory resource) + 2 worker raylets x 2 CPUs",
        "seconds": round(time.monotonic() - t0, 1),
        "work_dir": str(work),
        "phases": phases,
        "trials_lost": sum(p["trials_lost"] for p in phases.values()),
        "trials_duplicated": sum(p["trials_duplicated"] for p in phases.values()),
        "duplicate_launches_admitted": sum(
            p["duplicate_launches_admitted"] for p in phases.values()
        ),
        "budget_met": all(p["budget_met"] for p in phases.values()),
        "faults_injected": {
            k: sum(p["faults_injected"].get(k, 0) for p in phases.values())
            for k in sorted({k for p in phases.values() for k in p["faults_injected"]})
        },
        "fields": FIELDS,
    }
    write_results(result, a.out)
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "trials_lost",
                    "trials_duplicated",
                    "duplicate_launches_admitted",
                    "budget_met",
                    "faults_injected",
                    "seconds",
                )
            },
            indent=1,
        )
    )
    return (
        0
        if (
            result["trials_lost"] == 0
            and result["trials_duplicated"] == 0
            and result["budget_met"]
            and result["duplicate_launches_admitted"] == 0
        )
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
