"""The study lock: one writer per study directory.

Every stage that writes a study (doctor, run, verify, report, apply, tune, a bank feed) holds
``DIR/study.lock`` while it runs; read-only commands (``state``, ``bank query``) never take it.
The file is a JSON ``LockHolder``: host, pid, stage, start time and a heartbeat that a daemon
thread refreshes every ``HEARTBEAT_S``. A second writer is refused with ``StudyLockedError``
(exit 2) naming the holder, or waits its turn (``wait_s``; ``--wait [TIMEOUT]`` on the CLI).

Taking it is atomic: the record is written to a private temporary file and hard-linked to
``study.lock`` (``link`` fails with ``EEXIST`` when the lock exists; it is atomic on local
filesystems and on NFS, where ``O_EXCL`` was not always). A dead holder never blocks: a lock
whose holder is gone (same host: its pid no longer exists, or is a zombie, or was reused by a
younger process; any host: its heartbeat is older than ``STALE_AFTER_S``) is taken over, and the
takeover is logged with the old holder's details. Takeovers are serialised by ``flock`` on
``study.lock.guard`` where the filesystem honours it, and checked by renaming the stale file
aside and reading it back (its token must be the stale holder's) where it does not.

Shared filesystems: the lock works across machines wherever the exclusive create is atomic
(NFSv3+, CIFS, Lustre, CephFS). The heartbeat rule compares the holder's clock with the
reader's, so hosts sharing a study need clocks within ``STALE_AFTER_S`` of each other (NTP).
``filesystem_caveat`` reads ``/proc/self/mounts`` and the first acquisition on such a mount logs
what it found (NFS mounted ``nolock`` or ``local_lock=...``: ``flock`` is local to each machine;
a FUSE or network filesystem: the exclusive create may not be atomic). Where nothing holds, two
writers may both get through; trial ids still cannot collide (``TrialIds`` reserves each id with
an exclusive create in ``DIR/ids/``).

The lock is re-entrant within a process (``hold``): ``tune`` takes it once and the stages it runs
re-enter it; a forked child does not inherit it.

Why one module: taking, refreshing, waiting for and breaking the lock are one protocol on one file,
and its guarantees hold only together.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, get_args

import structlog

from infrarsi.errors import StudyLockedError
from infrarsi.study.processes import pid_alive, process_started_at

log = structlog.get_logger(__name__)

LockStage = Literal[
    "doctor", "run", "verify", "long_check", "report", "apply", "tune", "bank", "propose"
]
"""What a holder is doing (``propose``: the proposal queue's own lock, ``proposals/queue.lock``)."""

HEARTBEAT_S = 5.0
"""Seconds between two refreshes of the holder's ``heartbeat_at``."""
STALE_AFTER_S = 60.0
"""A holder whose heartbeat is older than this is taken to be dead, from any host (12 missed
heartbeats: a stalled NFS server or a loaded machine does not lose the lock)."""
POLL_S = 1.0
"""Seconds between two tries of a waiting writer."""

_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


@dataclass(frozen=True)
class LockHolder:
    """Who holds a lock: the content of the lock file."""

    host: str
    """``socket.gethostname()`` of the holder."""
    pid: int
    """The holder's process id (on ``host``)."""
    stage: str
    """The stage holding it (a ``LockStage``; kept as read from the file)."""
    started_at: float
    """When it took the lock (Unix seconds, the holder's clock)."""
    heartbeat_at: float
    """Its last heartbeat (Unix seconds, the holder's clock)."""
    token: str
    """A random id of this holding: tells it apart from a later one by the same pid."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def describe(self, now: float | None = None) -> str:
        """``run on host H, pid P, since <UTC time> (N s ago; last heartbeat M s ago)``."""
        now = time.time() if now is None else now
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started_at))
        return (
            f"`{self.stage}` on host {self.host}, pid {self.pid}, since {since} "
            f"({_ago(now - self.started_at)} ago; last heartbeat {_ago(now - self.heartbeat_at)} ago)"
        )


def _ago(seconds: float) -> str:
    s = max(0.0, seconds)
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def read_holder(path: Path) -> LockHolder | None:
    """The holder recorded in ``path`` (None: no lock). An unreadable record (a torn write by an
    older client, a disk error) reads as an unknown holder whose heartbeat is the file's mtime."""
    try:
        text = path.read_text()
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return None
    except OSError:
        text, mtime = "", time.time()
    try:
        raw = json.loads(text)
        return LockHolder(
            host=str(raw["host"]),
            pid=int(raw["pid"]),
            stage=str(raw["stage"]),
            started_at=float(raw["started_at"]),
            heartbeat_at=float(raw["heartbeat_at"]),
            token=str(raw["token"]),
        )
    except (ValueError, KeyError, TypeError):
        return LockHolder(
            host="?", pid=0, stage="?", started_at=mtime, heartbeat_at=mtime, token=""
        )


def stale_reason(
    holder: LockHolder, *, now: float | None = None, stale_after_s: float = STALE_AFTER_S
) -> str | None:
    """Why ``holder`` is dead (None: it may be alive). Same host: its pid is gone, a zombie, or
    a process younger than the holding (the pid was reused); any host: no heartbeat for more
    than ``stale_after_s``."""
    now = time.time() if now is None else now
    if holder.host == socket.gethostname() and holder.pid > 0:
        if not pid_alive(holder.pid):
            return f"its process (pid {holder.pid}) is gone on this host"
        born = process_started_at(holder.pid)
        if born is not None and born > holder.started_at + 2.0:
            return f"pid {holder.pid} now belongs to a process started after the lock was taken"
    age = now - holder.heartbeat_at
    if age > stale_after_s:
        return f"its last heartbeat is {_ago(age)} old (more than {stale_after_s:g} s)"
    return None


def filesystem_caveat(path: Path, mounts: str | None = None) -> str | None:
    """What the filesystem holding ``path`` does not guarantee for the lock (None: a local
    filesystem that honours it), from ``mounts`` (default: ``/proc/self/mounts``)."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return None
    target = str(path.resolve())
    best: tuple[str, str, str] | None = None
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > len(best[0])):
            best = (point, parts[2], parts[3])
    if best is None:
        return None
    point, fstype, opts = best
    options = set(opts.split(","))
    if fstype.startswith("nfs") and (
        "nolock" in options
        or any(o.startswith("local_lock=") and o != "local_lock=none" for o in options)
    ):
        return (
            f"{point} is {fstype} mounted with {opts}: flock is local to each machine there, so a "
            f"writer on another machine is kept out only by the exclusive create and the heartbeat "
            f"({STALE_AFTER_S:g} s)"
        )
    if fstype.startswith(("nfs", "cifs", "smb", "9p", "fuse", "ceph", "lustre", "gpfs", "beegfs")):
        return (
            f"{point} is {fstype} (a shared or network filesystem): the lock holds across machines "
            f"only where its exclusive create is atomic, and the heartbeat rule needs their clocks "
            f"within {STALE_AFTER_S:g} s"
        )
    return None


_CAVEATS_LOGGED: set[str] = set()


class StudyLock:
    """An exclusive lock file with a heartbeat (``acquire``, ``release``). ``what`` names what it
    guards in messages (``study``, ``proposal queue``)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        stage: LockStage,
        *,
        what: str = "study",
        stale_after_s: float = STALE_AFTER_S,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        if stage not in get_args(LockStage):
            raise ValueError(f"stage {stage!r} is not one of {get_args(LockStage)}")
        self.path = Path(path)
        self.stage = stage
        self.what = what
        self.stale_after_s = stale_after_s
        self.heartbeat_s = heartbeat_s
        self.holder: LockHolder | None = None
        """This holding, while held."""
        self.took_over: LockHolder | None = None
        """The dead holder this one took the lock from, if any."""
        self.lost = False
        """True when another process took the lock over while this one held it (this process
        stalled past ``stale_after_s``); logged as an error."""
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    # ------------------------------------------------------------------ taking it
    def acquire(self, wait_s: float | None = None) -> LockHolder:
        """Take the lock. ``wait_s``: None refuses at once when a live process holds it
        (``StudyLockedError``); a number waits that many seconds at most (``math.inf``: as long
        as it takes)."""
        self._log_caveat()
        t0 = time.monotonic()
        announced = False
        while True:
            try:
                created = self._create()
            except OSError as e:  # an unwritable or full study directory: say which, and the fix
                from infrarsi.study.paths import write_error

                raise write_error(
                    self.path.parent, self.path, e, f"take the {self.what} lock"
                ) from e
            if created:
                return self._held()
            other = read_holder(self.path)
            if other is None:
                continue  # released meanwhile
            reason = stale_reason(other, stale_after_s=self.stale_after_s)
            if reason is not None:
                if self._take_over(other, reason):
                    return self._held()
                continue
            waited = time.monotonic() - t0
            if wait_s is None or waited >= wait_s:
                raise StudyLockedError(
                    self._refusal(other, waited if wait_s is not None else None),
                    holder=other,
                    path=self.path,
                )
            if not announced:
                log.info(
                    "study_lock.waiting",
                    lock=str(self.path),
                    holder=other.to_dict(),
                    wait_s=None if math.isinf(wait_s) else wait_s,
                )
                announced = True
            time.sleep(max(0.0, min(POLL_S, wait_s - waited)))

    def _record(self, now: float) -> LockHolder:
        if self.holder is None:
            return LockHolder(
                host=socket.gethostname(),
                pid=os.getpid(),
                stage=self.stage,
                started_at=now,
                heartbeat_at=now,
                token=uuid.uuid4().hex,
            )
        return LockHolder(**{**self.holder.to_dict(), "heartbeat_at": now})  # type: ignore[arg-type]

    def _create(self) -> bool:
        """Publish a fresh record at ``path`` if nothing is there (hard link of a complete temp file)."""
        mine = self._record(time.time())
        tmp = self.path.with_name(f"{self.path.name}.{mine.token}.tmp")
        try:
            tmp.write_text(json.dumps(mine.to_dict(), sort_keys=True))
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                return False
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                return self._create_excl(mine)  # a filesystem without hard links
        finally:
            tmp.unlink(missing_ok=True)
        self.holder = mine
        return True

    def _create_excl(self, mine: LockHolder) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(mine.to_dict(), sort_keys=True))
            f.flush()
            os.fsync(f.fileno())
        self.holder = mine
        return True

    def _take_over(self, stale: LockHolder, reason: str) -> bool:
        """Replace the dead holder ``stale``'s lock with this one (False: the lock changed
        meanwhile; the caller looks again)."""
        with self._guard():
            aside = self.path.with_name(f"{self.path.name}.stale-{uuid.uuid4().hex}")
            try:
                os.rename(self.path, aside)
            except FileNotFoundError:
                return False
            moved = read_holder(aside)
            if moved is None or moved.token != stale.token:  # a live holder's lock: put it back
                with contextlib.suppress(OSError):
                    os.link(aside, self.path)
                aside.unlink(missing_ok=True)
                return False
            aside.unlink(missing_ok=True)
            if not self._create():
                return False
        self.took_over = stale
        log.warning(
            "study_lock.taken_over",
            lock=str(self.path),
            what=self.what,
            reason=reason,
            old_host=stale.host,
            old_pid=stale.pid,
            old_stage=stale.stage,
            old_started_at=stale.started_at,
            old_heartbeat_at=stale.heartbeat_at,
            new_stage=self.stage,
            new_pid=os.getpid(),
        )
        return True

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """``flock`` on ``<lock>.guard`` around a takeover, where the filesystem honours it."""
        import fcntl

        guard = self.path.with_name(self.path.name + ".guard")
        fd = os.open(guard, os.O_CREAT | os.O_RDWR, 0o600)
        locked = False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                locked = True
            except OSError as e:
                if e.errno not in _NO_LOCKS:
                    raise
                log.warning(
                    "study_lock.flock_unsupported",
                    lock=str(guard),
                    error=str(e),
                    note="takeovers are checked by rename and read-back instead",
                )
            yield
        finally:
            if locked:
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _held(self) -> LockHolder:
        if self.holder is None:  # pragma: no cover - _create sets it before this is called
            raise RuntimeError("study lock: _held without a holder")
        self._stop.clear()
        self._beat = threading.Thread(
            target=self._heartbeat, daemon=True, name=f"infrarsi-lock-{self.stage}"
        )
        self._beat.start()
        return self.holder

    def _refusal(self, other: LockHolder, waited: float | None) -> str:
        study = self.path.parent if self.what == "study" else self.path
        head = f"waited {_ago(waited)}, and " if waited is not None else ""
        return (
            f"{self.path}: {head}the {self.what} is held by {other.describe()}. Rule: one writer per "
            f"{self.what} at a time (this `{self.stage}` would be a second). Fix: run it again with "
            f"`--wait` to queue behind the holder (`--wait 30m` gives up after 30 minutes), or stop "
            f"the other one (`kill {other.pid}` on {other.host}). A holder that died never blocks: "
            f"it is taken over at once on its own host, and from any host once its heartbeat is "
            f"{self.stale_after_s:g} s old. Reading the study needs no lock "
            f"(`infrarsi state {study}`)."
        )

    def _log_caveat(self) -> None:
        caveat = filesystem_caveat(self.path.parent)
        if caveat and caveat not in _CAVEATS_LOGGED:
            _CAVEATS_LOGGED.add(caveat)
            log.warning("study_lock.shared_filesystem", lock=str(self.path), caveat=caveat)

    # ------------------------------------------------------------------ holding it
    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            if not self.beat():
                return

    def beat(self) -> bool:
        """Refresh ``heartbeat_at`` (False, and ``lost`` set, when the lock is no longer ours)."""
        if self.holder is None:
            return False
        current = read_holder(self.path)
        if current is None or current.token != self.holder.token:
            self._lost(current)
            return False
        fresh = self._record(time.time())
        tmp = self.path.with_name(f"{self.path.name}.{fresh.token}.beat")
        try:
            tmp.write_text(json.dumps(fresh.to_dict(), sort_keys=True))
            os.replace(tmp, self.path)
        except OSError as e:  # a full disk: the next beat tries again
            log.warning("study_lock.heartbeat_failed", lock=str(self.path), error=str(e))
            tmp.unlink(missing_ok=True)
            return True
        self.holder = fresh
        return True

    def _lost(self, current: LockHolder | None) -> None:
        """Mark the lock lost and log who holds it now (another process took it over: this one
        stalled past the heartbeat timeout)."""
        self.lost = True
        log.error(
            "study_lock.lost",
            lock=str(self.path),
            stage=self.stage,
            pid=os.getpid(),
            now_held_by=current.to_dict() if current else None,
            note="another process took the lock over (this one stalled past the heartbeat timeout)",
        )

    def release(self) -> None:
        """Stop the heartbeat and remove the lock file (if it is still ours)."""
        self._stop.set()
        if self._beat is not None and self._beat is not threading.current_thread():
            self._beat.join(timeout=10.0)
        self._beat = None
        if self.holder is None:
            return
        with self._guard():
            current = read_holder(self.path)
            if current is not None and current.token == self.holder.token:
                self.path.unlink(missing_ok=True)
            elif not self.lost:
                self._lost(current)
        self.holder = None


