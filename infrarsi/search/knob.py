"""One knob of a search space: its type, values, default, memory and speed tags and ``when`` condition."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from infrarsi.errors import SearchSpaceError
from infrarsi.search.expr import Expression, reserved_name

KNOB_TYPES = ("int", "float", "bool", "choice")
MEMORY_TAGS = ("hungry", "saver", "neutral")
KnobSpeed = Literal["faster", "slower", "neutral"]
"""A knob's speed tag (``Knob.speed``)."""
SPEED_TAGS: tuple[KnobSpeed, ...] = ("faster", "slower", "neutral")
KNOB_KEYS = ("name", "type", "values", "range", "log", "memory", "speed", "when", "default", "grid")
INT_GRID_MAX = 16
"""An int range with more values than this is searched on a grid of this many points."""
FLOAT_GRID = 9
"""A float range is searched on a grid of this many points (override per knob with ``grid: N``)."""
MAX_GRID = 1024
"""The most points ``grid: N`` may ask for."""


@dataclass(frozen=True)
class Knob:
    """A knob of the search space."""

    name: str
    """Knob name (the key of the config dict and of the knob-handler registry)."""
    type: str
    """One of ``int``, ``float``, ``bool``, ``choice``."""
    values: tuple[Any, ...]
    """The values searched, in YAML order (for ranges: the search grid)."""
    default: Any
    """The value held where the knob is inactive, and for a config that omits it."""
    memory: str = "neutral"
    """``hungry`` (values listed from least to most memory), ``saver`` (least to most saving), or ``neutral``."""
    speed: KnobSpeed = "neutral"
    """``faster`` (the step gets faster further along the values, all else equal: larger numbers,
    later choices, ``true``), ``slower`` (slower further along), or ``neutral`` (no claim). A weak
    claim: the step-time model without an analytic prior starts from it (``models.time_gp``) and
    the trials overrule it."""
    when: Expression | None = None
    """The knob exists only where this holds; elsewhere it takes ``default``."""
    lo: float | None = None
    """Lower bound of a ``range`` knob (None for explicit values)."""
    hi: float | None = None
    """Upper bound of a ``range`` knob."""
    log: bool = False
    """Whether a range (and its encoding) is on a log scale."""

    @property
    def is_range(self) -> bool:
        """True for a knob given by ``range: [lo, hi]`` instead of explicit values."""
        return self.lo is not None

    @property
    def numeric(self) -> bool:
        """True when every value is a number (not a bool or a string)."""
        return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in self.values)

    def canonical(self, value: Any, *, file: str = "<config>") -> Any:
        """Return ``value`` as the knob stores it, or raise ``SearchSpaceError``."""
        if self.type == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
            if isinstance(value, (int, float)) and value in (0, 1):
                return bool(value)
        elif self.is_range:
            assert self.lo is not None and self.hi is not None
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if self.type == "int" and float(value).is_integer():
                    value = int(value)
                    if self.lo <= value <= self.hi:
                        return value
                elif self.type == "float" and self.lo <= float(value) <= self.hi:
                    return float(value)
        else:
            for v in self.values:
                if type(v) is type(value) and v == value:
                    return v
            for v in self.values:  # 4 == 4.0, "4" for 4 (from --set knob=4)
                if isinstance(v, bool) or isinstance(value, bool):
                    continue
                if v == value or str(v) == str(value):
                    return v
        allowed = (
            f"range [{self.lo}, {self.hi}]" if self.is_range else f"one of {list(self.values)}"
        )
        raise SearchSpaceError(
            f"{file}: knob '{self.name}': rule: the value must be {allowed}; got {value!r}."
        )

    def index(self, value: Any) -> int:
        """Position of ``value`` in ``values`` (nearest grid point for a range)."""
        try:
            return self.values.index(value)
        except ValueError:
            if not self.is_range:
                raise
            t = self.to_unit(value)
            return min(range(len(self.values)), key=lambda i: abs(self.to_unit(self.values[i]) - t))

    def to_unit(self, value: Any) -> float:
        """Map a numeric value to [0, 1] (log scale where ``log`` is set)."""
        lo, hi = float(min(self.values)), float(max(self.values))
        if self.is_range:
            assert self.lo is not None and self.hi is not None
            lo, hi = float(self.lo), float(self.hi)
        x = float(value)
        if self.log:
            lo, hi, x = math.log(lo), math.log(hi), math.log(x)
        return 0.0 if hi == lo else (x - lo) / (hi - lo)


def _grid(kind: str, lo: float, hi: float, log: bool, n: int) -> tuple[Any, ...]:
    if kind == "int" and hi - lo + 1 <= n:
        return tuple(range(int(lo), int(hi) + 1))
    pts = []
    for i in range(n):
        t = i / (n - 1)
        x = (
            math.exp(math.log(lo) + t * (math.log(hi) - math.log(lo)))
            if log
            else lo + t * (hi - lo)
        )
        x = (
            lo if i == 0 else hi if i == n - 1 else min(max(x, lo), hi)
        )  # exp(log(x)) may drift out of [lo, hi]
        pts.append(round(x) if kind == "int" else float(x))
    return tuple(dict.fromkeys(pts))


