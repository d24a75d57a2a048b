"""Workload seams and the test-only cheat variants that abuse them (anti reward hacking).

The harness drives training through four seams the workload controls:

- ``fetch(micro_batches)``: the data the workload feeds the model (data fetch);
- ``report_loss(loss)``: the loss value the workload reports (loss report);
- ``optimizer_step(engine, base_optimizer, step, boundary)``: the optimizer step;
- ``configure_engine(engine)``: gradient reduction and other engine settings.

The honest seams are ``infrarsi.execution.seams.HONEST``. A cheat variant (selected by
``workload.variant``) replaces one seam; the harness counters (tokens and sequences seen by a forward pre-hook, optimizer
steps seen by a step post-hook on the real torch optimizer, the harness's own loss from the
logits, per-rank parameter checksums) stay honest, so the invariant checker can name the cheat.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from infrarsi.execution.data_sources import Batch
from infrarsi.execution.seams import HONEST, Seams


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
