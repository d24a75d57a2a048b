"""Run trials for an MCP client without blocking the server: a background job, and what to watch.

The ``run_trials`` tool starts a job and returns at once; the agent then calls ``watch``. A job
is a child process, so the run's Ray output never reaches the server's stdout (the MCP channel):
``infrarsi doctor DIR`` first when the study has no ``doctor.json`` (run needs the baseline's
calibration), then ``infrarsi run DIR --resume --trials USED+N``. Each takes the study lock
itself, as on the command line, and the job's output goes to ``DIR/mcp/run-<n>.log``. One job
at a time per server, and none while another process holds the study.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from infrarsi.errors import StudyLockedError, UserInputError
from infrarsi.study.paths import StudyPaths

JobState = Literal["running", "done", "failed"]


@dataclass
class RunJob:
    """One background run started by the ``run_trials`` tool."""

    job_id: str
    """``run-1``, ``run-2``... in the order this server started them."""
    trials: int
    """Run trials asked for (on top of those already in the log)."""
    steps: list[str]
    """The stages the job runs, in order: ``doctor`` (when the study had none) and ``run``."""
    log: str
    """The job's output, relative to the study directory (``mcp/run-<n>.log``)."""
    started_at: float = field(default_factory=time.time)
    """When it started (Unix seconds)."""
    state: JobState = "running"
    """``running``, ``done`` (every step exited 0) or ``failed``."""
    step: str = ""
    """The step running now (or the last one run)."""
    exit_code: int | None = None
    """The last step's exit status (None while it runs)."""
    error: str = ""
    """The end of the log when a step failed (why, in the stage's words)."""
    ended_at: float | None = None
    """When it ended (Unix seconds; None while it runs)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict, with the seconds it has run so far."""
        end = self.ended_at if self.ended_at is not None else time.time()
        return {**asdict(self), "elapsed_s": round(end - self.started_at, 1)}


class RunJobs:
    """The background runs of one server over one study directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        """The study directory."""
        self.jobs: list[RunJob] = []
        """Every job started, oldest first."""
        self._lock = threading.Lock()

    def current(self) -> RunJob | None:
        """The latest job (running or not), or None."""
        return self.jobs[-1] if self.jobs else None

    def start(self, trials: int, *, used: int, budget: int) -> RunJob:
        """Start a job running ``trials`` more run trials (``used`` of ``budget`` are spent).
        Refused with a ``UserInputError`` saying what to do when the count is outside the budget,
        a job of this server still runs, or another process holds the study."""
        from infrarsi.study.lock import holder_of

        left = max(0, budget - used)
        if left == 0:
            raise UserInputError(
                f"run_trials trials: rule: run trials stay within the contract's budget of {budget}; "
                f"all {budget} are spent. Fix: call verify/report on what ran (or start a new study "
                f"with a larger budget)."
            )
        if not 1 <= trials <= left:
            raise UserInputError(
                f"run_trials trials: rule: 1 to {left} (the run trials left of the contract's budget "
                f'of {budget}); got {trials}. Fix: "trials": {min(max(trials, 1), left)}.'
            )
        with self._lock:
            job = self.current()
            if job is not None and job.state == "running":
                raise StudyLockedError(
                    f"run_trials: rule: one run at a time; {job.job_id} ({job.step}) still runs. "
                    f"Fix: call watch until it ends."
                )
            holder = holder_of(self.root)
            if holder is not None:
                raise StudyLockedError(
                    f"run_trials: rule: one writer per study; the study is held by {holder.describe()}. "
                    f"Fix: call watch, and run_trials again once it is free."
                )
            steps = ([] if StudyPaths(self.root).doctor.exists() else ["doctor"]) + ["run"]
            n = len(self.jobs) + 1
            job = RunJob(job_id=f"run-{n}", trials=trials, steps=steps, log=f"mcp/run-{n}.log")
            self.jobs.append(job)
        commands = [self._command(s, used + trials) for s in steps]
        threading.Thread(
            target=self._work, args=(job, commands), daemon=True, name=f"infrarsi-mcp-{job.job_id}"
        ).start()
        return job

    def _command(self, step: str, total: int) -> list[str]:
        base = [sys.executable, "-m", "infrarsi", step, str(self.root)]
        return [*base, "--resume", "--trials", str(total)] if step == "run" else base

    def _work(self, job: RunJob, commands: list[list[str]]) -> None:
        log_path = self.root / job.log
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as out:
            for step, cmd in zip(job.steps, commands, strict=True):
                job.step, job.exit_code = step, None
                out.write(f"$ infrarsi {step} ...\n".encode())
                out.flush()
                code = subprocess.run(
                    cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, check=False
                ).returncode
                job.exit_code = code
                if code != 0:
                    job.error = _tail(log_path)
                    break
        job.state = "done" if job.exit_code == 0 else "failed"
        job.ended_at = time.time()


def _tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def in_flight(root: Path) -> list[dict[str, Any]]:
    """The trials running now, from their in-flight markers (``InflightMarkers``): id, stage,
    config, seconds since start, seconds since the last heartbeat, and whether it looks alive
    (a fresh heartbeat; a stale marker was left by a killed harness)."""
    from infrarsi.study.paths import MARKER_STALE_S, InflightMarkers, StudyPaths

    now = time.time()
    out = []
    for m in InflightMarkers(StudyPaths(root)).leftovers():
        since_beat = now - float(m.get("last_alive_at") or now)
        out.append(
            {
                "trial_id": m.get("trial_id"),
                "stage": m.get("stage"),
                "config": m.get("config"),
                "running_s": round(now - float(m.get("started_at") or now), 1),
                "last_heartbeat_s_ago": round(since_beat, 1),
                "alive": since_beat <= MARKER_STALE_S,
            }
        )
    return out
