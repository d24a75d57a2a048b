"""The training-job protocol: how a user's own training code plugs into infrarsi.

A workload YAML names an entry point instead of a built-in model family::

    model:
      entry_point: my_job:make_job   # module:function, imported from code_dir
      code_dir: ../my_job            # relative to the YAML (default: the YAML's folder)
      args: {layers: 4}              # handed to the entry point as JobContext.args

For every trial, on every rank, the harness calls ``make_job(ctx: JobContext) -> TrainingJob``
and keeps what makes the result honest: it builds the model where the trial's knobs say (on the
rank's GPU, or partitioned under DeepSpeed's ``zero.Init`` with ZeRO-3), wraps it in the DeepSpeed
engine with the trial's config, splits each global batch into the rank's micro-batches, times the
steps, counts tokens and optimizer steps itself, computes its own cross-entropy from the logits
for the loss invariant, measures memory, and runs the eval check on an untouched reference model
(``make_job`` called again, from the unpatched code, with ``ctx.reference`` True).

The built-in ``dense`` and ``moe`` families are entry points of this kind
(``workloads/jobs.py``); ``examples/hf_job.py`` wraps Hugging Face ``transformers`` models.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn


@dataclass(frozen=True)
class JobContext:
    """What the harness decided for one trial, handed to the entry point."""

    args: Mapping[str, Any]
    """The workload's ``model.args``: the job's own settings (size, layers...)."""
    options: Mapping[str, Any]
    """Model build options from the trial's knobs: ``activation_checkpointing`` (``none`` |
    ``selective`` | ``full``) and any a search space adds; empty for the reference model."""
    device: str
    """``cpu`` or ``cuda`` (the harness chooses the rank's device and builds the model there)."""
    rank: int
    """This rank's index in the trial's process group."""
    world_size: int
    """Ranks in the trial's process group (data-parallel degree)."""
    seq_len: int
    """Tokens per sequence (the workload's ``data.seq_len``)."""
    reference: bool = False
    """True when the job is built for the eval check's untouched reference model."""


@dataclass(frozen=True)
class ModelShape:
    """The architecture numbers the harness's FLOPs-per-token formula needs (MFU)."""

    n_layers: int
    """Transformer blocks."""
    dim: int
    """Hidden size."""
    vocab_size: int
    """Vocabulary size: logits are ``[batch, seq, vocab_size]`` and token ids lie in ``[0, vocab_size)``."""
    n_heads: int = 0
    """Attention heads (0: unknown; the analytic prior then assumes a head size of 128)."""
    num_experts: int = 0
    """Experts per MoE layer (0: dense)."""
    top_k: int = 0
    """Experts each token is routed to (MoE)."""
    expert_hidden: int = 0
    """SwiGLU inner size of one expert (MoE)."""


@dataclass(frozen=True)
class TokenBatch:
    """Inputs and next-token targets, both ``[rows, seq_len]`` int64 on the host."""

    inputs: torch.Tensor
    """Token ids fed to the model."""
    targets: torch.Tensor
    """The next token of every input position."""


class ExpertParallel(Protocol):
    """Expert parallelism a job applies itself (the built-in MoE family's
    ``workloads/models/moe/expert_parallel.py``): its experts leave DeepSpeed's data-parallel
    reduction and are stepped by the harness's own optimizer."""

    COMM_TIME_S: list[float]

    def parallelize_moe(self, model: nn.Module) -> nn.Module: ...
    def expert_parameters(self, model: nn.Module) -> list[nn.Parameter]: ...
    def finish_expert_grads(self, params: list[nn.Parameter], dp_world_size: int) -> None: ...
    def gather_full_experts(self, model: nn.Module) -> dict[str, torch.Tensor]: ...


def _logits(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    return model(inputs)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class TrainingJob:
    """The pieces of one training job, returned by the entry point."""

    build_model: Callable[[], nn.Module]
    """Builds the single-device model (no parallelism inside). The harness calls it inside its
    placement context (the rank's device, ``zero.Init`` under ZeRO-3, or the meta device for the
    reference), with the trial's seed set, so it must not move the model to a device itself, and
    every module should draw its own weights in its own ``__init__`` (so a partitioned build
    starts from the same values as a whole one)."""
    shape: ModelShape
    """The model's architecture numbers (FLOPs per token, vocabulary)."""
    forward: Callable[[nn.Module, torch.Tensor], torch.Tensor] = _logits
    """``forward(model, inputs [b, s]) -> logits [b, s, vocab]``; ``model`` is the DeepSpeed
    engine (call it like the module). Default ``model(inputs)``; a Hugging Face causal LM uses
    ``model(input_ids=inputs).logits``."""
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    """The job's training loss from ``(logits, targets)``, the one back-propagated (default: the
    harness's mean cross-entropy). The loss invariant always uses the harness's own cross-entropy."""
    fused_loss: Callable[[nn.Module, torch.Tensor, torch.Tensor, int], torch.Tensor] | None = None
    """``fused_loss(model, inputs [b, s], targets [b, s], chunk_tokens) -> mean cross-entropy``:
    the harness's loss of ``forward``'s logits, computed without materialising them, for the
    ``fused_loss_tokens`` knob. The model calls
    ``infrarsi.execution.knobs.fused_loss.fused_linear_cross_entropy(hidden, weight, targets,
    chunk_tokens)`` inside its output module's own ``forward`` (where ZeRO-3 has gathered the
    weight). None: the job cannot take that knob (such a trial fails saying so)."""
    global_batch: Callable[[int, int], TokenBatch] | None = None
    """The job's own data: ``global_batch(step, sequences) -> TokenBatch`` of ``[sequences,
    seq_len]``, a pure function of ``step`` (every rank takes its rows of it, so losses compare
    across micro-batch splits). None: the harness's synthetic source (or the workload's
    ``data.kind: tokens`` file)."""
    eval_batch: Callable[[], TokenBatch] | None = None
    """The held-out batch of the eval check (None: the harness's, from the same data source)."""
    expert_parallel: ExpertParallel | None = None
    """Expert parallelism the job applies when the ``expert_parallel`` knob is on (built-in MoE)."""


__all__ = ["ExpertParallel", "JobContext", "ModelShape", "TokenBatch", "TrainingJob"]
