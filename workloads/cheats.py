"""Workload seams and the test-only cheat variants that abuse them (anti reward hacking).

The harness drives training through four seams the workload controls:

- ``fetch(micro_batches)``: the data the workload feeds the model (data fetch);
- ``report_loss(loss)``: the loss value the workload reports (loss report);
- ``optimizer_step(engine, base_optimizer, step, boundary)``: the optimizer step;
- ``configure_engine(engine)``: gradient reduction and other engine settings.

The honest seams are in ``HONEST``. A cheat variant (selected by ``workload.variant``) replaces
one seam; the harness counters (tokens and sequences seen by a forward pre-hook, optimizer
steps seen by a step post-hook on the real torch optimizer, the harness's own loss from the
logits, per-rank parameter checksums) stay honest, so the invariant checker can name the cheat.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .data import Batch


def _fetch(batches: list[Batch]) -> list[Batch]:
    return batches


def _report_loss(loss: float) -> float:
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
    report_loss: Callable[[float], float] = _report_loss
    """The workload's reported loss of a micro-batch (the harness computes its own)."""
    optimizer_step: Callable[[Any, Any, int, bool], None] = _optimizer_step
    """Called after every micro-batch's backward; DeepSpeed steps at the boundary."""
    configure_engine: Callable[[Any], None] = _configure_engine
    """Called once on the built DeepSpeed engine."""


HONEST = Seams()


def _skip_odd_steps(engine: Any, base_optimizer: Any, step: int, boundary: bool) -> None:
    if boundary and step % 2 == 1:
        # The real torch optimizer does nothing this step; DeepSpeed's bookkeeping goes on.
        base_optimizer.step = lambda *a, **k: None
        try:
            engine.step()
        finally:
            del base_optimizer.step
    else:
        engine.step()


def _shrink_batch(batches: list[Batch]) -> list[Batch]:
    out = []
    for b in batches:
        rows = max(1, b.inputs.shape[0] // 2)
        out.append(Batch(b.inputs[:rows], b.targets[:rows]))
    return out


def _fewer_tokens(batches: list[Batch]) -> list[Batch]:
    half = max(1, batches[0].inputs.shape[1] // 2)
    return [Batch(b.inputs[:, :half], b.targets[:, :half]) for b in batches]


def _fake_loss(loss: float) -> float:
    return 0.8 * loss


def _skip_allreduce(engine: Any) -> None:
    engine.enable_backward_allreduce = False


CHEATS: dict[str, Seams] = {
    "skip_optimizer_steps": replace(HONEST, optimizer_step=_skip_odd_steps),
    "shrink_batch": replace(HONEST, fetch=_shrink_batch),
    "fake_loss": replace(HONEST, report_loss=_fake_loss),
    "fewer_tokens": replace(HONEST, fetch=_fewer_tokens),
    "skip_allreduce": replace(HONEST, configure_engine=_skip_allreduce),
}
"""Variant name -> seams. Test-only: a real workload never sets ``variant``."""


def seams_for(variant: str | None) -> Seams:
    """The seams of ``variant`` (``None``: honest). An unknown name lists the valid ones."""
    if variant is None:
        return HONEST
    if variant not in CHEATS:
        raise KeyError(f"unknown workload variant {variant!r}; valid: {sorted(CHEATS)}")
    return CHEATS[variant]
