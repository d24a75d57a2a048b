"""The knob-handler registry: how a knob's value reaches the trial.

A researcher adds a knob in two places: an entry in a search-space YAML, and one function
registered here that applies the knob's value to the trial's ``TrialBuild`` (the DeepSpeed
config dict, the model build options, the runtime options, or the environment)::

    from infrarsi.execution.knobs import register_knob, TrialBuild, KnobContext

    @register_knob("gradient_clipping")
    def _gradient_clipping(value: float, build: TrialBuild, ctx: KnobContext) -> None:
        build.ds_config["gradient_clipping"] = float(value)

The registry is a plain dict keyed by knob name, filled by the decorator (the way BoTorch's
``acqf_input_constructor`` fills its registry). A duplicate name is an error, and
``check_handlers`` raises, before any trial starts, for a knob that has no handler.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from infrarsi.errors import KnobError


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


KnobHandler = Callable[[Any, TrialBuild, KnobContext], None]

KNOB_HANDLERS: dict[str, KnobHandler] = {}
"""Knob name -> handler. Filled by ``register_knob``."""

ProcessEnv = Callable[[Any], dict[str, str]]

KNOB_PROCESS_ENV: dict[str, ProcessEnv] = {}
"""Knob name -> the environment its value needs at process start (``register_knob(name,
process_env=...)``): a pure function of the value alone. The harness calls it before the trial
to decide whether the warm rank processes can be reused (another environment starts fresh ones);
the handler itself runs once, on the ranks."""


def register_knob(name: str, *, process_env: ProcessEnv | None = None) -> Callable[[KnobHandler], KnobHandler]:
    """Register ``fn`` as the handler of knob ``name``. A duplicate name raises ``KnobError``.

    ``process_env``: for a knob read at process start (``OMP_NUM_THREADS``...), the environment
    a value needs, as a pure function of the value (see ``KNOB_PROCESS_ENV``)."""

    def deco(fn: KnobHandler) -> KnobHandler:
        if name in KNOB_HANDLERS and KNOB_HANDLERS[name] is not fn:
            raise KnobError(
                f"knob {name!r} already has a handler ({KNOB_HANDLERS[name].__module__}."
                f"{KNOB_HANDLERS[name].__qualname__}); each knob has exactly one. "
                f"Rename the new knob or remove the old handler."
            )
        KNOB_HANDLERS[name] = fn
        if process_env is not None:
            KNOB_PROCESS_ENV[name] = process_env
        return fn

    return deco


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
            raise KnobError(f"knob {name!r}: value {value!r} gives no process environment: {e}") from None
    return env


def check_handlers(knob_names: Iterable[str], *, source: str = "search space") -> None:
    """Raise ``KnobError`` listing every knob in ``knob_names`` that has no registered handler."""
    missing = [n for n in knob_names if n not in KNOB_HANDLERS]
    if missing:
        raise KnobError(
            f"{source}: knob(s) {missing} have no handler. Known knobs: {sorted(KNOB_HANDLERS)}. "
            f"Register one with @infrarsi.execution.knobs.register_knob(name) (see docs/KNOBS.md, 'Adding a knob')."
        )