@dataclass
class _Held:
    lock: StudyLock
    pid: int
    depth: int = 1


_HELD: dict[str, _Held] = {}
_HELD_GUARD = threading.Lock()


@contextlib.contextmanager
def hold(
    path: str | os.PathLike[str],
    stage: LockStage,
    *,
    wait_s: float | None = None,
    what: str = "study",
) -> Iterator[StudyLock]:
    """Hold the lock file ``path`` for the ``with`` block; re-entrant within this process (a nested
    ``hold`` of the same file returns the outer holding, whose stage stays recorded)."""
    key = str(Path(path).resolve())
    with _HELD_GUARD:
        held = _HELD.get(key)
        if held is not None and held.pid == os.getpid():
            held.depth += 1
        else:
            held = None
    if held is not None:
        try:
            yield held.lock
        finally:
            with _HELD_GUARD:
                held.depth -= 1
        return
    lock = StudyLock(path, stage, what=what)
    lock.acquire(wait_s)
    with _HELD_GUARD:
        _HELD[key] = _Held(lock, os.getpid())
    try:
        yield lock
    finally:
        with _HELD_GUARD:
            _HELD.pop(key, None)
        lock.release()


def hold_study(
    study_dir: str | os.PathLike[str], stage: LockStage, *, wait_s: float | None = None
) -> contextlib.AbstractContextManager[StudyLock | None]:
    """Hold ``DIR/study.lock`` as ``stage`` (see ``hold``). A directory that does not exist holds
    nothing to protect: the block runs without a lock (yielding None), and the stage says what
    is missing in its own words."""
    from infrarsi.study.paths import StudyPaths

    paths = StudyPaths(Path(study_dir))
    if not paths.root.is_dir():
        return contextlib.nullcontext(None)
    return hold(paths.lock, stage, wait_s=wait_s)


def holder_of(study_dir: str | os.PathLike[str]) -> LockHolder | None:
    """Who holds the study now, for read-only callers (None: nobody, or a dead holder's file)."""
    from infrarsi.study.paths import StudyPaths

    h = read_holder(StudyPaths(Path(study_dir)).lock)
    return h if h is not None and stale_reason(h) is None else None


__all__ = [
    "HEARTBEAT_S",
    "STALE_AFTER_S",
    "LockHolder",
    "LockStage",
    "StudyLock",
    "filesystem_caveat",
    "hold",
    "hold_study",
    "holder_of",
    "read_holder",
    "stale_reason",
]
