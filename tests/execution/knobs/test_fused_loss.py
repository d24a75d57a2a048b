"""The ``fused_loss_tokens`` knob and the fused projection + cross-entropy: the same loss and the
same gradients for the hidden state and the output weight as ``F.cross_entropy`` of the whole
logits ``hidden @ weight.T`` (fp32, and bf16 within its rounding), ignored targets left out, no
gradient work without autograd, and a handler that refuses what is not a token count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from infrarsi.errors import KnobError
from infrarsi.execution.knobs.fused_loss import (
    FUSED_LOSS_KNOB,
    fused_linear_cross_entropy,
    fused_loss_tokens,
)
from infrarsi.execution.knobs.registry import KNOB_HANDLERS, KNOBS, TrialBuild


def _inputs(dtype: torch.dtype = torch.float32, n: int = 95, d: int = 16, vocab: int = 50):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(n, d, generator=g).to(dtype)
    w = (torch.randn(vocab, d, generator=g) * 0.3).to(dtype)
    t = torch.randint(0, vocab, (n,), generator=g)
    return h, w, t


def _both(h, w, t, chunk: int, scale: float = 1.0):
    """(plain loss, fused loss, plain grads, fused grads) of the same inputs."""
    out = []
    for fused in (False, True):
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        loss = (
            fused_linear_cross_entropy(hh, ww, t, chunk)
            if fused
            else F.cross_entropy((hh @ ww.t()).float(), t)
        )
        (loss * scale).backward()
        out.append((loss.detach(), hh.grad, ww.grad))
    return out


@pytest.mark.parametrize("chunk", [1, 7, 64, 95, 200])
def test_fused_loss_same_value_and_gradients_fp32(chunk: int) -> None:
    h, w, t = _inputs()
    t[3] = t[40] = -100  # ignored rows: out of the mean and of the gradients
    (lp, hp, wp), (lf, hf, wf) = _both(h, w, t, chunk, scale=2.5)
    assert lf.dtype == torch.float32
    torch.testing.assert_close(lf, lp, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(hf, hp, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(wf, wp, rtol=1e-5, atol=1e-6)
    assert hf[3].abs().max() == 0 and hf[40].abs().max() == 0


def test_fused_loss_bf16_keeps_dtypes_and_matches_within_rounding() -> None:
    h, w, t = _inputs(torch.bfloat16, n=64, d=32, vocab=128)
    (lp, hp, wp), (lf, hf, wf) = _both(h, w, t, 16)
    assert hf.dtype == torch.bfloat16 and wf.dtype == torch.bfloat16
    torch.testing.assert_close(lf, lp, rtol=1e-5, atol=1e-5)  # the same bf16 logits, fp32 sums
    torch.testing.assert_close(hf.float(), hp.float(), rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(wf.float(), wp.float(), rtol=2e-2, atol=2e-3)


def test_fused_loss_without_grad_and_off_is_the_plain_loss() -> None:
    h, w, t = _inputs()
    plain = F.cross_entropy((h @ w.t()).float(), t)
    with torch.no_grad():
        torch.testing.assert_close(fused_linear_cross_entropy(h, w, t, 8), plain)
    off = fused_linear_cross_entropy(h.reshape(5, 19, -1), w, t.reshape(5, 19), 0)
    torch.testing.assert_close(off, plain)


def test_fused_loss_knob_is_a_memory_saver_that_records_the_count(knob_ctx) -> None:
    assert KNOB_HANDLERS[FUSED_LOSS_KNOB] is fused_loss_tokens
    assert KNOBS[FUSED_LOSS_KNOB].memory == "saver"
    ctx = knob_ctx
    b = TrialBuild(ds_config={})
    fused_loss_tokens(2048, b, ctx)
    assert b.runtime[FUSED_LOSS_KNOB] == 2048 and b.ds_config == {}
    for bad in (-1, "many", 1.5, True):
        with pytest.raises(KnobError, match=FUSED_LOSS_KNOB):
            fused_loss_tokens(bad, TrialBuild(ds_config={}), ctx)
