"""``SearchSpace``: knobs, ``when`` conditions and constraints loaded from a YAML file or text.

A config is a dict holding every knob; an inactive knob holds its default. ``validate`` turns a
partial config into a full, valid one (or raises), ``enumerate`` lists every valid config of the
search grid (up to a cap), ``sample`` draws random valid configs and ``neighbours`` lists the
valid configs one knob-step away.

Constraints are evaluated in YAML order with short-circuit, and a constraint that cannot be
evaluated for a config (division or modulo by zero, type error...) counts as violated for that
config; enumeration, sampling, neighbours, ``validate`` and pairing all go through ``violated``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from infrarsi.errors import ExpressionError, ExpressionEvaluationError, SearchSpaceError
from infrarsi.search.expr import Expression
from infrarsi.search.knob import Knob, parse_knob

TOP_KEYS = ("name", "objective", "knobs", "constraints", "description")
OBJECTIVES = ("step_time",)
ENUMERATION_LIMIT = 200_000
"""Spaces with more valid configs than this are not enumerated (search falls back to sampling)."""


@dataclass
class SearchSpace:
    """A search space: knobs in YAML order, ``when`` conditions and constraints."""

    name: str
    """The space's name."""
    knobs: list[Knob]
    """The knobs, in YAML order (the order of config dicts)."""
    constraints: list[Expression] = field(default_factory=list)
    """Every valid config satisfies all of these."""
    objective: str = "step_time"
    """What is minimised (seconds per optimizer step)."""
    file: str = "<text>"
    """Where the YAML came from (for error messages)."""
    source: str = ""
    """The YAML text (so an optimizer's saved state can rebuild the space)."""
    _order: list[int] = field(default_factory=list, repr=False)
    _enumerated: list[tuple[Any, ...]] | None = field(default=None, repr=False)
    _enumeration_done: bool = field(default=False, repr=False)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_yaml(cls, source: str | Path) -> SearchSpace:
        """Load from a YAML file path or from YAML text."""
        file = "<text>"
        text = str(source)
        if isinstance(source, Path) or (
            "\n" not in text and (text.endswith((".yaml", ".yml")) or Path(text).is_file())
        ):
            path = Path(source)
            if not path.is_file():
                raise SearchSpaceError(
                    f"{path}: rule: the search-space file must exist (and be a file). "
                    f"Fix: check the path."
                )
            try:
                file, text = str(path), path.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise SearchSpaceError(
                    f"{path}: rule: must be readable UTF-8 YAML text ({exc})."
                ) from None
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SearchSpaceError(f"{file}: rule: must be valid YAML ({exc}).") from None
        return cls.from_dict(raw, file=file, source=text)

    @classmethod
    def from_dict(cls, raw: Any, *, file: str = "<dict>", source: str | None = None) -> SearchSpace:
        """Build from a parsed YAML mapping."""
        if not isinstance(raw, dict):
            raise SearchSpaceError(
                f"{file}: rule: a search space must be a mapping with 'name' and 'knobs'."
            )
        unknown = sorted(set(raw) - set(TOP_KEYS), key=repr)
        if unknown:
            raise SearchSpaceError(
                f"{file}: rule: unknown top-level key(s) {unknown}. Valid keys: {list(TOP_KEYS)}."
            )
        for key in ("name", "description"):
            if key in raw and not isinstance(raw[key], str):
                raise SearchSpaceError(
                    f"{file}: {key!r}: rule: must be a string; got {raw[key]!r}. Fix: quote it."
                )
        objective = raw.get("objective", "step_time")
        if objective not in OBJECTIVES:
            raise SearchSpaceError(
                f"{file}: 'objective': rule: must be one of {list(OBJECTIVES)}; got {objective!r}."
            )
        raw_knobs = raw.get("knobs")
        if not isinstance(raw_knobs, list) or not raw_knobs:
            raise SearchSpaceError(f"{file}: 'knobs': rule: must be a non-empty list of knobs.")
        names = [k.get("name") if isinstance(k, dict) else None for k in raw_knobs]
        dup = sorted({n for n in names if isinstance(n, str) and names.count(n) > 1})
        if dup:
            raise SearchSpaceError(f"{file}: knob '{dup[0]}': rule: knob names must be unique.")
        known = frozenset(n for n in names if isinstance(n, str))
        knobs = [parse_knob(k, file=file, position=i, known=known) for i, k in enumerate(raw_knobs)]
        raw_cons = raw.get("constraints") or []
        if not isinstance(raw_cons, list):
            raise SearchSpaceError(f"{file}: 'constraints': rule: must be a list of expressions.")
        cons = [
            Expression.parse(c, known=known, file=file, knob=f"constraints[{i}]")
            for i, c in enumerate(raw_cons)
        ]
        if source is None:
            source = yaml.safe_dump(raw, sort_keys=False)
        space = cls(
            name=str(raw.get("name", "unnamed")),
            knobs=knobs,
            constraints=cons,
            objective=objective,
            file=file,
            source=source,
        )
        space._order = space._topological_order()
        # A type mismatch at the defaults ('bf16' < 3) is a mistake in the YAML: refused here. An
        # error that depends on the values (division by zero...) is not: such a constraint counts
        # as violated, and such a ``when`` as not holding, for the configs where it happens.
        env = {k.name: k.default for k in knobs}
        for knob in knobs:
            if knob.when is not None:
                _type_checked(knob.when, env)
        for c in cons:  # in YAML order, up to the first that does not hold (short-circuit)
            if not _type_checked(c, env):
                break
        return space

    def _topological_order(self) -> list[int]:
        idx = {k.name: i for i, k in enumerate(self.knobs)}
        order: list[int] = []
        state: dict[int, int] = {}

        def visit(i: int, chain: list[str]) -> None:
            if state.get(i) == 2:
                return
            if state.get(i) == 1:
                raise SearchSpaceError(
                    f"{self.file}: knob '{self.knobs[i].name}': rule: 'when' conditions may not form a cycle "
                    f"({' -> '.join([*chain, self.knobs[i].name])})."
                )
            state[i] = 1
            when = self.knobs[i].when
            for dep in sorted(when.names) if when else []:
                visit(idx[dep], [*chain, self.knobs[i].name])
            state[i] = 2
            order.append(i)

        for i in range(len(self.knobs)):
            visit(i, [])
        return order

    # ---------------------------------------------------------------- configs
    @property
    def names(self) -> list[str]:
        """Knob names in YAML order."""
        return [k.name for k in self.knobs]

    def knob(self, name: str) -> Knob:
        """The knob called ``name``."""
        for k in self.knobs:
            if k.name == name:
                return k
        raise SearchSpaceError(
            f"{self.file}: knob {name!r}: rule: must be a knob of the space. Known: {self.names}."
        )

    def default_config(self) -> dict[str, Any]:
        """Every knob at its default (may break a constraint)."""
        return self.resolve({k.name: k.default for k in self.knobs})

    def resolve(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Set inactive knobs to their defaults (config must hold every knob, canonical values)."""
        out = dict(config)
        for i in self._order:
            k = self.knobs[i]
            if not _is_active(k, out):
                out[k.name] = k.default
        return {k.name: out[k.name] for k in self.knobs}

    def active(self, config: Mapping[str, Any]) -> dict[str, bool]:
        """Knob name -> whether its ``when`` holds under the (resolved) config (a ``when`` that
        cannot be evaluated does not hold)."""
        return {k.name: _is_active(k, config) for k in self.knobs}

    def violated(self, config: Mapping[str, Any]) -> list[str]:
        """The text of the first constraint ``config`` breaks, in YAML order, or ``[]``.

        Short-circuit: later constraints are not evaluated; one that cannot be evaluated
        (division by zero, type error...) counts as broken.
        """
        first = self._first_broken(config)
        return [] if first is None else [first[0]]

    def _first_broken(self, config: Mapping[str, Any]) -> tuple[str, str | None] | None:
        """(text, evaluation error or None) of the first constraint ``config`` breaks."""
        for c in self.constraints:
            try:
                if not c.holds(config):
                    return c.text, None
            except ExpressionError as exc:
                return c.text, str(exc)
        return None

    def validate(self, config: Mapping[str, Any], *, where: str = "config") -> dict[str, Any]:
        """Return the full valid config (every knob; inactive ones at default) or raise ``SearchSpaceError``."""
        if not isinstance(config, Mapping):
            raise SearchSpaceError(
                f"{where}: rule: a config must be a mapping knob -> value; got {type(config).__name__}."
            )
        unknown = sorted(set(config) - set(self.names), key=repr)
        if unknown:
            raise SearchSpaceError(
                f"{where}: knob {unknown[0]!r}: rule: must be a knob of space '{self.name}' ({self.file}). "
                f"Known knobs: {self.names}."
            )
        full = {
            k.name: k.canonical(config[k.name], file=where) if k.name in config else k.default
            for k in self.knobs
        }
        full = self.resolve(full)
        bad = self._first_broken(full)
        if bad is not None:
            text, error = bad
            why = (
                ""
                if error is None
                else f" (it cannot be evaluated, which counts as broken: {error})"
            )
            raise SearchSpaceError(
                f"{where}: rule: the config breaks constraint {text!r} of {self.file}{why}; config {full}. "
                f"Fix: choose knob values that satisfy the constraints in YAML order."
            )
        return full

    def is_valid(self, config: Mapping[str, Any]) -> bool:
        """True when ``validate`` would accept ``config`` unchanged."""
        try:
            return self.validate(config) == dict(config)
        except SearchSpaceError:
            return False

    def restrict(self, editable: Sequence[str], baseline: Mapping[str, Any]) -> SearchSpace:
        """This space with every knob outside ``editable`` pinned to its ``baseline`` value
        (constraints and ``when`` guards kept; the source is the pinned YAML, so saves rebuild it)."""
        base = self.validate(baseline, where="baseline")
        unknown = sorted(set(editable) - set(self.names), key=repr)
        if unknown:
            raise SearchSpaceError(
                f"editable knobs: knob {unknown[0]!r}: rule: must be a knob of space "
                f"'{self.name}' ({self.file}). Known knobs: {self.names}."
            )
        raw = yaml.safe_load(self.source)
        for entry in raw["knobs"]:
            if entry["name"] in editable:
                continue
            for key in ("range", "log", "grid", "values"):
                entry.pop(key, None)
            if entry.get("type") == "bool":
                entry["type"] = "choice"
            entry["values"] = [base[entry["name"]]]
            entry["default"] = base[entry["name"]]
        return SearchSpace.from_dict(raw, file=self.file)

    def key(self, config: Mapping[str, Any]) -> str:
        """A canonical string key of a full config (JSON of the values in knob order)."""
        return json.dumps([config[n] for n in self.names])

    def as_config(self, values: Sequence[Any]) -> dict[str, Any]:
        """A config dict from values in knob order."""
        return dict(zip(self.names, values, strict=True))

    # ------------------------------------------------------------ enumeration
    def enumerate(self, limit: int = ENUMERATION_LIMIT) -> list[dict[str, Any]] | None:
        """Every valid config of the search grid, or None if there are more than ``limit``."""
        rows = self.enumerate_values(limit)
        return None if rows is None else [self.as_config(r) for r in rows]

    def enumerate_values(self, limit: int = ENUMERATION_LIMIT) -> list[tuple[Any, ...]] | None:
        """Like ``enumerate`` but as value tuples in knob order (cached)."""
        if self._enumeration_done and (self._enumerated is None or len(self._enumerated) <= limit):
            return self._enumerated
        bound = 1
        for k in self.knobs:
            bound *= len(k.values)
        if bound > 50 * limit:
            self._enumerated, self._enumeration_done = None, True
            return None
        out: list[tuple[Any, ...]] = []
        for cfg in self._dfs():
            out.append(tuple(cfg[n] for n in self.names))
            if len(out) > limit:
                self._enumerated, self._enumeration_done = None, True
                return None
        self._enumerated, self._enumeration_done = out, True
        return out

    def _dfs(self) -> Iterator[dict[str, Any]]:
        order = [self.knobs[i] for i in self._order]
        pos = {k.name: p for p, k in enumerate(order)}
        checks: dict[int, list[Expression]] = {}
        for c in self.constraints:
            last = max((pos[n] for n in c.names), default=0)
            checks.setdefault(last, []).append(c)
        cfg: dict[str, Any] = {}

        def rec(p: int) -> Iterator[dict[str, Any]]:
            if p == len(order):
                yield dict(cfg)
                return
            k = order[p]
            values = k.values if _is_active(k, cfg) else (k.default,)
            for v in values:
                cfg[k.name] = v
                if all(_holds(c, cfg) for c in checks.get(p, ())):
                    yield from rec(p + 1)
            cfg.pop(k.name, None)

        yield from rec(0)

    def size(self) -> int | None:
        """Number of valid configs of the grid, or None if too many to enumerate."""
        rows = self.enumerate_values()
        return None if rows is None else len(rows)

    # --------------------------------------------------------------- sampling
    def sample(
        self, rng: np.random.Generator, n: int = 1, max_tries: int = 200
    ) -> list[dict[str, Any]]:
        """Up to ``n`` random valid configs (uniform per knob, then rejection on constraints)."""
        out: list[dict[str, Any]] = []
        for _ in range(n * max_tries):
            cfg: dict[str, Any] = {}
            for i in self._order:
                k = self.knobs[i]
                active = _is_active(k, cfg)
                cfg[k.name] = k.values[int(rng.integers(len(k.values)))] if active else k.default
            cfg = {name: cfg[name] for name in self.names}
            if not self.violated(cfg):
                out.append(cfg)
                if len(out) == n:
                    break
        return out

    def neighbours(self, config: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Valid configs that differ from ``config`` in one active knob (dependents re-resolved)."""
        active = self.active(config)
        out: list[dict[str, Any]] = []
        seen = {self.key(config)}
        for k in self.knobs:
            if not active[k.name]:
                continue
            for v in k.values:
                if v == config[k.name] and type(v) is type(config[k.name]):
                    continue
                cand = self.resolve({**config, k.name: v})
                key = self.key(cand)
                if key not in seen and not self.violated(cand):
                    seen.add(key)
                    out.append(cand)
        return out


def knob_distance(a: Mapping[str, Any], b: Mapping[str, Any], names: Sequence[str]) -> int:
    """How many of the knobs ``names`` two configs set differently (a missing knob counts as None):
    the spread of the bank's warm starts is measured in it."""
    return sum(a.get(n) != b.get(n) for n in names)


def _holds(constraint: Expression, config: Mapping[str, Any]) -> bool:
    """True when ``constraint`` holds; one that cannot be evaluated counts as broken."""
    try:
        return constraint.holds(config)
    except ExpressionError:
        return False


def _is_active(knob: Knob, config: Mapping[str, Any]) -> bool:
    """True when ``knob`` has no ``when`` or it holds; one that cannot be evaluated does not hold."""
    if knob.when is None:
        return True
    try:
        return knob.when.holds(config)
    except ExpressionError:
        return False


def _type_checked(expr: Expression, env: Mapping[str, Any]) -> bool:
    """Whether ``expr`` holds under ``env``; re-raises a type mismatch, and counts any other
    evaluation error as not holding."""
    try:
        return expr.holds(env)
    except ExpressionEvaluationError as exc:
        if issubclass(exc.cause, TypeError):
            raise
        return False
