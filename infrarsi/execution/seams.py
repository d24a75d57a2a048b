"""The seams through which the harness drives a job's training, and the honest ones.

The harness drives training through four seams:

- ``fetch(micro_batches)``: the data fed to the model (data fetch);
- ``report_loss(loss)``: the loss value the job reports (loss report);
- ``optimizer_step(engine, base_optimizer, step, boundary)``: the optimizer step;
- ``configure_engine(engine)``: gradient reduction and other engine settings.

Every job gets ``HONEST``. A test workload's ``variant`` (``module:attribute``) names other
seams; the test-only cheats (``tests/cheats.py``) replace one seam each, so the tests can show that
the harness's own counters and checks name the cheat.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infrarsi.execution.data_sources import Batch


def _fetch(batches: list[Batch]) -> list[Batch]:
    return batches


def _report_loss(loss: Any) -> Any:
    return loss


def _optimizer_step(engine: Any, base_optimizer: Any, step: int, boundary: bool) -> None:
    engine.step()


def _configure_engine(engine: Any) -> None:
    return None


@dataclass(frozen=True)
class Seams:
    """The workload-controlled seams of one training run."""

    fetch: Callable[[list[Batch]], list[Batch]] = _fetch
    """Rank's micro-batches of one step -> what is fed to the model."""
    report_loss: Callable[[Any], Any] = _report_loss
    """The workload's reported loss of a micro-batch (a 0-d tensor; the harness computes its own)."""
    optimizer_step: Callable[[Any, Any, int, bool], None] = _optimizer_step
    """Called after every micro-batch's backward; DeepSpeed steps at the boundary."""
    configure_engine: Callable[[Any], None] = _configure_engine
    """Called once on the built DeepSpeed engine."""


HONEST = Seams()
