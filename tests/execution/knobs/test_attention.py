"""The ``attention_backend`` knob: its handler, the kernel it pins, and that each kernel computes
the same loss and gradients (the equivalence test of the patch library, on the CPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from infrarsi.errors import KnobError
from infrarsi.execution.knobs.attention import attention_backend, backend_context
from infrarsi.execution.knobs.registry import KnobContext, TrialBuild
from infrarsi.knob_names import ATTENTION_BACKEND


class _Ops(TorchDispatchMode):
    """Records the ATen ops that run (the kernel SDPA dispatched to is one of them)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.add(str(func))
        return func(*args, **(kwargs or {}))


def test_the_handler_sets_the_runtime_and_refuses_cuda_only_kernels_on_cpu(
    knob_ctx: KnobContext,
) -> None:
    build = TrialBuild()
    attention_backend("flash", build, knob_ctx)
    assert build.runtime == {ATTENTION_BACKEND: "flash"}
    assert build.ds_config == {}
    with pytest.raises(KnobError, match=r"'cudnn'.*only on CUDA.*Fix: offer only auto, flash"):
        attention_backend("cudnn", TrialBuild(), knob_ctx)
    knob_ctx.device = "cuda"
    attention_backend("cudnn", build, knob_ctx)
    assert build.runtime[ATTENTION_BACKEND] == "cudnn"


def test_the_context_pins_the_kernel_and_restores_the_defaults() -> None:
    q = torch.randn(2, 4, 16, 8, requires_grad=True)
    ran = {}
    for name in ("auto", "math", "flash"):
        with backend_context(name), _Ops() as rec:
            F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
        ran[name] = "aten._scaled_dot_product_flash_attention_for_cpu.default" in rec.ops
    assert ran == {"auto": True, "math": False, "flash": True}
    assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
    with backend_context("efficient"), pytest.raises(RuntimeError, match="No viable backend"):
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert torch.backends.cuda.mem_efficient_sdp_enabled()


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_flash_and_math_give_the_same_loss_and_gradients(dtype: torch.dtype, tol: float) -> None:
    """The built-in dense model (GQA, causal) under each CPU kernel: the same loss and
    gradients to the dtype's rounding."""
    from workloads.models.dense.model import ModelArgs, Transformer

    args = ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, max_seq_len=32)
    tokens = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(0))
    out = {}
    for name in ("math", "flash"):
        torch.manual_seed(0)
        model = Transformer(args).to(dtype)
        with backend_context(name):
            logits = model(tokens)
            loss = F.cross_entropy(
                logits.float()[:, :-1].reshape(-1, 128), tokens[:, 1:].reshape(-1)
            )
            loss.backward()
        out[name] = (loss.detach(), {n: p.grad.float() for n, p in model.named_parameters()})
    (lm, gm), (lf, gf) = out["math"], out["flash"]
    assert lf.item() == pytest.approx(lm.item(), rel=tol)
    for n in gm:
        scale = gm[n].abs().max().clamp(min=1e-12)
        assert ((gf[n] - gm[n]).abs().max() / scale).item() < 10 * tol, n
