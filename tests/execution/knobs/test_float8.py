"""The ``float8_linear`` knob: its handler's refusals, which layers it converts, and that float8
trains the built-in dense model to within float8's tolerance of the plain model (torchao
runs the float8 matmuls on the CPU with torch._scaled_mm's own kernel)."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from infrarsi.errors import KnobError
from infrarsi.execution.knobs import KNOBS, different_arithmetic_knobs
from infrarsi.execution.knobs.float8 import convert, float8_linear
from infrarsi.execution.knobs.registry import KnobContext, TrialBuild
from infrarsi.job import ModelShape
from infrarsi.knob_names import FLOAT8_LINEAR

pytest.importorskip("torchao.float8")  # the dev extra installs it; `gpu` on a cluster


def test_the_knob_is_another_arithmetic() -> None:
    assert KNOBS[FLOAT8_LINEAR].arithmetic == "different"
    assert different_arithmetic_knobs(["zero_stage", FLOAT8_LINEAR, "dtype"]) == [FLOAT8_LINEAR]


def test_the_handler_adds_the_transform_and_refuses_zero3_and_a_missing_torchao(
    knob_ctx: KnobContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    off = TrialBuild()
    float8_linear(False, off, knob_ctx)
    assert off == TrialBuild()  # off changes nothing
    build = TrialBuild()
    knob_ctx.config = {"zero_stage": 2}
    float8_linear(True, build, knob_ctx)
    assert build.runtime == {FLOAT8_LINEAR: True} and build.model_transforms == [convert]
    assert build.ds_config == {}
    knob_ctx.config = {"zero_stage": 3}
    with pytest.raises(KnobError, match=r"zero_stage=3.*Fix: add the constraint"):
        float8_linear(True, TrialBuild(), knob_ctx)
    knob_ctx.config = {"zero_stage": 1}
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # import fails as if not installed
    with pytest.raises(KnobError, match=r"needs torchao.*pip install 'infrarsi\[gpu\]'"):
        float8_linear(True, TrialBuild(), knob_ctx)


def _dense(dtype: torch.dtype) -> tuple[torch.nn.Module, ModelShape]:
    from workloads.models.dense.model import ModelArgs, Transformer

    args = ModelArgs(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, max_seq_len=32, ffn_hidden=192
    )
    torch.manual_seed(0)
    return Transformer(args).to(dtype), ModelShape(n_layers=2, dim=64, vocab_size=128, n_heads=4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float8_trains_within_its_tolerance_of_the_plain_model(dtype: torch.dtype) -> None:
    """Every attention and feed-forward projection converted, the output projection left alone;
    the loss moves (another arithmetic) by about 1e-4 relative (measured 6e-5 fp32, 2e-4 bf16)
    and each gradient points the same way (cosine similarity measured >= 0.993)."""
    tokens = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(0))
    out = {}
    for on in (False, True):
        model, shape = _dense(dtype)
        if on:
            names = convert(model, shape)
            assert len(names) == 2 * 7 and "output" not in names  # wq wk wv wo w1 w2 w3 a layer
            assert "Float8" not in type(model.output).__name__
        logits = model(tokens)
        loss = F.cross_entropy(logits.float()[:, :-1].reshape(-1, 128), tokens[:, 1:].reshape(-1))
        loss.backward()
        out[on] = (loss.item(), {n: p.grad.float().flatten() for n, p in model.named_parameters()})
    (plain, g0), (f8, g8) = out[False], out[True]
    assert f8 != plain and f8 == pytest.approx(plain, rel=1e-3)
    for n in g0:
        assert F.cosine_similarity(g0[n], g8[n], dim=0).item() > 0.98, n


class _OwnForward(torch.nn.Linear):
    """A linear layer whose ``forward`` does something else (as the dense family's output head)."""

    def forward(self, x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        return super().forward(x) * scale


def test_a_model_with_nothing_to_convert_is_refused() -> None:
    """Only the output projection, an MoE router, a layer with a ``forward`` of its own and
    layers ``torch._scaled_mm`` cannot take (682 wide: not a multiple of 16, as the dense
    family's default feed-forward)."""
    small = torch.nn.Sequential(
        torch.nn.Linear(64, 682),
        torch.nn.Linear(682, 64),
        torch.nn.Linear(64, 16),  # the router of 16 experts
        _OwnForward(64, 64),
        torch.nn.Linear(64, 128),  # the output projection
    )
    shape = ModelShape(n_layers=1, dim=64, vocab_size=128, num_experts=16)
    with pytest.raises(KnobError, match="float8 would change nothing"):
        convert(small, shape)
