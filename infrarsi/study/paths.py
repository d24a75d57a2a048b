"""A study directory: everything a stage needs, so any stage can be re-run from the directory alone.

Layout::

    DIR/contract.yaml      frozen task contract (init; ``infrarsi.study.contract``)
    DIR/search_space.yaml  the study's copy of the search space (init)
    DIR/doctor.json        noise, phases, peak, loss tolerance (doctor; ``infrarsi.study.doctor_report``)
    DIR/doctor.failed.json what a doctor that could not calibrate saw (fewer than two ok baselines)
    DIR/trials/*.arrows    the Arrow trial log, one stream file per harness process
    DIR/inflight/*.json    a marker per trial in flight; a leftover marker means the harness died
    DIR/ids/<trial id>     one empty-ish file per trial id ever allocated (an exclusive create: ``TrialIds``)
    DIR/study.lock         the writer holding the study (``infrarsi.study.lock``): host, pid, stage, heartbeat
    DIR/proposals/         proposals from agents or people: queued/, taken/, patches/ (``infrarsi.study.proposals``)
    DIR/optimizer.json     inspection snapshot of the optimizer at the end of run (see below)
    DIR/verify.json        verified candidates (verify)
    DIR/long_check.json    the accepted candidate past the trial's horizon (long check;
                           ``infrarsi.study.long_check_report``)
    DIR/bank_warm_start.json the experience bank's configs chosen to warm-start the search, and those dropped
                           (``infrarsi.study.warm_start_record``)
    DIR/report.md, DIR/report.html

A study directory, and every folder infrarsi makes in it, is created with mode 0700
(``make_private_dir``).

``optimizer.json`` is ``Optimizer.save`` output (JSON: observations, pending configs, RNG,
options), written for inspection only: nothing reads it back. ``run --resume``, ``verify`` and the
report rebuild the optimizer from the trial log, which stays the one source of truth. Study
directories written before this name hold the same snapshot as ``optimizer.pt``; it is not read
either, so they keep working.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infrarsi.errors import LogError, NotAStudyError, StudyError

_ID = re.compile(r"^(?P<stage>[a-z]+)-(?P<n>\d+)$")

CONTRACT_FILE = "contract.yaml"
"""Name of the frozen contract inside a study directory (``StudyPaths.contract``)."""
FROZEN_FILE = ".contract.frozen.json"
"""Name of the contract's frozen JSON copy (``StudyPaths.frozen_contract``)."""
SPACE_COPY = "search_space.yaml"
"""The study's own copy of the search space (init writes it), so it needs no other file."""
STUDY_LOG = Path("logs") / "infrarsi.jsonl"
"""The study's JSON-lines event log, relative to the study directory (``StudyPaths.study_log``)."""
TRIALS_DIRNAME = "trials"
"""Name of the trial-log folder inside a study directory (``StudyPaths.trials``)."""
REPORT_FILES_DIR = "report_files"
"""The report's figures folder, relative to the study directory (``StudyPaths.report_files``)."""

STUDY_DIR_MODE = 0o700
"""Mode of a study directory and of the folders infrarsi makes in it: the owner's alone (the
contract, the log and the report hold the workload, its code paths and its measurements)."""


def make_private_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (and missing parents) with mode ``STUDY_DIR_MODE``; parents infrarsi makes
    on the way keep the umask's mode, and an existing directory is left as it is."""
    d = Path(path)
    if not d.is_dir():
        d.parent.mkdir(parents=True, exist_ok=True)
        try:
            d.mkdir(mode=STUDY_DIR_MODE)
        except FileExistsError:  # made meanwhile by another process: leave it
            return d
        os.chmod(
            d, STUDY_DIR_MODE
        )  # the umask narrows mkdir's mode; never widens it: set it exactly
    return d


