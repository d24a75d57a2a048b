"""Knob handlers: the registry, and the built-in handlers it holds once this package is imported.

``registry`` defines ``register_knob`` (a knob's one declaration: handler, values, default,
memory tag, ``after=`` order, process environment and documentation line), ``KnobContext``,
``TrialBuild`` and the checks (``check_handlers``, ``check_space``); ``deepspeed`` registers the
built-in DeepSpeed and runtime knobs, ``code_patch`` the ``code_patch`` knob, ``loss_chunk`` the
``loss_chunk_tokens`` knob (the harness's chunked cross-entropy), ``fused_loss`` the
``fused_loss_tokens`` knob (the output projection and loss fused), ``attention`` the
``attention_backend`` knob (the SDPA kernel); ``docs`` writes docs/KNOBS.md
from the registry. Importing ``infrarsi.execution.knobs`` (or any of its modules) fills the registry.
"""

from __future__ import annotations

from infrarsi.execution.knobs import (
    attention,
    code_patch,
    deepspeed,
    float8,
    fused_loss,
    loss_chunk,
)
from infrarsi.execution.knobs.registry import (
    KNOB_HANDLERS,
    KNOBS,
    KnobContext,
    KnobHandler,
    KnobSpec,
    KnobValues,
    TrialBuild,
    boolean,
    check_handlers,
    check_space,
    checked_by,
    different_arithmetic_knobs,
    either,
    handler_order,
    integer,
    knob_defaults,
    one_of,
    register_knob,
    unregister_knob,
)

__all__ = [
    "KNOBS",
    "KNOB_HANDLERS",
    "KnobContext",
    "KnobHandler",
    "KnobSpec",
    "KnobValues",
    "TrialBuild",
    "attention",
    "boolean",
    "check_handlers",
    "check_space",
    "checked_by",
    "code_patch",
    "deepspeed",
    "different_arithmetic_knobs",
    "either",
    "float8",
    "fused_loss",
    "handler_order",
    "integer",
    "knob_defaults",
    "loss_chunk",
    "one_of",
    "register_knob",
    "unregister_knob",
]
