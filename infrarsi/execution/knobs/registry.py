"""The knob registry: each knob declared once, with how its value reaches the trial.

A researcher adds a knob in two places: an entry in a search-space YAML, and one function
registered here that applies the knob's value to the trial's ``TrialBuild`` (the DeepSpeed
config dict, the model build options, the runtime options, or the environment)::

    from infrarsi.execution.knobs import register_knob, TrialBuild, KnobContext, one_of

    @register_knob("gradient_clipping", values=one_of(0.0, 1.0), default=0.0)
    def _gradient_clipping(value: float, build: TrialBuild, ctx: KnobContext) -> None:
        '''Clips the global gradient norm. Sets ``gradient_clipping``.'''
        build.ds_config["gradient_clipping"] = float(value)

The registration is the knob's one declaration (``KnobSpec``): its handler, the values it
accepts, its default, its memory tag, its order after other knobs, the environment it needs at
process start and its documentation line (docs/KNOBS.md is generated from it:
``python -m infrarsi.execution.knobs.docs``). The registry is a plain dict keyed by knob name,
filled by the decorator (the way BoTorch's ``acqf_input_constructor`` fills its registry). A
duplicate name, a default the knob's own values reject, or an ``after=`` cycle is a
``KnobError`` at import; ``check_space`` refuses, before any trial starts, a search space with a
knob that has no handler or values its handler does not accept.
"""

from __future__ import annotations

import heapq
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from infrarsi.errors import KnobError

if TYPE_CHECKING:
    from infrarsi.search.space import SearchSpace


@dataclass
class KnobContext:
    """What a handler may read while it applies a knob."""

    world_size: int
    """Number of ranks of the trial."""
    num_params: int
    """Parameter count of the model (to size buckets to the model)."""
    hidden_size: int
    """Model hidden size (DeepSpeed's ``auto`` bucket heuristics use it)."""
    global_batch_size: int
    """Sequences per optimizer step across all ranks (fixed by the contract)."""
    seq_len: int
    """Tokens per sequence."""
    device: str
    """``cpu`` or ``cuda``."""
    config: dict[str, Any]
    """The whole knob config, for handlers whose effect depends on other knobs."""


ModelTransform = Callable[[Any, Any], object]
"""A change to the built model in place, ``(model: torch.nn.Module, shape: ModelShape)``; what it
returns is ignored."""


@dataclass
class TrialBuild:
    """Everything a trial is built from; knob handlers fill it in."""

    ds_config: dict[str, Any] = field(default_factory=dict)
    """The DeepSpeed config dict passed to ``deepspeed.initialize``."""
    model_options: dict[str, Any] = field(default_factory=dict)
    """Options of the model build (``activation_checkpointing``, ``expert_parallel``...)."""
    runtime: dict[str, Any] = field(default_factory=dict)
    """Harness options (``threads_per_worker``, ``optimizer_impl``, ``dtype``...)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables set in each rank before the engine is built."""
    model_transforms: list[ModelTransform] = field(default_factory=list)
    """Functions ``(model, shape) -> None`` applied in order to the built model (``shape``: the
    job's ``ModelShape``), before the optimizer and the engine are built, and again to the model
    a checkpoint round trip rebuilds (float8 linear layers, say)."""


KnobHandler = Callable[[Any, TrialBuild, KnobContext], None]
"""A handler: ``(value, build, ctx) -> None``, applying ``value`` to ``build``."""
ProcessEnv = Callable[[Any], dict[str, str]]
"""The environment a knob's value needs at process start: a pure function of the value alone."""
KnobArithmetic = Literal["same", "different"]
"""Whether a knob's non-default values train with the baseline's arithmetic (``same``: ZeRO
stages, micro-batch splits, kernels that compute the same sums to the dtype's rounding) or with
another one (``different``: float8 matmuls), which a study may search only when its contract
allows the knob by name (``infrarsi init --allow KNOB``)."""
KnobMemory = Literal["saver", "hungry", "neutral"]
"""A knob's memory tag, as in a search space's ``memory:`` (see ``KnobSpec.memory``)."""
MEMORY_TAGS: tuple[KnobMemory, ...] = ("saver", "hungry", "neutral")
"""Every memory tag."""
KnobSpeed = Literal["faster", "slower", "neutral"]
"""A knob's speed tag, as in a search space's ``speed:`` (see ``KnobSpec.speed``)."""
SPEED_TAGS: tuple[KnobSpeed, ...] = ("faster", "slower", "neutral")
"""Every speed tag."""


