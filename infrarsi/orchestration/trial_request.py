"""One trial a stage asks the study executor for (``TrialRequest``), and a horizon trial's terms.

``StudyExecutor.run_trial`` takes its arguments as keywords (the ``run`` stage calls it on a Ray
actor) and carries them as one ``TrialRequest`` through its retry bookkeeping to the run itself,
so the options are declared once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from infrarsi.result import Stage, TrialExtra

if TYPE_CHECKING:
    from infrarsi.study.contract import Contract
    from infrarsi.study.invariants import Reference


@dataclass(frozen=True)
class Horizon:
    """A trial past the contract's step count (the long check): its steps, its checkpoint round
    trip, and what it is checked against."""

    steps: int
    """Optimizer steps to train, warm-up included."""
    checkpoint_step: int | None = None
    """Save and round-trip a DeepSpeed checkpoint after this step (None: no round trip)."""
    reference: Reference | None = None
    """The baseline's run over the same horizon (None: the trial is logged unchecked)."""
    contract: Contract | None = None
    """The contract whose invariants hold the horizon's step count and tolerances (None: the
    study's)."""


@dataclass(frozen=True)
class TrialRequest:
    """One trial: its config, the stage asking, its patches and its terms."""

    config: dict[str, Any]
    """The full knob config."""
    stage: Stage
    """The stage that asks (the row's ``stage``)."""
    patches: list[str] = field(default_factory=list)
    """Patch files the caller names for the row (a knob's patch set adds its own)."""
    extra: TrialExtra | None = None
    """Row fields the caller sets (role, repeat, proposal...)."""
    timeout_s: float | None = None
    """The trial's deadline (None: the executor's default)."""
    placement_group: Any = None
    """A reserved Ray placement group to run in (a Tune trial's), or None."""
    patch_file: str | None = None
    """A proposal's patch, relative to the study directory, or None."""
    expect_sha256: list[str] | None = None
    """The digests the patches must have, in order (verify, the long check), or None."""
    horizon: Horizon | None = None
    """A horizon trial's terms (None: the contract's steps, checked against the doctor's
    reference)."""