@dataclass(frozen=True)
class StudyPaths:
    """The files of one study directory."""

    root: Path
    """The study directory."""

    @property
    def contract(self) -> Path:
        """The frozen task contract (``infrarsi.study.contract``)."""
        return self.root / CONTRACT_FILE

    @property
    def frozen_contract(self) -> Path:
        """The contract's frozen JSON copy (what the contract held when it was frozen)."""
        return self.root / FROZEN_FILE

    @property
    def search_space(self) -> Path:
        """The study's copy of the search space (init)."""
        return self.root / SPACE_COPY

    @property
    def logs(self) -> Path:
        """The study's logs: ``infrarsi.jsonl`` (``study_log``) and ``ray`` (a link to Ray's)."""
        return self.study_log.parent

    @property
    def study_log(self) -> Path:
        """The study's JSON-lines event log (``infrarsi.structlog_config``)."""
        return self.root / STUDY_LOG

    @property
    def doctor(self) -> Path:
        """The doctor's report (``DoctorReport``)."""
        return self.root / "doctor.json"

    @property
    def doctor_failed(self) -> Path:
        """The doctor's analysis when fewer than two baseline trials were ok (nothing reads it)."""
        return self.root / "doctor.failed.json"

    @property
    def trials(self) -> Path:
        """The Arrow trial log's folder (``infrarsi.study.trial_log``)."""
        return self.root / TRIALS_DIRNAME

    @property
    def inflight(self) -> Path:
        return self.root / "inflight"

    @property
    def trial_ids(self) -> Path:
        """Reserved trial ids (``TrialIds``): a file per id, created exclusively, never removed."""
        return self.root / "ids"

    @property
    def lock(self) -> Path:
        """The study lock (``infrarsi.study.lock``): one writer per study."""
        return self.root / "study.lock"

    @property
    def proposals(self) -> Path:
        """Proposals from outside the optimizer (``proposals/queued``, ``proposals/taken``, their patches)."""
        return self.root / "proposals"

    @property
    def proposals_queued(self) -> Path:
        """Proposals waiting for a run trial (``ProposalQueue``)."""
        return self.proposals / "queued"

    @property
    def proposals_taken(self) -> Path:
        """Proposals a run trial took."""
        return self.proposals / "taken"

    @property
    def proposal_patches(self) -> Path:
        """The proposals' patch files, copied into the study."""
        return self.proposals / "patches"

    @property
    def proposals_lock(self) -> Path:
        """The proposal queue's own lock."""
        return self.proposals / "queue.lock"

    @property
    def optimizer_state(self) -> Path:
        """The optimizer's inspection snapshot (``optimizer.json``; module docstring)."""
        return self.root / "optimizer.json"

    @property
    def bank_warm_start(self) -> Path:
        """The bank configs chosen as warm starts and those dropped (``orchestration.optimizer_factory``;
        the report's audit reads it)."""
        return self.root / "bank_warm_start.json"

    @property
    def verify(self) -> Path:
        return self.root / "verify.json"

    @property
    def long_check(self) -> Path:
        """The long check's verdict on the accepted candidate (``LongCheckResult``)."""
        return self.root / "long_check.json"

    @property
    def apply_record(self) -> Path:
        """Every promotion ``apply`` made (branch, commit, long check or its skip), a JSON list."""
        return self.root / "apply.json"

    @property
    def report_md(self) -> Path:
        return self.root / "report.md"

    @property
    def report_html(self) -> Path:
        return self.root / "report.html"

    @property
    def report_files(self) -> Path:
        """The report's figures (``report.md`` links them relative to the study directory)."""
        return self.root / REPORT_FILES_DIR

    def require(self, what: str, path: Path, stage: str) -> Path:
        if not path.exists():
            raise StudyError(
                f"{self.root}: {what} ({path.name}) is missing; run `infrarsi {stage} {self.root}` first."
            )
        return path


