"""Harness counters: the tokens and sequences fed to the model and the optimizer steps really taken.

The harness counts a step's work itself, by hooks on the model and on the torch optimizer, so a
trial's tokens per step and optimizer steps are measured, not taken from the job's word (the
contract's invariants check them). It also digests the token ids of each step (``token_digest``):
two runs that feed the same sequences in the same optimizer steps have the same digests, however
the step is split into micro-batches or ranks, so the doctor can tell a job whose data order
changes from run to run, and a candidate that trains on other data than the baseline is caught.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

DIGEST_PRIME = 1_048_573
"""The prime under 2**20 a token's digest is reduced by: a step's digest, summed over every token
of every rank, stays an exact integer in float64 (the all-reduce's dtype) up to 2**33 tokens."""


def token_digest(ids: torch.Tensor) -> torch.Tensor:
    """A digest of a batch of token ids: an int64 scalar tensor on ``ids``' device (no host sync).

    Each token contributes ``((id * 40503 + position * 2654435761) mod p)**2 mod p`` (``p`` =
    ``DIGEST_PRIME``; position within its sequence, the last dimension), and the digest is the sum:
    the same whichever order the sequences come in and however they are split into micro-batches
    or ranks, but sensitive to which tokens are in the step and where they sit in their sequence
    (the square keeps a swap of two tokens within a sequence from cancelling out)."""
    x = ids.detach().to(torch.int64)
    x = x.reshape(1, 1) if x.dim() == 0 else x.reshape(-1, x.shape[-1])
    pos = torch.arange(x.shape[-1], device=x.device, dtype=torch.int64)
    v = (x * 40503 + pos * 2654435761) % DIGEST_PRIME
    return ((v * v) % DIGEST_PRIME).sum()


class HarnessCounters:
    """Tokens/sequences fed to the model (forward pre-hook on the top module) and optimizer
    steps taken by the real torch optimizer (step post-hook), counted by the harness."""

    def __init__(self) -> None:
        self.step_tokens = 0
        self.step_rows = 0
        self.step_digest: torch.Tensor | None = None
        """``token_digest`` of the ids fed since ``begin_step`` (None: none fed)."""
        self._stepped = False
        self._handles: list[Any] = []

    def attach(self, model: nn.Module) -> HarnessCounters:
        """Count the token ids the model is called with: its first positional argument, or
        ``input_ids=`` (a Hugging Face model called by keyword)."""

        def pre(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            ids = args[0] if args else kwargs.get("input_ids")
            if torch.is_grad_enabled() and isinstance(ids, torch.Tensor):
                self.step_tokens += int(ids.numel())
                self.step_rows += int(ids.shape[0])
                d = token_digest(ids)
                self.step_digest = d if self.step_digest is None else self.step_digest + d

        self._handles.append(model.register_forward_pre_hook(pre, with_kwargs=True))
        return self

    def watch_optimizer(self, opt: torch.optim.Optimizer) -> None:
        def post(*_: Any) -> None:
            self._stepped = True

        self._handles.append(opt.register_step_post_hook(post))

    def begin_step(self) -> None:
        self.step_tokens = self.step_rows = 0
        self.step_digest = None
        self._stepped = False

    def digest_on(self, device: torch.device | str) -> torch.Tensor:
        """This step's digest as a float64 scalar on ``device`` (0 when no ids were fed), to be
        all-reduced with the step's other totals."""
        if self.step_digest is None:
            return torch.zeros((), dtype=torch.float64, device=device)
        return self.step_digest.to(device=device, dtype=torch.float64)

    def end_step(self) -> int:
        """1 if the optimizer really stepped since ``begin_step``, else 0."""
        took = int(self._stepped)
        self._stepped = False
        return took

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
