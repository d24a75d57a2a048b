"""The ``loss_chunk_tokens`` knob and the harness's chunked cross-entropy: the same loss and logit
gradients as ``F.cross_entropy(logits.float(), targets)`` (fp32 on CPU, and bf16 logits), and a
handler that refuses what is not a token count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from infrarsi.errors import KnobError
from infrarsi.execution.knobs.loss_chunk import (
    LOSS_CHUNK_KNOB,
    chunked_cross_entropy,
    loss_chunk_tokens,
)
from infrarsi.execution.knobs.registry import KNOB_HANDLERS, TrialBuild


def _pair(logits: torch.Tensor, targets: torch.Tensor, chunk: int, scale: float = 1.0):
    a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    la = F.cross_entropy(a.float().reshape(-1, a.shape[-1]), targets.reshape(-1))
    lb = chunked_cross_entropy(b, targets, chunk)
    (la * scale).backward()
    (lb * scale).backward()
    return la, lb, a.grad, b.grad


@pytest.mark.parametrize("chunk", [1, 7, 64, 95])
def test_chunked_loss_same_value_and_gradient_fp32(chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 32, 50, generator=g) * 4
    targets = torch.randint(0, 50, (3, 32), generator=g)
    la, lb, ga, gb = _pair(
        logits, targets, chunk, scale=0.25
    )  # 0.25: the incoming gradient (1/accumulation)
    assert lb.dtype == torch.float32 and lb.shape == ()
    torch.testing.assert_close(lb, la, rtol=1e-6, atol=1e-6)
    assert gb.dtype == torch.float32
    torch.testing.assert_close(gb, ga, rtol=1e-5, atol=1e-7)


def test_chunked_loss_bf16_logits_keep_their_dtype_and_match() -> None:
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(2, 40, 300, generator=g) * 3).to(torch.bfloat16)
    targets = torch.randint(0, 300, (2, 40), generator=g)
    la, lb, ga, gb = _pair(logits, targets, 16)
    torch.testing.assert_close(
        lb, la, rtol=1e-6, atol=1e-6
    )  # both in fp32 from the same bf16 values
    assert gb.dtype == torch.bfloat16
    torch.testing.assert_close(
        gb.float(), ga.float(), rtol=1e-2, atol=1e-5
    )  # bf16 rounding of one grad


def test_chunked_loss_leaves_the_logits_untouched_and_ignores_minus_100() -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(20, 11, generator=g)
    targets = torch.randint(0, 11, (20,), generator=g)
    targets[[3, 4, 17]] = -100
    before = logits.clone()
    la, lb, ga, gb = _pair(logits, targets, 6)
    assert torch.equal(logits, before)
    torch.testing.assert_close(lb, la, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gb, ga, rtol=1e-5, atol=1e-7)
    assert torch.all(gb[[3, 4, 17]] == 0)


def test_chunked_loss_without_grad_and_off_is_the_plain_loss() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 8, 13, generator=g)
    targets = torch.randint(0, 13, (4, 8), generator=g)
    plain = F.cross_entropy(logits.reshape(-1, 13), targets.reshape(-1))
    assert torch.equal(chunked_cross_entropy(logits, targets, 0), plain)  # 0: the plain call itself
    assert torch.equal(chunked_cross_entropy(logits, targets, 32), plain)  # one chunk: the same
    torch.testing.assert_close(
        chunked_cross_entropy(logits, targets, 5), plain, rtol=1e-6, atol=1e-6
    )


def test_loss_chunk_knob_records_the_count_and_refuses_bad_values(knob_ctx) -> None:
    assert KNOB_HANDLERS[LOSS_CHUNK_KNOB] is loss_chunk_tokens
    b = TrialBuild(ds_config={})
    loss_chunk_tokens(4096, b, knob_ctx)
    assert b.runtime[LOSS_CHUNK_KNOB] == 4096 and b.ds_config == {}
    loss_chunk_tokens(0, b, knob_ctx)
    assert b.runtime[LOSS_CHUNK_KNOB] == 0
    for bad in (-1, "many", 1.5, True):
        with pytest.raises(KnobError, match="loss_chunk_tokens"):
            loss_chunk_tokens(bad, TrialBuild(ds_config={}), knob_ctx)
