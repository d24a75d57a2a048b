"""The tolerances of a knob of another arithmetic: one record the doctor writes and the contract keeps.

A knob registered ``arithmetic="different"`` (``float8_linear``) trains with other sums, so its
candidates' losses move more than an honest change's. When a contract allows such a knob, the
doctor runs the baseline with it on and calibrates these tolerances from that trial; the contract
(``Invariants.arithmetic_tolerances``) applies them only to configs that turn the knob on, so
allowing it never loosens the check of any other candidate (a code patch, a ZeRO stage...).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ArithmeticTolerance(BaseModel):
    """The loss and eval tolerances of candidates that turn on one knob of another arithmetic."""

    model_config = ConfigDict(extra="forbid")

    loss_atol: float = Field(ge=0)
    """Absolute loss tolerance per step vs the baseline, loss units, for configs with the knob on."""
    eval_atol: float = Field(ge=0)
    """Absolute eval-loss tolerance vs the baseline, loss units, for configs with the knob on."""


__all__ = ["ArithmeticTolerance"]
