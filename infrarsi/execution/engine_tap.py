"""The harness's tap on a script's DeepSpeed engine: count, time, measure and stop.

A script (``script:`` in the workload YAML) runs its own loop: ``engine(batch)``,
``engine.backward(loss)``, ``engine.step()``. ``EngineTap.attach(engine)`` keeps the script's
engine object (it stays a real ``DeepSpeedEngine``: ``isinstance``, ``engine.module``,
checkpoints all work) and adds, until ``detach``:

- a forward pre-hook on ``engine.module`` that counts the token ids and sequences fed to the
  model while autograd is on (the first positional argument, ``input_ids=``, or a mapping's
  ``input_ids``): the harness counts tokens itself, it does not trust the script;
- a step post-hook on the real torch optimizer (``engine.basic_optimizer``): an optimizer step
  is counted only when it really stepped;
- ``engine.backward`` (an instance attribute over the class's method): takes the loss the
  script back-propagates, then calls DeepSpeed's. How a step's losses make the step's loss is
  ``loss_reduction``: ``token_mean`` (a script's own loop passes each micro-batch's mean loss and
  DeepSpeed divides by the accumulation: the token-weighted mean over micro-batches and ranks) or
  ``step_sum`` (a Hugging Face ``Trainer`` passes losses already divided for the accumulation, by
  the accumulation steps or by the items of the whole step, and tells DeepSpeed not to divide
  again: the sum over a rank's micro-batches, averaged over the ranks), so the loss per step is
  the same quantity whatever the micro-batch split;
- ``engine.step``: calls DeepSpeed's; at a gradient-accumulation boundary (DeepSpeed's own
  ``is_gradient_accumulation_boundary``, read before the call) it closes the optimizer step like
  the entry-point loop (``rank_loop``) does: the loss and token sums are all-reduced over the
  ranks, the device synchronised, and the step's seconds taken with the harness's clock, from
  the end of the previous step (the first: a barrier, then the first forward) to here, so the
  script's own data loading and communication are inside.

After the contract's last step the tap raises ``TrialComplete`` out of ``engine.step``: a
``BaseException``, so a script's ``except Exception`` does not swallow it; the script job
(``script_job``) catches it. A non-finite loss raises it too, with ``nan`` set.

Two more things serve the long check's checkpoint round trip (``script_job``): ``after_step``
is called once an optimizer step is closed and recorded (outside its clock: the next step's
clock starts after it returns), which is where the uninterrupted run saves its checkpoint; and
``skip_steps`` N makes a restarted run of the script pass over its first N optimizer steps
without training them (``engine.backward`` and ``engine.step`` do nothing, nothing is recorded),
so the script's own data loader reaches step N as it would have, while the weights, optimizer and
scheduler are the checkpoint's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist

from infrarsi.execution.counters import token_digest

LossReduction = Literal["token_mean", "step_sum"]
"""How a step's backward losses make the step's loss (see the module docstring)."""


class TrialComplete(BaseException):
    """Raised out of the script's ``engine.step()`` when the harness has what it needs (the
    contract's steps, a non-finite loss, or the loss guard); caught by ``script_job``."""


@dataclass
class TapRecord:
    """What the tap measured, per optimizer step (warm-up steps first)."""

    step_times_s: list[float] = field(default_factory=list)
    """Seconds of each optimizer step on this rank, ending after the step's all-reduce and sync."""
    loss: list[float] = field(default_factory=list)
    """The step's loss from what the script passed to ``engine.backward`` (``loss_reduction``)."""
    tokens_seen: list[int] = field(default_factory=list)
    """Tokens fed to the model per optimizer step, summed over ranks (forward pre-hook)."""
    sequences_seen: list[int] = field(default_factory=list)
    """Sequences fed to the model per optimizer step, summed over ranks (forward pre-hook)."""
    data_digests: list[int] = field(default_factory=list)
    """Per optimizer step, the ``counters.token_digest`` of the ids fed, summed over ranks."""
    optimizer_steps: int = 0
    """Optimizer steps in which the real torch optimizer stepped (post-hook)."""
    stop_kind: Literal["", "done", "nan", "guard", "no_loss"] = ""
    """Why ``TrialComplete`` was raised: the contract's steps are ``done``, a non-finite loss
    (``nan``), the loss ``guard`` tripped, or ``no_loss`` (an optimizer step without a loss passed
    to ``engine.backward``); empty while training."""
    stop_reason: str = ""
    """The reason in words."""


