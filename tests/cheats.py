"""The test-only cheat seams that abuse a workload's seams (anti reward hacking).

The harness drives training through four seams the workload controls:

- ``fetch(micro_batches)``: the data the workload feeds the model (data fetch);
- ``report_loss(loss)``: the loss value the workload reports (loss report);
- ``optimizer_step(engine, base_optimizer, step, boundary)``: the optimizer step;
- ``configure_engine(engine)``: gradient reduction and other engine settings.

The honest seams are ``infrarsi.execution.seams.HONEST``. A cheat (named by a test workload's
``variant: tests.cheats:NAME``, the product's hook, imported on the ranks) replaces one seam;
the harness counters (tokens and sequences seen by a forward pre-hook, optimizer steps seen by a
step post-hook on the real torch optimizer, the harness's own loss from the logits, per-rank
parameter checksums) stay honest, so the invariant checker can name the cheat.
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


skip_optimizer_steps = replace(HONEST, optimizer_step=_skip_odd_steps)
"""Every odd optimizer step does nothing (the step counter sees it)."""
shrink_batch = replace(HONEST, fetch=_shrink_batch)
"""Half the sequences of every micro-batch (the sequence counter sees it)."""
fake_loss = replace(HONEST, report_loss=_fake_loss)
"""The reported loss is 0.8 of the true one (the harness's own loss sees it)."""
fewer_tokens = replace(HONEST, fetch=_fewer_tokens)
"""Half the tokens of every sequence (the token counter sees it)."""
skip_allreduce = replace(HONEST, configure_engine=_skip_allreduce)
"""No gradient all-reduce: the replicas drift apart (the parameter checksums see it)."""

CHEATS: dict[str, Seams] = {
    "skip_optimizer_steps": skip_optimizer_steps,
    "shrink_batch": shrink_batch,
    "fake_loss": fake_loss,
    "fewer_tokens": fewer_tokens,
    "skip_allreduce": skip_allreduce,
}
"""Cheat name -> seams (each also the module attribute a workload's ``variant`` names)."""
