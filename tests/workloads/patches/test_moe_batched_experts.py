"""``moe_batched_experts``: the per-expert loop of ``GroupedExperts.run`` as three batched
``bmm``s over zero-padded expert blocks computes the same function (outputs and gradients)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from infrarsi.patches import check_scope
from tests.workloads.patches.helpers import patch_path, patched_module
from workloads.models.moe import model as committed

NAME = "moe_batched_experts"


def test_patch_is_in_scope_and_edits_the_moe_model() -> None:
    assert check_scope(patch_path(NAME), ["workloads/**"]) == ["workloads/models/moe/model.py"]
    assert "torch.bmm(" in patch_path(NAME).read_text()


def _pair(tmp: Path, num_experts: int = 8, dim: int = 32, hidden: int = 48):
    patched = patched_module(NAME, tmp, "models.moe.model")
    torch.manual_seed(0)
    a = committed.GroupedExperts(num_experts, dim, hidden)
    b = patched.GroupedExperts(num_experts, dim, hidden)
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("empty_experts", [False, True])
def test_run_matches_the_loop_with_gradients(tmp_path: Path, empty_experts: bool) -> None:
    a, b = _pair(tmp_path)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 3 if empty_experts else 8, (70,), generator=g).sort().values  # 3: experts 3-7 get none
    x = torch.randn(70, 32, generator=g)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = a.run(xa, ids), b.run(xb, ids)
    assert ya.shape == yb.shape == (70, 32)
    torch.testing.assert_close(yb, ya, rtol=1e-5, atol=1e-6)
    w = torch.randn(70, 32, generator=g)
    (ya * w).sum().backward()
    (yb * w).sum().backward()
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-5, atol=1e-6)
    for n in ("w1", "w2", "w3"):
        torch.testing.assert_close(getattr(b, n).grad, getattr(a, n).grad, rtol=1e-5, atol=1e-6)
    assert b.run(x[:0], ids[:0]).shape == (0, 32)


def test_whole_moe_model_same_loss_and_grads(tmp_path: Path) -> None:
    patched = patched_module(NAME, tmp_path, "models.moe.model")
    args = committed.FLAVOURS["debug"].with_overrides({"n_layers": 2, "dim": 64, "n_heads": 4,
                                                       "vocab_size": 256, "expert_hidden": 64})
    torch.manual_seed(0)
    ma = committed.build_moe_transformer(args)
    torch.manual_seed(0)
    mb = patched.build_moe_transformer(args)
    tokens = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(2))
    losses = []
    for m in (ma, mb):
        logits = m(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), tokens[:, 1:].reshape(-1))
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=1e-6)
    ga = dict(ma.named_parameters())
    for n, p in mb.named_parameters():
        assert p.grad is not None
        torch.testing.assert_close(p.grad, ga[n].grad, rtol=1e-4, atol=1e-6, msg=n)
