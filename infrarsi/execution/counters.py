"""Harness counters: the tokens and sequences fed to the model and the optimizer steps really taken.

The harness counts a step's work itself, by hooks on the model and on the torch optimizer, so a
trial's tokens per step and optimizer steps are measured, not taken from the job's word (the
contract's invariants check them).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class HarnessCounters:
    """Tokens/sequences fed to the model (forward pre-hook on the top module) and optimizer
    steps taken by the real torch optimizer (step post-hook), counted by the harness."""

    def __init__(self) -> None:
        self.step_tokens = 0
        self.step_rows = 0
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

        self._handles.append(model.register_forward_pre_hook(pre, with_kwargs=True))
        return self

    def watch_optimizer(self, opt: torch.optim.Optimizer) -> None:
        def post(*_: Any) -> None:
            self._stepped = True

        self._handles.append(opt.register_step_post_hook(post))

    def begin_step(self) -> None:
        self.step_tokens = self.step_rows = 0
        self._stepped = False

    def end_step(self) -> int:
        """1 if the optimizer really stepped since ``begin_step``, else 0."""
        took = int(self._stepped)
        self._stepped = False
        return took

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
