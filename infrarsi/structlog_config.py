"""structlog set-up: quiet terminal, full record in the study, JSON lines or text on stderr.

Log lines go to stderr so that stdout stays for results (tables, JSON). The terminal shows
warnings and errors only unless ``verbose`` (the CLI's ``-v``), which shows every event at the
level asked. Every event at that level also goes, as one JSON object per line, to the study's
log file (``DIR/logs/infrarsi.jsonl``, ``attach_study_log``) and to the listeners that drive the
CLI's progress bars (``add_listener``). Library code gets its logger with
``infrarsi.structlog_config.get_logger(__name__)``.
"""

from __future__ import annotations

import json
import logging as _stdlib_logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from infrarsi.errors import ConfigError
from infrarsi.study.paths import STUDY_LOG, StudyPaths

LOG_FORMATS = ("text", "json")
"""Accepted values of ``--log-format``."""
_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
_PENDING_MAX = 10_000
"""Events a study log holds in memory until its study exists (``init`` creates it)."""

Listener = Callable[[dict[str, Any]], None]


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time of the call (test runners swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class StudyLog:
    """The JSON-lines log file of one study directory, opened once the study exists.

    Events logged before ``contract.yaml`` exists (``tune`` logs before ``init`` wrote it) wait
    in memory and are written when it does; a directory that never becomes a study gets nothing.
    Each line is one ``os.write`` to a file opened with ``O_APPEND``, so the driver and the run
    stage's executor actor can share the file without tearing lines.
    """

    def __init__(self, study_dir: str | Path) -> None:
        self.study_dir = Path(study_dir).resolve()
        """The study directory (its ``contract.yaml`` marks it as a study)."""
        self.path = StudyPaths(self.study_dir).study_log
        """The log file: ``DIR/logs/infrarsi.jsonl``."""
        self._fd: int | None = None
        self._pending: list[bytes] = []
        self.users = 0
        """``attach_study_log`` calls not yet detached (the sink closes at zero)."""

    def _open(self) -> int | None:
        if self._fd is None and (StudyPaths(self.study_dir).contract).is_file():
            self.path.parent.mkdir(mode=0o700, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            for line in self._pending:
                os.write(self._fd, line)
            self._pending.clear()
        return self._fd

    def write(self, event: dict[str, Any]) -> None:
        """Append ``event`` as one JSON line (kept in memory until the study exists)."""
        line = (json.dumps(event, default=str) + "\n").encode()
        fd = self._open()
        if fd is not None:
            os.write(fd, line)
        elif len(self._pending) < _PENDING_MAX:
            self._pending.append(line)

    def close(self) -> None:
        """Write what waits (when the study now exists) and close the file."""
        self._open()
        self._pending.clear()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass
class _LogState:
    """What the processors read: the levels in force, the open study logs and the listeners."""

    fmt: str = "text"
    """Console rendering: ``text`` or ``json``."""
    level: int = 20
    """Lowest level recorded anywhere (the study log, the listeners)."""
    verbose: bool = True
    """Whether the terminal shows events below warning (the CLI's ``-v``; the library default)."""
    study_logs: list[StudyLog] = field(default_factory=list)
    """Study log files every event is appended to."""
    listeners: list[Listener] = field(default_factory=list)
    """Callables given every event (the CLI's progress bars)."""

    @property
    def console_level(self) -> int:
        """Lowest level shown on the terminal."""
        return self.level if self.verbose else max(self.level, _LEVELS["warning"])


_STATE = _LogState()


def _fan_out(_logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """Give the event to the study logs and the listeners, then let the console filter it."""
    if _STATE.study_logs or _STATE.listeners:
        record = dict(structlog.processors.format_exc_info(None, "", dict(event_dict)))
        for sink in list(_STATE.study_logs):
            try:
                sink.write(record)
            except OSError:  # a full or read-only disk never fails the stage that logs
                _STATE.study_logs.remove(sink)
        for listener in list(_STATE.listeners):
            listener(record)
    if _LEVELS.get(str(event_dict.get("level")), 20) < _STATE.console_level:
        raise structlog.DropEvent
    return event_dict


def configure_logging(
    fmt: str = "text", level: str = "info", *, verbose: bool | None = None
) -> None:
    """Configure structlog for the whole process. ``fmt`` is ``text`` or ``json``; ``verbose``
    (None: as before) shows events below warning on the terminal too."""
    if fmt not in LOG_FORMATS:
        raise ConfigError(
            f"--log-format: {fmt!r} is not a log format; use one of {list(LOG_FORMATS)}."
        )
    if level.lower() not in _LEVELS:
        raise ConfigError(f"--log-level: {level!r} is not a level; use one of {sorted(_LEVELS)}.")
    _STATE.fmt, _STATE.level = fmt, _LEVELS[level.lower()]
    if verbose is not None:
        _STATE.verbose = verbose
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _fan_out,
    ]
    if fmt == "json":
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_STATE.level),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    # Chatty libraries that log through the standard library: warnings with -v, errors without.
    quiet_floor = _LEVELS["warning"] if _STATE.verbose else _LEVELS["error"]
    for name in ("ray", "deepspeed", "torch"):
        _stdlib_logging.getLogger(name).setLevel(max(_STATE.level, quiet_floor))


def is_verbose() -> bool:
    """Whether the terminal shows every event (``-v``), not only warnings and errors."""
    return _STATE.verbose


@contextmanager
def study_log(study_dir: str | Path) -> Iterator[StudyLog]:
    """Append every event logged inside the block to ``DIR/logs/infrarsi.jsonl``."""
    sink = attach_study_log(study_dir)
    try:
        yield sink
    finally:
        detach_study_log(sink)


def attach_study_log(study_dir: str | Path) -> StudyLog:
    """Start appending every event to ``study_dir``'s log (``detach_study_log`` stops it). Attaching
    a study already attached (the CLI, then ``tune_stage`` inside it) shares its sink: each event
    is written once."""
    if (
        _fan_out not in structlog.get_config()["processors"]
    ):  # structlog's defaults: not configured here
        configure_logging(_STATE.fmt, next(k for k, v in _LEVELS.items() if v == _STATE.level))
    path = StudyPaths(Path(study_dir).resolve()).study_log
    sink = next((s for s in _STATE.study_logs if s.path == path), None)
    if sink is None:
        sink = StudyLog(study_dir)
        _STATE.study_logs.append(sink)
    sink.users += 1
    return sink


def detach_study_log(sink: StudyLog) -> None:
    """Stop appending to ``sink`` and close it, once every ``attach_study_log`` of it has detached."""
    sink.users -= 1
    if sink.users > 0:
        return
    if sink in _STATE.study_logs:
        _STATE.study_logs.remove(sink)
    with suppress(OSError):  # the study's disk filled up or went read-only: the stage goes on
        sink.close()


def add_listener(listener: Listener) -> None:
    """Give ``listener`` every event from now on (before the console filter)."""
    _STATE.listeners.append(listener)


def remove_listener(listener: Listener) -> None:
    """Stop giving events to ``listener``."""
    if listener in _STATE.listeners:
        _STATE.listeners.remove(listener)


def get_logger(name: str | None = None) -> Any:
    """A structlog logger bound to ``logger=name``."""
    log = structlog.get_logger()
    return log.bind(logger=name) if name else log


__all__ = [
    "LOG_FORMATS",
    "STUDY_LOG",
    "StudyLog",
    "add_listener",
    "attach_study_log",
    "configure_logging",
    "detach_study_log",
    "get_logger",
    "is_verbose",
    "remove_listener",
    "study_log",
]
