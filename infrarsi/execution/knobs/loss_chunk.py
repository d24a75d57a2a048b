"""The ``loss_chunk_tokens`` knob: the harness's cross-entropy over the vocabulary, a chunk of tokens at a time.

With a 128k vocabulary the logits are the largest activation of a step, and the plain loss
``F.cross_entropy(logits.float(), targets)`` holds several more copies of them: an fp32 copy,
the fp32 log-softmax saved for backward, and in backward an fp32 gradient of each before the cast
back to the logits' dtype (measured: 6x the bf16 logits' size above them, against 1.8x chunked;
``benchmarks/results/loss_chunk.md``).
``chunked_cross_entropy`` computes the same mean cross-entropy ``chunk_tokens`` rows at a time:
each chunk's log-sum-exp, loss and gradient ``(softmax - onehot) / n`` are computed in fp32
and the gradient is written, in the logits' dtype, into one buffer the size of the logits that
backward returns (scaled by the incoming gradient). The fp32 temporaries are chunk-sized, so the
peak holds the logits, that one gradient buffer and one chunk's fp32 work.

The harness applies it where it computes the loss (``infrarsi/execution/rank_loop.py``); the
loss invariant compares the same quantity (the mean token cross-entropy), computed by the
harness either way. ``0`` (the default) keeps the plain ``F.cross_entropy``. The logits
themselves are still materialised (the job's ``forward`` returns them); a fused projection and
loss would need the job to hand over its last hidden state and output weight, which the job
contract does not.

In a search space (a memory saver)::

    - name: loss_chunk_tokens
      type: choice
      values: [0, 1024]
      memory: saver
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from infrarsi.errors import KnobError
from infrarsi.execution.knobs.registry import KnobContext, TrialBuild, integer, register_knob
from infrarsi.knob_names import LOSS_CHUNK_TOKENS

LOSS_CHUNK_KNOB = LOSS_CHUNK_TOKENS
"""Name of the knob."""
IGNORE_INDEX = -100
"""Targets equal to this are left out of the mean (``F.cross_entropy``'s default)."""


@register_knob(LOSS_CHUNK_KNOB, values=integer(lo=0), default=0, memory="saver")
def loss_chunk_tokens(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """Tokens per chunk of the harness's mean cross-entropy (``0``: one plain ``F.cross_entropy``).

    Each chunk's loss and logit gradient are computed in fp32 and the gradient written into one
    buffer of the logits' dtype, so no fp32 copy, saved log-softmax or fp32 gradient of the whole
    logits is held; the same loss to fp32 rounding, which the loss invariant judges as always. A
    count at least a micro-batch's tokens is the plain call. Sets runtime ``loss_chunk_tokens``;
    no DeepSpeed key."""
    build.runtime[LOSS_CHUNK_KNOB] = token_count(LOSS_CHUNK_KNOB, value)


def token_count(knob: str, value: Any) -> int:
    """``value`` as a token count (0: off); ``KnobError`` naming ``knob`` for anything else."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = -1
    if n < 0 or str(n) != str(value).strip():
        raise KnobError(f"knob {knob!r}: expected 0 (off) or a positive token count, got {value!r}")
    return n


def chunk_loss(
    x: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor, denom: torch.Tensor, grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One chunk of a mean cross-entropy: ``x [c, vocab]``, fp32 logits the function may
    overwrite; returns the chunk's summed loss over ``valid`` rows and, with ``grad``, the
    gradient of the mean ``(softmax - onehot) * valid / denom`` (fp32, in ``x``'s storage)."""
    tc = targets.clamp(min=0).unsqueeze(1)
    target_logit = x.gather(1, tc).squeeze(1)
    m = x.amax(dim=-1, keepdim=True)
    e = x.sub_(m).exp_()  # exp(x - max)
    s = e.sum(dim=-1, keepdim=True)
    total = ((m + s.log()).squeeze(1) - target_logit).mul(valid).sum()
    if not grad:
        return total, None
    p = e.div_(s)  # softmax
    p.scatter_add_(1, tc, torch.full_like(tc, -1, dtype=p.dtype))
    return total, p.mul_((valid.to(p.dtype) / denom).unsqueeze(1))


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``logits [n, vocab]`` against ``targets [n]``; the gradient is
    computed chunk by chunk in forward (when the logits need one) and returned by backward."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, chunk: int) -> torch.Tensor:  # type: ignore[override]
        valid = targets != IGNORE_INDEX
        count = valid.sum()
        denom = count.clamp(min=1).to(torch.float32)
        want_grad = bool(ctx.needs_input_grad[0])
        grad = torch.empty_like(logits) if want_grad else None
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for i in range(0, logits.shape[0], chunk):
            # one fp32 buffer per chunk (never the logits themselves), worked on in place
            x = logits[i : i + chunk].to(torch.float32, copy=True)
            part, g = chunk_loss(
                x, targets[i : i + chunk], valid[i : i + chunk], denom, grad is not None
            )
            total += part
            if grad is not None and g is not None:
                grad[i : i + chunk] = g
        if grad is not None:
            ctx.save_for_backward(grad)
        # 0/0 = nan when every target is ignored, as F.cross_entropy
        return (total / count.to(torch.float32)).to(torch.float32)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:  # type: ignore[override]
        (grad,) = ctx.saved_tensors
        return grad.mul_(grad_out.to(grad.dtype)), None, None


def chunked_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, chunk_tokens: int
) -> torch.Tensor:
    """Mean cross-entropy (fp32 arithmetic) of ``logits [..., vocab]`` against ``targets [...]``,
    ``chunk_tokens`` rows at a time; ``chunk_tokens`` 0 (or at least the token count) is the plain
    ``F.cross_entropy(logits.float(), targets)``. Same value and gradient either way (to fp32
    rounding); the gradient has the logits' dtype."""
    vocab = logits.shape[-1]
    flat, tgt = logits.reshape(-1, vocab), targets.reshape(-1)
    if chunk_tokens <= 0 or tgt.numel() <= chunk_tokens:
        return F.cross_entropy(flat.float(), tgt)
    out: torch.Tensor = _ChunkedCrossEntropy.apply(flat, tgt, int(chunk_tokens))
    return out


__all__ = [
    "IGNORE_INDEX",
    "LOSS_CHUNK_KNOB",
    "chunk_loss",
    "chunked_cross_entropy",
    "loss_chunk_tokens",
    "token_count",
]