def require_study(study_dir: str | os.PathLike[str]) -> StudyPaths:
    """The ``StudyPaths`` of ``study_dir``, or ``NotAStudyError`` (exit 2) when it is not a study
    (``init`` makes one: it writes ``contract.yaml``), before any stage looks for its outputs."""
    root = Path(study_dir)
    paths = StudyPaths(root)
    fix = (
        f"Fix: pass a study directory (one `infrarsi init WORKLOAD --study DIR` or `infrarsi tune` "
        f"made), or make one with `infrarsi init WORKLOAD --study {root}`."
    )
    if not root.exists():
        raise NotAStudyError(f"{root}: not a study: the directory does not exist. {fix}")
    if not root.is_dir():
        raise NotAStudyError(f"{root}: not a study: it is a file, not a directory. {fix}")
    if not paths.contract.is_file():
        raise NotAStudyError(
            f"{root}: not a study: rule: a study directory holds contract.yaml; this one "
            f"does not. {fix}"
        )
    return paths


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def write_error(study_dir: str | os.PathLike[str], path: Path, e: OSError, what: str) -> LogError:
    """The ``LogError`` for an ``OSError`` met while writing into a study directory (the trial
    log, an in-flight marker): names the file, the cause and the fix. Rows logged before stay
    readable, and ``run --resume`` logs a trial that was in flight as interrupted."""
    study = str(study_dir)
    if e.errno in _DISK_FULL:
        fix = (
            f"the disk holding it is full (or over quota): free space there, or move the study "
            f"directory {study!r} to a larger disk"
        )
    elif e.errno in _NOT_WRITABLE:
        fix = (
            f"it is not writable by this user: make the study directory {study!r} and the "
            f"folders in it writable (chmod -R u+w; chattr -i if it was made immutable), or "
            f"use a new study directory"
        )
    else:
        fix = f"check the disk and the permissions of the study directory {study!r}"
    return LogError(
        f"cannot {what} in {str(path)!r}: {e.strerror or e} (errno {e.errno}); {fix}. Every row "
        f"logged before is intact; re-run the stage afterwards (`infrarsi run {study} --resume` "
        f"continues a search)."
    )


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` via a temp file and ``os.replace`` (never a half-written file)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


class TrialIds:
    """Allocates ``<stage>-<n>`` trial ids that are never reused, also across resumes.

    The next number is one past the largest seen in the log and in leftover in-flight markers.
    With ``reserve_dir`` (``StudyPaths.trial_ids``), each id is also reserved by an exclusive
    create of ``reserve_dir/<id>`` before it is handed out, and an id some other process reserved
    is skipped: two writers that both got into a study (a filesystem where the study lock does
    not hold) still never share an id.
    """

    def __init__(self, used: list[str], reserve_dir: Path | None = None) -> None:
        self._next: dict[str, int] = {}
        self.reserve_dir = reserve_dir
        for tid in used:
            m = _ID.match(tid)
            if m:
                n = int(m.group("n"))
                self._next[m.group("stage")] = max(self._next.get(m.group("stage"), 0), n + 1)

    def new(self, stage: str) -> str:
        n = self._next.get(stage, 0)
        while not self._reserve(f"{stage}-{n:04d}"):
            n += 1
        self._next[stage] = n + 1
        return f"{stage}-{n:04d}"

    def _reserve(self, trial_id: str) -> bool:
        """Create ``reserve_dir/<trial_id>`` exclusively (False: another process has it)."""
        if self.reserve_dir is None:
            return True
        path = self.reserve_dir / trial_id
        try:
            make_private_dir(self.reserve_dir)
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return False
        except OSError as e:
            raise write_error(
                self.reserve_dir.parent, path, e, f"reserve trial id {trial_id!r}"
            ) from e
        with os.fdopen(fd, "w") as f:
            f.write(f"{socket.gethostname()} {os.getpid()} {time.time():.3f}\n")
        return True


HEARTBEAT_S = 2.0
"""Seconds between two touches of an in-flight marker (its mtime is the trial's last sign of life)."""
MARKER_STALE_S = 5 * HEARTBEAT_S
"""A marker untouched this long belongs to no live trial, whoever wrote it."""


class InflightMarkers:
    """One JSON file per trial in flight. A marker left behind means the harness was killed.

    While a trial runs, a daemon thread touches its marker every ``HEARTBEAT_S``: after a kill,
    the marker's mtime (``leftovers()[i]["last_alive_at"]``) bounds how long the trial held its
    devices, so its interrupted row can count that device time instead of none."""

    def __init__(self, paths: StudyPaths) -> None:
        self.dir = paths.inflight
        self._beats: dict[str, tuple[threading.Event, threading.Thread]] = {}

    def start(self, trial_id: str, stage: str, config: dict[str, Any], world_size: int) -> None:
        """Write the marker (a ``LogError`` naming the file and the fix when it cannot be)."""
        path = self.dir / f"{trial_id}.json"
        try:
            make_private_dir(self.dir)
            write_json_atomic(
                path,
                {
                    "trial_id": trial_id,
                    "stage": stage,
                    "config": config,
                    "world_size": world_size,
                    "started_at": time.time(),
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                },
            )
        except OSError as e:
            raise write_error(self.dir.parent, path, e, f"mark trial {trial_id!r} in flight") from e
        stop = threading.Event()
        beat = threading.Thread(
            target=_heartbeat, args=(path, stop), daemon=True, name=f"infrarsi-inflight-{trial_id}"
        )
        self._beats[trial_id] = (stop, beat)
        beat.start()

    def ended(self, trial_id: str) -> None:
        """The trial released its devices: stop touching its marker (the marker stays until
        ``done``, i.e. until its row is logged)."""
        beat = self._beats.pop(trial_id, None)
        if beat is not None:
            beat[0].set()
            beat[1].join(timeout=10.0)  # a touch under way finishes before this returns

    def done(self, trial_id: str) -> None:
        """The trial's row is logged: remove its marker."""
        self.ended(trial_id)
        (self.dir / f"{trial_id}.json").unlink(missing_ok=True)

    def stop_heartbeats(self) -> None:
        """Stop every heartbeat (the harness is closing; leftover markers keep their last mtime)."""
        for trial_id in list(self._beats):
            self.ended(trial_id)

    @staticmethod
    def live_elsewhere(marker: dict[str, Any], now: float | None = None) -> bool:
        """Whether ``marker`` (a ``leftovers()`` entry) may belong to a trial still running in
        another live process: its heartbeat is fresh (``MARKER_STALE_S``) and its writer is not
        known dead (same host: its pid is gone; this very process: no trial of a closed executor
        still runs). Markers written before they named their host count as dead (as before)."""
        from infrarsi.study.processes import pid_alive

        now = time.time() if now is None else now
        if (
            not marker.get("host")
            or now - float(marker.get("last_alive_at") or 0.0) > MARKER_STALE_S
        ):
            return False
        if marker["host"] != socket.gethostname():
            return True
        pid = int(marker.get("pid") or 0)
        return pid > 0 and pid != os.getpid() and pid_alive(pid)

    def leftovers(self) -> list[dict[str, Any]]:
        """The markers on disk, each with ``last_alive_at``: its mtime (the last heartbeat)."""
        if not self.dir.exists():
            return []
        out = []
        for p in sorted(self.dir.glob("*.json")):
            try:
                mtime = p.stat().st_mtime
            except OSError:
                continue  # removed meanwhile: that trial ended
            try:
                marker = json.loads(p.read_text())
            except (OSError, json.JSONDecodeError):
                marker = {
                    "trial_id": p.stem,
                    "stage": "run",
                    "config": {},
                    "world_size": 0,
                    "started_at": mtime,
                }
            marker["last_alive_at"] = mtime
            out.append(marker)
        return out


def _heartbeat(path: Path, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_S):
        try:
            os.utime(path)
        except OSError:  # the marker is gone (the trial ended) or cannot be touched
            return
