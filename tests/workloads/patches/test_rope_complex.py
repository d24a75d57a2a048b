"""``rope_complex``: RoPE as one complex multiply computes the same rotation (outputs and
gradients) as the two strided slices of the committed code."""

from __future__ import annotations

from pathlib import Path

import torch

from infrarsi.patches import check_scope
from tests.workloads.patches.helpers import patch_path, patched_module
from workloads.models.dense import model as committed

NAME = "rope_complex"


def test_patch_is_in_scope() -> None:
    assert check_scope(patch_path(NAME), ["workloads/**"]) == ["workloads/models/dense/model.py"]


def test_apply_rope_same_values_and_grads(tmp_path: Path) -> None:
    patched = patched_module(NAME, tmp_path, "models.dense.model")
    cos, sin = committed.rope_tables(16, 40, 10000.0)
    x = torch.randn(2, 3, 33, 16, generator=torch.Generator().manual_seed(0))
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = committed.apply_rope(xa, cos, sin), patched.apply_rope(xb, cos, sin)
    torch.testing.assert_close(yb, ya, rtol=1e-6, atol=1e-6)
    w = torch.randn_like(ya)
    (ya * w).sum().backward()
    (yb * w).sum().backward()
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-6, atol=1e-6)
    xh = x.to(torch.bfloat16)  # the dtype is kept
    assert patched.apply_rope(xh, cos, sin).dtype == torch.bfloat16
