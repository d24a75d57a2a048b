"""``sdpa_gqa``: grouped-query attention through ``scaled_dot_product_attention(enable_gqa=True)``
instead of ``repeat_interleave`` copies of k and v computes the same function (outputs and
gradients); with as many key/value heads as query heads the code path is unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from infrarsi.patches import check_scope
from tests.workloads.patches.helpers import patch_path, patched_module
from workloads.models.dense import model as committed

NAME = "sdpa_gqa"


def test_patch_is_in_scope_and_edits_the_dense_model() -> None:
    assert check_scope(patch_path(NAME), ["workloads/**"]) == ["workloads/models/dense/model.py"]
    assert "enable_gqa=" in patch_path(NAME).read_text()


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
def test_model_same_loss_and_grads(tmp_path: Path, n_kv_heads: int | None) -> None:
    patched = patched_module(NAME, tmp_path, "models.dense.model")
    args = committed.FLAVOURS["debug"].with_overrides({"n_layers": 2, "dim": 64, "n_heads": 4, "n_kv_heads": n_kv_heads,
                                                       "vocab_size": 256, "ffn_hidden": 96})
    torch.manual_seed(0)
    ma = committed.Transformer(args)
    torch.manual_seed(0)
    mb = patched.Transformer(args)
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