def _token_ids(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    ids = args[0] if args else kwargs.get("input_ids")
    if isinstance(ids, Mapping):
        ids = ids.get("input_ids")
    return ids if isinstance(ids, torch.Tensor) else None


class EngineTap:
    """Counts, times and stops one script engine (see the module docstring)."""

    def __init__(
        self,
        total_steps: int,
        device: str,
        monitor: Any = None,
        loss_guard: Any = None,
        loss_reduction: LossReduction = "token_mean",
        after_step: Callable[[int], None] | None = None,
        skip_steps: int = 0,
    ) -> None:
        self.total_steps = int(total_steps)
        """Optimizer steps to measure before ``TrialComplete`` (warm-up included)."""
        self.device = device
        """``cpu`` or ``cuda`` (``cuda`` synchronises before a step's clock is read)."""
        self.monitor = monitor
        """The rank's ``MemoryMonitor`` (``check`` after backward and step), or None."""
        self.loss_guard = loss_guard
        """``(step, loss) -> reason or ""`` (the run's loss guard), or None."""
        self.loss_reduction = loss_reduction
        """How a step's backward losses make its loss (see the module docstring)."""
        self.after_step = after_step
        """Called with the number of recorded steps after each step that does not stop the run."""
        self.skip_steps = int(skip_steps)
        """Optimizer steps passed over untrained before recording starts (a restarted run)."""
        self.skipped_steps = 0
        """Optimizer steps passed over so far."""
        self.record = TapRecord()
        """The measurements."""
        self.engine: Any = None
        """The tapped engine (None before ``attach`` and after ``detach``)."""
        self._handles: list[Any] = []
        self._t0: float | None = None
        self._stepped = False
        self._reset_step()

    def _reset_step(self) -> None:
        self._tokens = self._rows = self._mb_tokens = 0
        self._digest: torch.Tensor | None = None  # on the ids' device, like the loss sum
        self._loss_sum: torch.Tensor | None = (
            None  # on the loss's device: no host sync inside a step
        )
        self._loss_tokens = 0
        self._stepped = False

    # ------------------------------------------------------------------ wiring
    def attach(self, engine: Any) -> Any:
        """Tap ``engine`` (a ``DeepSpeedEngine``); returns it."""
        self.engine = engine
        module = engine.module

        def pre(_mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not torch.is_grad_enabled() or self.skipping:
                return
            if self._t0 is None:  # the first step starts with every rank at its first forward
                dist.barrier()
                self._t0 = time.perf_counter()
            ids = _token_ids(args, kwargs)
            if ids is not None:
                n = int(ids.numel())
                self._tokens += n
                self._mb_tokens += n
                self._rows += int(ids.shape[0]) if ids.dim() > 1 else 1
                d = token_digest(ids)
                self._digest = d if self._digest is None else self._digest + d

        self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        base = getattr(engine, "basic_optimizer", None)
        if isinstance(base, torch.optim.Optimizer):

            def post(*_: Any) -> None:
                self._stepped = True

            self._handles.append(base.register_step_post_hook(post))
        real_backward, real_step = engine.backward, engine.step

        def backward(loss: Any, *a: Any, **k: Any) -> Any:
            if self.skipping:
                return None
            if isinstance(loss, torch.Tensor) and loss.numel() == 1:
                summed = self.loss_reduction == "step_sum"
                n = 1 if summed else (self._mb_tokens or 1)
                weighted = loss.detach().double().reshape(()) * n
                self._loss_sum = weighted if self._loss_sum is None else self._loss_sum + weighted
                self._loss_tokens = (
                    1 if summed else self._loss_tokens + n
                )  # step_sum: one weight per rank
            self._mb_tokens = 0
            out = real_backward(loss, *a, **k)
            if self.monitor is not None:
                self.monitor.check("after_backward")
            return out

        def step(*a: Any, **k: Any) -> Any:
            if (
                self.skipping
            ):  # DeepSpeed's own boundary, its micro-step count kept as its step would
                boundary = bool(engine.is_gradient_accumulation_boundary())
                engine.micro_steps += 1
                if boundary:
                    self._skip_one()
                return None
            boundary = bool(engine.is_gradient_accumulation_boundary())
            out = real_step(*a, **k)
            if self.monitor is not None:
                self.monitor.check("after_step")
            if boundary:
                self._close_step(engine.device)
            return out

        engine.backward = backward
        engine.step = step
        return engine

    @property
    def skipping(self) -> bool:
        """True while a restarted run is still passing over its first ``skip_steps`` steps."""
        return self.skipped_steps < self.skip_steps

    def _skip_one(self) -> None:
        self.skipped_steps += 1
        if not self.skipping:  # the first recorded step starts with the next forward
            self._t0 = None

    def detach(self) -> None:
        """Remove the hooks and the wrapped methods (idempotent)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self.engine is not None:
            for name in ("backward", "step"):
                self.engine.__dict__.pop(name, None)
        self.engine = None

    # ------------------------------------------------------------------ a step
    def _close_step(self, dev: Any) -> None:
        rec = self.record
        counts = torch.tensor(
            [float(self._loss_tokens), float(self._tokens), float(self._rows)],
            dtype=torch.float64,
            device=dev,
        )
        loss_sum = (
            self._loss_sum.to(dev)
            if self._loss_sum is not None
            else torch.zeros((), dtype=torch.float64, device=dev)
        )
        digest = (
            self._digest.to(device=dev, dtype=torch.float64)
            if self._digest is not None
            else torch.zeros((), dtype=torch.float64, device=dev)
        )
        totals = torch.cat([loss_sum.reshape(1), counts, digest.reshape(1)])
        dist.all_reduce(totals)
        if self.device == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        t0 = self._t0 if self._t0 is not None else now
        tot = totals.tolist()
        rec.step_times_s.append(now - t0)
        rec.loss.append(tot[0] / tot[1] if tot[1] else math.nan)
        rec.tokens_seen.append(int(tot[2]))
        rec.sequences_seen.append(int(tot[3]))
        rec.data_digests.append(int(tot[4]))
        rec.optimizer_steps += int(self._stepped)
        self._reset_step()
        step = len(rec.loss) - 1
        if not tot[1]:
            rec.stop_kind, rec.stop_reason = (
                "no_loss",
                (
                    f"optimizer step {step} ended without a loss passed to engine.backward(loss): the harness "
                    f"takes the training loss there (call engine.backward, not loss.backward)"
                ),
            )
        elif not math.isfinite(rec.loss[-1]):
            rec.stop_kind, rec.stop_reason = (
                "nan",
                f"loss is {rec.loss[-1]} at optimizer step {step}",
            )
        elif self.loss_guard is not None and (why := self.loss_guard(step, rec.loss[-1])):
            rec.stop_kind, rec.stop_reason = "guard", str(why)
        elif len(rec.loss) >= self.total_steps:
            rec.stop_kind, rec.stop_reason = (
                "done",
                f"the contract's {self.total_steps} optimizer steps ran",
            )
        if rec.stop_kind:
            raise TrialComplete(rec.stop_reason)
        if self.after_step is not None:
            self.after_step(len(rec.loss))
        # the next step starts now: the script's loop between steps is inside it
        self._t0 = time.perf_counter()


__all__ = ["EngineTap", "LossReduction", "TapRecord", "TrialComplete"]
