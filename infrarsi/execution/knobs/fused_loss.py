"""The ``fused_loss_tokens`` knob: the output projection and the cross-entropy fused, a chunk of tokens at a time.

With a 128k vocabulary the logits ``[tokens, vocab]`` are the largest activation of a step (a
1.5B model at micro-batch 8 x 2048 tokens: 4 GiB in bf16, and the plain loss holds several fp32
copies of them besides; ``loss_chunk_tokens`` removes the copies but still materialises the
logits). ``fused_linear_cross_entropy(hidden, weight, targets, chunk)`` never builds them whole:
for each chunk of ``chunk`` tokens it computes that chunk's logits ``hidden_c @ weight.T``, their
log-sum-exp and loss in fp32, and right away the chunk's gradients (``(softmax - onehot) / n``
times the weight for the hidden state, its transpose times the hidden state accumulated in fp32
for the weight), so backward only returns them. The peak holds one chunk's logits, the hidden
state's gradient and the weight's, whatever the micro-batch: the memory a larger micro-batch
needs (the technique of Liger Kernel's ``FusedLinearCrossEntropy``, written in torch here so it
runs, and is tested, on any device).

A job opts in by giving ``TrainingJob.fused_loss`` (``infrarsi/job.py``): its model computes the
loss with this function inside the output module's own ``forward``, so ZeRO-3 has gathered the
weight there (the built-in families do: ``workloads/models/dense/model.py``). The loss is the
same mean token cross-entropy the harness computes from the logits (to fp32 rounding of the
chunked sums, and the gradient's rounding to the weight's dtype), so the loss invariant judges it
as always. A job without ``fused_loss``, or with a training loss of its own (``TrainingJob.loss``),
fails the trial saying so. ``0`` (the default) keeps the logits path.

In a search space (a memory saver)::

    - name: fused_loss_tokens
      type: choice
      values: [0, 2048]
      memory: saver
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from infrarsi.execution.knobs.loss_chunk import IGNORE_INDEX, chunk_loss, token_count
from infrarsi.execution.knobs.registry import KnobContext, TrialBuild, integer, register_knob
from infrarsi.knob_names import FUSED_LOSS_TOKENS

FUSED_LOSS_KNOB = FUSED_LOSS_TOKENS
"""Name of the knob."""


@register_knob(FUSED_LOSS_KNOB, values=integer(lo=0), default=0, memory="saver")
def fused_loss_tokens(value: Any, build: TrialBuild, ctx: KnobContext) -> None:
    """Tokens per chunk of the fused output projection and cross-entropy (``0``: the logits path).

    The job's ``fused_loss`` computes the training loss without materialising the logits (each
    chunk's logits, loss and gradients in turn); the same loss to fp32 rounding, which the loss
    invariant judges as always. Sets runtime ``fused_loss_tokens``; no DeepSpeed key."""
    build.runtime[FUSED_LOSS_KNOB] = token_count(FUSED_LOSS_KNOB, value)


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``hidden [n, d] @ weight[vocab, d].T`` against ``targets [n]``; the
    gradients are computed chunk by chunk in forward (when wanted) and returned by backward."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int
    ) -> torch.Tensor:
        valid = targets != IGNORE_INDEX
        count = valid.sum()
        denom = count.clamp(min=1).to(torch.float32)
        want_h, want_w = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_w = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        )
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for i in range(0, hidden.shape[0], chunk):
            hc = hidden[i : i + chunk]
            # this chunk's logits, rounded as the plain path's, then its loss and d loss / d logits
            x = (hc @ weight.t()).to(torch.float32)
            part, p = chunk_loss(
                x, targets[i : i + chunk], valid[i : i + chunk], denom, want_h or want_w
            )
            total += part
            if p is None:
                continue
            g = p.to(hidden.dtype)  # in the dtype the plain path's logit gradient has
            if grad_h is not None:
                grad_h[i : i + chunk] = g @ weight
            if grad_w is not None:
                grad_w += (g.t() @ hc).to(torch.float32)
        ctx.save_for_backward(
            grad_h if grad_h is not None else torch.empty(0),
            grad_w.to(weight.dtype) if grad_w is not None else torch.empty(0),
        )
        ctx.wants = (want_h, want_w)
        return (total / count.to(torch.float32)).to(torch.float32)  # 0/0 = nan, as F.cross_entropy

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        grad_h, grad_w = ctx.saved_tensors
        want_h, want_w = ctx.wants
        return (
            grad_h.mul_(grad_out.to(grad_h.dtype)) if want_h else None,
            grad_w.mul_(grad_out.to(grad_w.dtype)) if want_w else None,
            None,
            None,
        )


def fused_linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int
) -> torch.Tensor:
    """Mean cross-entropy (fp32 arithmetic) of the logits ``hidden [..., d] @ weight [vocab, d].T``
    against ``targets [...]`` without materialising them: ``chunk_tokens`` rows at a time (see the
    module docstring). ``chunk_tokens`` 0 is the plain ``F.cross_entropy`` of the whole logits.
    Targets equal to -100 are left out of the mean."""
    flat, tgt = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    if chunk_tokens <= 0:
        return F.cross_entropy((flat @ weight.t()).float(), tgt)
    out: torch.Tensor = _FusedLinearCrossEntropy.apply(flat, weight, tgt, int(chunk_tokens))
    return out


__all__ = ["FUSED_LOSS_KNOB", "fused_linear_cross_entropy", "fused_loss_tokens"]
