"""A knob added from outside the package (``test_grad_clip``), for the spawned ranks of a real trial.

tests/execution/test_rank_loop.py has its ranks import this module (``run_specs(knob_modules=...)``)
so that a knob registered by one function outside ``infrarsi`` reaches a real DeepSpeed engine's
config; the unit-level check (a YAML entry plus a function registered in the test) is
tests/execution/knobs/test_deepspeed.py.
"""

from __future__ import annotations

from typing import Any

from infrarsi.execution.knobs.registry import KnobContext, TrialBuild, one_of, register_knob

KNOB = "test_grad_clip"
"""Name of the knob."""


@register_knob(KNOB, values=one_of(0.0, 1.0e6), default=0.0)
def grad_clip(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """Clips the global gradient norm at this value (0: off). Sets ``gradient_clipping``."""
    build.ds_config["gradient_clipping"] = float(value)