def parse_knob(raw: Any, *, file: str, position: int, known: frozenset[str]) -> Knob:
    """Build a ``Knob`` from one YAML entry; errors name the file, the knob and the rule."""
    if not isinstance(raw, dict):
        raise SearchSpaceError(
            f"{file}: knobs[{position}]: rule: each knob must be a mapping with name and type; got {raw!r}."
        )
    name = raw.get("name")
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("__"):
        raise SearchSpaceError(
            f"{file}: knobs[{position}]: rule: 'name' must be an identifier; got {name!r}. "
            f"Fix: letters, digits and '_', e.g. micro_batch_size."
        )
    if reserved_name(name):
        raise SearchSpaceError(
            f"{file}: knobs[{position}]: rule: 'name' may not be a Python keyword or a literal "
            f"of the expression grammar (true, false); got {name!r}. Fix: rename the knob."
        )

    def err(rule: str) -> SearchSpaceError:
        return SearchSpaceError(f"{file}: knob '{name}': rule: {rule}")

    unknown = sorted(set(raw) - set(KNOB_KEYS), key=repr)
    if unknown:
        raise err(f"unknown key(s) {unknown}. Valid keys: {list(KNOB_KEYS)}.")
    kind = raw.get("type")
    if kind not in KNOB_TYPES:
        raise err(f"'type' must be one of {list(KNOB_TYPES)}; got {kind!r}.")
    memory = raw.get("memory", "neutral")
    if memory not in MEMORY_TAGS:
        raise err(f"'memory' must be one of {list(MEMORY_TAGS)}; got {memory!r}.")
    speed = raw.get("speed", "neutral")
    if speed not in SPEED_TAGS:
        raise err(f"'speed' must be one of {list(SPEED_TAGS)}; got {speed!r}.")
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise err(f"'log' must be true or false; got {log!r}.")
    if "grid" in raw and "range" not in raw:
        raise err("'grid' sets the points of a 'range'; this knob has none. Fix: remove 'grid'.")
    lo = hi = None
    if kind == "bool":
        if log:
            raise err("'log' needs a numeric knob; a bool knob takes none.")
        if "values" in raw or "range" in raw:
            raise err("a bool knob takes no 'values' or 'range' (its values are false, true).")
        values: tuple[Any, ...] = (False, True)
    elif "range" in raw:
        if kind not in ("int", "float") or "values" in raw:
            raise err("'range' is for int/float knobs, and excludes 'values'.")
        rng = raw["range"]
        if (
            not isinstance(rng, list)
            or len(rng) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in rng)
        ):
            raise err(f"'range' must be [lo, hi] with numbers; got {rng!r}.")
        if not all(math.isfinite(v) for v in rng):
            raise err(f"'range' bounds must be finite numbers; got {rng!r}.")
        lo, hi = float(rng[0]), float(rng[1])
        if kind == "int" and not (lo.is_integer() and hi.is_integer()):
            raise err(f"an int range needs integer bounds; got {rng!r}.")
        if not lo < hi:
            raise err(f"`lo < hi` must hold, but got (lo={rng[0]}, hi={rng[1]}).")
        if log and lo <= 0:
            raise err(f"a log range needs lo > 0; got lo={rng[0]}.")
        n = raw.get("grid", INT_GRID_MAX if kind == "int" else FLOAT_GRID)
        if not isinstance(n, int) or isinstance(n, bool) or not 2 <= n <= MAX_GRID:
            raise err(f"'grid' must be an int from 2 to {MAX_GRID}; got {n!r}.")
        if not math.isfinite(hi - lo):
            raise err(f"'range' is too wide: hi - lo must be a finite number; got {rng!r}.")
        values = _grid(kind, lo, hi, log, n)
    else:
        vals = raw.get("values")
        if not isinstance(vals, list) or not vals:
            raise err(
                "int/float/choice knobs need a non-empty 'values' list (or 'range: [lo, hi]' for int/float)."
            )
        for v in vals:
            if not isinstance(v, (bool, int, float, str)):
                raise err(
                    f"values must be numbers, strings or booleans; got {v!r} ({type(v).__name__}). "
                    f"Fix: quote it to make it a string."
                )
            if isinstance(v, float) and not math.isfinite(v):
                raise err(f"values must be finite; got {v!r}.")
            if kind == "int" and (isinstance(v, bool) or not isinstance(v, int)):
                raise err(f"an int knob's values must be integers; got {v!r}.")
            if kind == "float" and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise err(f"a float knob's values must be numbers; got {v!r}.")
        values = tuple(float(v) for v in vals) if kind == "float" else tuple(vals)
        for i, v in enumerate(values):
            same = [w for w in values[i + 1 :] if w == v]
            if same:  # == as the expressions compare: 1 == 1.0 and true == 1
                raise err(
                    f"values must be distinct (as expressions compare them: 1 == 1.0, true == 1); "
                    f"{v!r} and {same[0]!r} are equal in {list(vals)}."
                )
        if log and (kind not in ("int", "float") or min(values) <= 0):
            raise err("'log' needs a numeric knob with positive values.")
    when = None
    if raw.get("when") is not None:
        when = Expression.parse(raw["when"], known=known, file=file, knob=name)
        if name in when.names:
            raise err(f"'when' may not refer to the knob itself ({raw['when']!r}).")
    knob = Knob(
        name=name,
        type=kind,
        values=values,
        default=values[0],
        memory=memory,
        speed=speed,
        when=when,
        lo=lo,
        hi=hi,
        log=log,
    )
    if "default" in raw:
        try:
            default = knob.canonical(raw["default"], file=file)
        except SearchSpaceError:
            raise err(
                f"'default' must be one of the knob's values {list(values)}; got {raw['default']!r}."
            ) from None
        if knob.is_range and default not in values:
            values = tuple(sorted({*values, default}))
        knob = Knob(
            name=name,
            type=kind,
            values=values,
            default=default,
            memory=memory,
            speed=speed,
            when=when,
            lo=lo,
            hi=hi,
            log=log,
        )
    elif kind == "int" and lo is not None:
        knob = Knob(
            name=name,
            type=kind,
            values=values,
            default=int(lo),
            memory=memory,
            speed=speed,
            when=when,
            lo=lo,
            hi=hi,
            log=log,
        )
    return knob