@dataclass(frozen=True)
class KnobValues:
    """The values a knob's handler accepts: the rule a search space's values are checked against."""

    text: str
    """The rule in words, for errors and docs/KNOBS.md (``one of 0, 1, 2, 3``)."""
    accepts: Callable[[Any], bool]
    """True for a value the handler can apply."""


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return bool(type(a) is type(b) and a == b) or (
        isinstance(a, (int, float)) and isinstance(b, (int, float)) and a == b
    )


def one_of(*values: Any) -> KnobValues:
    """Exactly these values (``1 == 1.0``, but a bool is never a number)."""
    text = str(values[0]) if len(values) == 1 else f"one of {', '.join(map(str, values))}"
    return KnobValues(text, lambda v: any(_same(v, w) for w in values))


def boolean() -> KnobValues:
    """``true`` or ``false``."""
    return KnobValues("true or false", lambda v: isinstance(v, bool))


def integer(lo: int | None = None, hi: int | None = None) -> KnobValues:
    """An integer (an integral float counts) within ``[lo, hi]`` where given."""
    text = (
        "an integer"
        + (f" >= {lo}" if lo is not None else "")
        + (f" <= {hi}" if hi is not None else "")
    )

    def accepts(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not float(v).is_integer():
            return False
        return (lo is None or v >= lo) and (hi is None or v <= hi)

    return KnobValues(text, accepts)


def checked_by(check: Callable[[Any], Any], text: str) -> KnobValues:
    """Whatever ``check`` accepts: it raises ``KnobError``, ``ValueError`` or ``TypeError`` otherwise."""

    def accepts(v: Any) -> bool:
        try:
            check(v)
        except (KnobError, ValueError, TypeError):
            return False
        return True

    return KnobValues(text, accepts)


def either(*rules: KnobValues) -> KnobValues:
    """A value any of ``rules`` accepts."""
    return KnobValues(
        " or ".join(r.text for r in rules), lambda v: any(r.accepts(v) for r in rules)
    )


ANY_VALUE = KnobValues("any value", lambda v: True)
"""The rule of a knob registered without ``values=``: its handler checks values itself."""


class _NoDefault:
    """The default of a knob that has none: its handler runs only for a config holding the knob."""

    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT: Any = _NoDefault()
"""Marks a knob without a default (``register_knob(default=...)`` left out)."""


@dataclass(frozen=True)
class KnobSpec:
    """One knob's declaration: everything the harness, the checks and the docs know about it."""

    name: str
    """The knob's name (the key of a config and of a search space's ``knobs:`` entry)."""
    handler: KnobHandler
    """Applies a value to the trial's ``TrialBuild``."""
    values: KnobValues = ANY_VALUE
    """The values the handler accepts; a search space's values are checked against it."""
    default: Any = NO_DEFAULT
    """The value for a config without the knob (a space's own ``default:`` wins inside that space,
    since every config it hands out holds the knob); ``NO_DEFAULT``: the handler is skipped."""
    memory: KnobMemory = "neutral"
    """``saver`` (a memory saver: more saving further down a space's values, ``true`` saves),
    ``hungry`` (more memory further down) or ``neutral`` (no claim). A space may tag the knob
    ``neutral`` (out of pairing), never the opposite way."""
    speed: KnobSpeed = "neutral"
    """``slower`` (steps slower further down a space's values, ``true`` slower, all else equal),
    ``faster`` or ``neutral`` (no claim, e.g. where it depends on the hardware). A space may tag
    the knob ``neutral`` or, where the registration makes no claim, either way; never the
    opposite way (``infrarsi.search.knob.Knob.speed``)."""
    after: tuple[str, ...] = ()
    """Knobs whose handlers run before this one (it reads what they set)."""
    process_env: ProcessEnv | None = None
    """For a knob read at process start (``OMP_NUM_THREADS``...), the environment a value needs."""
    doc: str = ""
    """One paragraph for docs/KNOBS.md: what the knob does and the keys it sets."""
    arithmetic: KnobArithmetic = "same"
    """``different`` for a knob whose values change the arithmetic (``KnobArithmetic``): a
    study's editable knobs leave it out unless its contract allows it."""

    @property
    def has_default(self) -> bool:
        """True unless registered without a default."""
        return self.default is not NO_DEFAULT


KNOBS: dict[str, KnobSpec] = {}
"""Knob name -> its declaration, in registration order. Filled by ``register_knob``."""

V = TypeVar("V")


class _SpecView(Mapping[str, V], Generic[V]):
    """A read-only view of one field of ``KNOBS`` (knobs whose field is None are left out)."""

    def __init__(self, get: Callable[[KnobSpec], V | None]) -> None:
        self._get = get

    def __getitem__(self, name: str) -> V:
        value = self._get(KNOBS[name])
        if value is None:
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return (n for n, s in KNOBS.items() if self._get(s) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


KNOB_HANDLERS: Mapping[str, KnobHandler] = _SpecView(lambda s: s.handler)
"""Knob name -> handler (a view of ``KNOBS``)."""
KNOB_PROCESS_ENV: Mapping[str, ProcessEnv] = _SpecView(lambda s: s.process_env)
"""Knob name -> the environment its value needs at process start (a view of ``KNOBS``). The
harness calls it before the trial to decide whether the warm rank processes can be reused
(another environment starts fresh ones); the handler itself runs once, on the ranks."""


def _doc_of(fn: KnobHandler) -> str:
    return " ".join((inspect.getdoc(fn) or "").split())


def register_knob(
    name: str,
    *,
    values: KnobValues = ANY_VALUE,
    default: Any = NO_DEFAULT,
    memory: KnobMemory = "neutral",
    speed: KnobSpeed = "neutral",
    after: Iterable[str] = (),
    process_env: ProcessEnv | None = None,
    doc: str | None = None,
    arithmetic: KnobArithmetic = "same",
) -> Callable[[KnobHandler], KnobHandler]:
    """Declare knob ``name`` with ``fn`` as its handler (the fields are ``KnobSpec``'s; ``doc``
    defaults to the handler's docstring). A duplicate name, a default ``values`` rejects, an
    unknown memory or speed tag or an ``after=`` cycle raises ``KnobError``."""
    after = (after,) if isinstance(after, str) else tuple(after)

    def deco(fn: KnobHandler) -> KnobHandler:
        old = KNOBS.get(name)
        if old is not None and old.handler is not fn:
            raise KnobError(
                f"knob {name!r} already has a handler ({old.handler.__module__}.{old.handler.__qualname__}); "
                f"each knob has exactly one. Rename the new knob or remove the old handler."
            )
        if memory not in MEMORY_TAGS:
            raise KnobError(
                f"register_knob({name!r}): memory={memory!r}; rule: one of {list(MEMORY_TAGS)}."
            )
        if speed not in SPEED_TAGS:
            raise KnobError(
                f"register_knob({name!r}): speed={speed!r}; rule: one of {list(SPEED_TAGS)}."
            )
        if default is not NO_DEFAULT and not values.accepts(default):
            raise KnobError(
                f"register_knob({name!r}): default {default!r} is not {values.text}; "
                f"fix: a default among the knob's own values."
            )
        if name in after:
            raise KnobError(
                f"register_knob({name!r}): after={after!r} names the knob itself; fix: remove it."
            )
        spec = KnobSpec(
            name=name,
            handler=fn,
            values=values,
            default=default,
            memory=memory,
            speed=speed,
            after=after,
            process_env=process_env,
            doc=doc if doc is not None else _doc_of(fn),
            arithmetic=arithmetic,
        )
        KNOBS[name] = spec
        try:
            handler_order()
        except KnobError:
            if old is None:
                del KNOBS[name]
            else:
                KNOBS[name] = old
            raise
        return fn

    return deco


def unregister_knob(name: str) -> None:
    """Remove knob ``name`` (a test's own knob, once the test is done); ``KnobError`` if unknown."""
    if KNOBS.pop(name, None) is None:
        raise KnobError(f"knob {name!r} is not registered; known knobs: {sorted(KNOBS)}.")


def handler_order() -> list[str]:
    """Every registered knob, each after the knobs its ``after=`` names (those registered), ties
    in registration order: the order ``build_trial`` applies handlers in. ``KnobError`` naming
    the knobs of a cycle."""
    names = list(KNOBS)
    position = {n: i for i, n in enumerate(names)}
    waiting = {n: {a for a in KNOBS[n].after if a in KNOBS} for n in names}
    users: dict[str, list[str]] = {n: [] for n in names}
    for n, deps in waiting.items():
        for d in deps:
            users[d].append(n)
    ready = [(position[n], n) for n in names if not waiting[n]]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, n = heapq.heappop(ready)
        order.append(n)
        for u in users[n]:
            waiting[u].discard(n)
            if not waiting[u]:
                heapq.heappush(ready, (position[u], u))
    if len(order) < len(names):
        stuck = {n: sorted(waiting[n]) for n in names if waiting[n]}
        raise KnobError(
            f"knob handlers' after= form a cycle among {stuck} (knob: knobs it waits for); "
            f"fix: drop one of these after= entries."
        )
    return order


def different_arithmetic_knobs(names: Iterable[str]) -> list[str]:
    """The knobs of ``names`` registered with ``arithmetic="different"``, in ``names`` order."""
    return [n for n in names if n in KNOBS and KNOBS[n].arithmetic == "different"]


def knob_defaults() -> dict[str, Any]:
    """Knob name -> registered default, for every knob that has one, in handler order."""
    return {n: KNOBS[n].default for n in handler_order() if KNOBS[n].has_default}


def process_env(config: dict[str, Any]) -> dict[str, str]:
    """The environment the rank processes of ``config`` need at start (``KNOB_PROCESS_ENV`` of
    each knob in it); a value its function rejects raises ``KnobError`` naming the knob."""
    env: dict[str, str] = {}
    for name, value in config.items():
        fn = KNOB_PROCESS_ENV.get(name)
        if fn is None:
            continue
        try:
            env.update({str(k): str(v) for k, v in fn(value).items()})
        except (TypeError, ValueError) as e:
            raise KnobError(
                f"knob {name!r}: value {value!r} gives no process environment: {e}"
            ) from None
    return env


def check_handlers(knob_names: Iterable[str], *, source: str = "search space") -> None:
    """Raise ``KnobError`` listing every knob in ``knob_names`` that has no registered handler."""
    missing = [n for n in knob_names if n not in KNOBS]
    if missing:
        raise KnobError(
            f"{source}: knob(s) {missing} have no handler. Known knobs: {sorted(KNOBS)}. "
            f"Fix: register one with @infrarsi.execution.knobs.register_knob(name) (see docs/KNOBS.md, "
            f"'Adding a knob'), or remove the knob from the space."
        )


def check_space(space: SearchSpace, *, source: str | None = None) -> None:
    """Check a search space against the registry before any trial: every knob has a handler
    (``check_handlers``), every value it searches (and its default) is one its handler accepts,
    and no knob is tagged the opposite memory or speed way from its registration. A ``KnobError`` names
    the file, each knob, the rule, the value and the fix. A space's ``default:`` may differ from
    the registered one: the space's wins for its configs (documented in docs/KNOBS.md)."""
    src = source or space.file
    check_handlers(space.names, source=src)
    problems = []
    for knob in space.knobs:
        spec = KNOBS[knob.name]
        bad = [v for v in dict.fromkeys((*knob.values, knob.default)) if not spec.values.accepts(v)]
        if bad:
            problems.append(
                f"knob {knob.name!r}: value(s) {bad} rejected by its handler; rule: {spec.values.text} "
                f"(register_knob in {spec.handler.__module__}). Fix: change the knob's values in the YAML, "
                f"or widen the handler's register_knob(values=...)."
            )
        if knob.memory != "neutral" and spec.memory != "neutral" and knob.memory != spec.memory:
            problems.append(
                f"knob {knob.name!r}: `memory: {knob.memory}` contradicts the handler's registered memory tag "
                f"{spec.memory!r}. Fix: tag it `memory: {spec.memory}` with its values ordered from the least to "
                f"the most {'saving' if spec.memory == 'saver' else 'memory-hungry'}, or `memory: neutral`."
            )
        if knob.speed != "neutral" and spec.speed != "neutral" and knob.speed != spec.speed:
            problems.append(
                f"knob {knob.name!r}: `speed: {knob.speed}` contradicts the handler's registered speed tag "
                f"{spec.speed!r}. Fix: tag it `speed: {spec.speed}` with its values ordered from the "
                f"{'fastest to the slowest' if spec.speed == 'slower' else 'slowest to the fastest'}, "
                f"or `speed: neutral`."
            )
    if problems:
        raise KnobError(f"{src}: " + " ".join(problems))


__all__ = [
    "ANY_VALUE",
    "KNOBS",
    "KNOB_HANDLERS",
    "KNOB_PROCESS_ENV",
    "MEMORY_TAGS",
    "NO_DEFAULT",
    "SPEED_TAGS",
    "KnobContext",
    "KnobHandler",
    "KnobMemory",
    "KnobSpec",
    "KnobSpeed",
    "KnobValues",
    "ProcessEnv",
    "TrialBuild",
    "boolean",
    "check_handlers",
    "check_space",
    "checked_by",
    "either",
    "handler_order",
    "integer",
    "knob_defaults",
    "one_of",
    "process_env",
    "register_knob",
    "unregister_knob",
]
