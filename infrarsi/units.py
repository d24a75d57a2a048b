"""Parsing of sizes (``512MiB``, ``80GB``) and durations (``90s``, ``10m``) given on the CLI or in YAML."""

from __future__ import annotations

import math
import re

from infrarsi.errors import ConfigError

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_DURATION_UNITS = {"": 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_NUM = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int | float, *, what: str = "size", unit_required: bool = False) -> int:
    """Return a size in bytes. Accepts ints/floats (bytes) and strings with units.

    Decimal units (``KB``, ``MB``, ``GB``) are powers of 1000; binary units (``KiB``, ``MiB``,
    ``GiB``, and bare ``K``/``M``/``G``) are powers of 1024. ``unit_required`` (the CLI's flags)
    refuses a string without a unit: ``--memory-capacity 160`` is far more likely a slip for
    160MiB or 160GB than 160 bytes. Numbers (the Python API) are always bytes.
    """
    if isinstance(text, bool):
        raise ConfigError(f"{what}: expected a size such as 512MiB or 80GB, but got {text!r}.")
    if isinstance(text, (int, float)):
        value = float(text)
        unit = ""
    else:
        m = _NUM.match(str(text))
        if not m or m.group(2).lower() not in _SIZE_UNITS:
            raise ConfigError(
                f"{what}: {text!r} is not a size. Use a number with an optional unit "
                f"(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 512MiB or 80GB."
            )
        value, unit = float(m.group(1)), m.group(2).lower()
        if unit_required and not unit:
            n = m.group(1)
            raise ConfigError(
                f"{what}: {text!r} has no unit; rule: a size names its unit (B, KB, MB, GB, TB, KiB, "
                f"MiB, GiB, TiB). Fix: {what} {n}MiB? {what} {n}GB? ({n}B if you mean bytes)."
            )
    scaled = value * _SIZE_UNITS[unit]
    if not math.isfinite(scaled):
        raise ConfigError(
            f"{what}: a size must be a finite number of bytes, but got {text!r}. "
            f"Fix: e.g. 512MiB or 80GB."
        )
    nbytes = int(scaled)
    if nbytes <= 0:
        raise ConfigError(f"{what}: a size must be positive, but got {text!r}.")
    return nbytes


def parse_duration(text: str | int | float, *, what: str = "duration") -> float:
    """Return a duration in seconds. Accepts numbers (seconds) and ``90s``, ``10m``, ``2h``."""
    if isinstance(text, bool):
        raise ConfigError(f"{what}: expected a duration such as 90s or 10m, but got {text!r}.")
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        m = _NUM.match(str(text))
        if not m or m.group(2).lower() not in _DURATION_UNITS:
            raise ConfigError(
                f"{what}: {text!r} is not a duration. Use a number with an optional unit "
                f"(s, m, h, d), e.g. 90s or 10m."
            )
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2).lower()]
    if not math.isfinite(seconds):
        raise ConfigError(
            f"{what}: a duration must be a finite number of seconds, but got {text!r}. "
            f"Fix: e.g. 90s or 10m."
        )
    if seconds <= 0:
        raise ConfigError(f"{what}: a duration must be positive, but got {text!r}.")
    return seconds


def format_bytes(nbytes: float | None) -> str:
    """Human-readable binary size, e.g. ``1.50 GiB``; ``-`` for None."""
    if nbytes is None:
        return "-"
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"
