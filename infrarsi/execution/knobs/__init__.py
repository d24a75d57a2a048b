"""Knob handlers: the registry, and the built-in handlers it holds once this package is imported.

``registry`` defines ``register_knob``, ``KnobContext``, ``TrialBuild`` and ``check_handlers``;
``deepspeed`` registers the built-in DeepSpeed and runtime knobs, ``code_patch`` the ``code_patch``
knob, ``loss_chunk`` the ``loss_chunk_tokens`` knob (the harness's chunked cross-entropy).
Importing ``infrarsi.execution.knobs`` (or any of its modules) fills the registry.
"""

from __future__ import annotations

from infrarsi.execution.knobs import code_patch, deepspeed, loss_chunk
from infrarsi.execution.knobs.registry import (
    KNOB_HANDLERS,
    KnobContext,
    KnobHandler,
    TrialBuild,
    check_handlers,
    register_knob,
)

__all__ = [
    "KNOB_HANDLERS",
    "KnobContext",
    "KnobHandler",
    "TrialBuild",
    "check_handlers",
    "code_patch",
    "deepspeed",
    "loss_chunk",
    "register_knob",
]
