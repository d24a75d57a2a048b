"""structlog set-up: human-readable console lines by default, JSON lines with ``--log-format json``.

Log lines go to stderr so that stdout stays for results (tables, JSON). Library code gets its
logger with ``infrarsi.structlog_config.get_logger(__name__)``.
"""

from __future__ import annotations

import logging as _stdlib_logging
import sys
from typing import Any

import structlog

from infrarsi.errors import ConfigError

LOG_FORMATS = ("text", "json")
"""Accepted values of ``--log-format``."""
_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time of the call (test runners swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(fmt: str = "text", level: str = "info") -> None:
    """Configure structlog for the whole process. ``fmt`` is ``text`` or ``json``."""
    if fmt not in LOG_FORMATS:
        raise ConfigError(f"--log-format: {fmt!r} is not a log format; use one of {list(LOG_FORMATS)}.")
    if level.lower() not in _LEVELS:
        raise ConfigError(f"--log-level: {level!r} is not a level; use one of {sorted(_LEVELS)}.")
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if fmt == "json":
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level.lower()]),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    # Quieten chatty libraries that log through the standard library.
    for name in ("ray", "deepspeed", "torch"):
        _stdlib_logging.getLogger(name).setLevel(max(_LEVELS[level.lower()], 30))


def get_logger(name: str | None = None) -> Any:
    """A structlog logger bound to ``logger=name``."""
    log = structlog.get_logger()
    return log.bind(logger=name) if name else log


__all__ = ["LOG_FORMATS", "configure_logging", "get_logger"]
