"""The patch library (``workloads/patches/``): each patch computes the same function as the
committed code (outputs and gradients, within tolerance), and every shipped search space's
``code_patch`` values (patches and sets) pass init's checks against this repository's HEAD
(present, inside ``workloads/**``, applying alone and together).

- ``rope_complex``: RoPE as one complex multiply, against the two strided slices.
- ``moe_batched_experts``: the per-expert loop of ``GroupedExperts.run`` as three batched ``bmm``s
  over zero-padded expert blocks.
- ``sdpa_gqa``: grouped-query attention inside ``scaled_dot_product_attention(enable_gqa=True)``
  instead of repeating keys and values.
- ``compile_block``: ``torch.compile`` around each dense block (the attention sub-layer of a MoE
  block), tested with the ``aot_eager`` backend.
- Selective checkpointing of attention only is the ``activation_checkpointing: selective`` knob
  value, not a patch; its test is here with the library's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import git
import pytest
import torch

from infrarsi.patches import check_scope, check_space_patches, patch_names, patch_set
from tests.workloads.patch_helpers import (
    ROOT,
    assert_same_loss_and_grads,
    patch_path,
    patched_module,
)
from workloads.models.dense import model as committed
from workloads.models.moe import model as committed_moe

# ---- rope_complex

ROPE = "rope_complex"


def test_rope_complex_patch_is_in_scope() -> None:
    assert check_scope(patch_path(ROPE), ["workloads/**"]) == ["workloads/models/dense/model.py"]


def test_rope_complex_apply_rope_same_values_and_grads(tmp_path: Path) -> None:
    patched = patched_module(ROPE, tmp_path, "models.dense.model")
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


# ---- moe_batched_experts

MOE = "moe_batched_experts"


def test_moe_batched_experts_patch_is_in_scope_and_edits_the_moe_model() -> None:
    assert check_scope(patch_path(MOE), ["workloads/**"]) == ["workloads/models/moe/model.py"]
    assert "torch.bmm(" in patch_path(MOE).read_text()


def _moe_pair(tmp: Path, num_experts: int = 8, dim: int = 32, hidden: int = 48):
    patched = patched_module(MOE, tmp, "models.moe.model")
    torch.manual_seed(0)
    a = committed_moe.GroupedExperts(num_experts, dim, hidden)
    b = patched.GroupedExperts(num_experts, dim, hidden)
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("empty_experts", [False, True])
def test_moe_batched_experts_run_matches_the_loop_with_gradients(
    tmp_path: Path, empty_experts: bool
) -> None:
    a, b = _moe_pair(tmp_path)
    g = torch.Generator().manual_seed(1)
    ids = (
        torch.randint(0, 3 if empty_experts else 8, (70,), generator=g).sort().values
    )  # 3: experts 3-7 get none
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


def test_moe_batched_experts_whole_moe_model_same_loss_and_grads(tmp_path: Path) -> None:
    patched = patched_module(MOE, tmp_path, "models.moe.model")
    args = committed_moe.FLAVOURS["debug"].with_overrides(
        {"n_layers": 2, "dim": 64, "n_heads": 4, "vocab_size": 256, "expert_hidden": 64}
    )
    torch.manual_seed(0)
    ma = committed_moe.build_moe_transformer(args)
    torch.manual_seed(0)
    mb = patched.build_moe_transformer(args)
    assert_same_loss_and_grads(ma, mb)


# ---- sdpa_gqa

SDPA = "sdpa_gqa"


def test_sdpa_gqa_patch_is_in_scope_and_edits_the_dense_model() -> None:
    assert check_scope(patch_path(SDPA), ["workloads/**"]) == ["workloads/models/dense/model.py"]
    assert "enable_gqa=" in patch_path(SDPA).read_text()


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
def test_sdpa_gqa_model_same_loss_and_grads(tmp_path: Path, n_kv_heads: int | None) -> None:
    patched = patched_module(SDPA, tmp_path, "models.dense.model")
    args = committed.FLAVOURS["debug"].with_overrides(
        {
            "n_layers": 2,
            "dim": 64,
            "n_heads": 4,
            "n_kv_heads": n_kv_heads,
            "vocab_size": 256,
            "ffn_hidden": 96,
        }
    )
    torch.manual_seed(0)
    ma = committed.Transformer(args)
    torch.manual_seed(0)
    mb = patched.Transformer(args)
    assert_same_loss_and_grads(ma, mb)


# ---- compile_block

COMPILE = "compile_block"


def test_compile_block_patch_is_in_scope_and_compiles_the_blocks() -> None:
    assert check_scope(patch_path(COMPILE), ["workloads/**"]) == ["workloads/models/dense/model.py"]
    assert "target.compile()" in patch_path(COMPILE).read_text()


def _train_step(m: torch.nn.Module, tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    logits = m(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, vocab), tokens[:, 1:].reshape(-1)
    )
    loss.backward()
    return loss


@pytest.mark.parametrize(
    ("family", "checkpointing"),
    [("dense", "none"), ("dense", "selective"), ("dense", "full"), ("moe", "none")],
)
def test_compile_block_model_same_loss_and_grads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, family: str, checkpointing: str
) -> None:
    """The patch's ``compile()`` runs with backend ``aot_eager``: Dynamo's graph capture and AOT
    autograd's traced forward and backward (what the patch changes about the program), without
    Inductor's C++ code generation, which takes minutes on a 2-core CPU; the GPU check runs the
    real backend."""
    import torch._dynamo

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda *a, **k: real(*a, **{**k, "backend": "aot_eager"}))
    torch._dynamo.reset()
    sub = "models.dense.model" if family == "dense" else "models.moe.model"
    patched = patched_module(COMPILE, tmp_path, sub)
    base = committed if family == "dense" else committed_moe
    over = {
        "n_layers": 2,
        "dim": 64,
        "n_heads": 4,
        "vocab_size": 256,
        "ffn_hidden": 96,
        "expert_hidden": 64,
    }
    args = base.FLAVOURS["debug"].with_overrides(over)
    build_a = committed.Transformer if family == "dense" else committed_moe.build_moe_transformer
    build_b = patched.Transformer if family == "dense" else patched.build_moe_transformer
    torch.manual_seed(0)
    ma = build_a(args, checkpointing)
    torch.manual_seed(0)
    mb = build_b(args, checkpointing)
    compiled = [
        n for n, m in mb.named_modules() if getattr(m, "_compiled_call_impl", None) is not None
    ]
    assert compiled == (
        ["layers.0", "layers.1"]
        if family == "dense"
        else ["layers.0.attention", "layers.1.attention"]
    )
    assert [n for n, _ in ma.named_parameters()] == [
        n for n, _ in mb.named_parameters()
    ]  # names kept
    tokens = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(2))
    for _ in range(2):  # the second call runs the cached graph
        la, lb = _train_step(ma, tokens, 256), _train_step(mb, tokens, 256)
        torch.testing.assert_close(lb, la, rtol=0, atol=1e-5)
    ga = dict(ma.named_parameters())
    for n, p in mb.named_parameters():
        assert p.grad is not None
        torch.testing.assert_close(p.grad, ga[n].grad, rtol=1e-4, atol=1e-5, msg=n)
    if (
        family == "dense" and checkpointing == "none"
    ):  # bf16 weights and activations compile and train too
        mb.to(torch.bfloat16)
        assert torch.isfinite(_train_step(mb, tokens, 256))


# ---- selective checkpointing of attention only (a value of the activation_checkpointing knob)


@pytest.mark.parametrize("family", ["dense", "moe"])
def test_selective_checkpointing_recomputes_attention_only_same_loss_and_grads(
    family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``activation_checkpointing: selective`` (no patch: a model build option) checkpoints the
    attention sub-layer of every block and nothing else, and trains to the same numbers."""
    from workloads.models import build_model

    over = {
        "n_layers": 2,
        "dim": 64,
        "n_heads": 4,
        "vocab_size": 256,
        "ffn_hidden": 96,
        "expert_hidden": 64,
    }
    tokens = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(2))
    runs = {}
    for mode in ("none", "selective"):
        torch.manual_seed(0)
        m = build_model(family, "debug", over, {"activation_checkpointing": mode})
        # the module the blocks' code lives in (other tests may have re-imported the package)
        mod = sys.modules[type(m.layers[0]).__module__]  # type: ignore[index]
        real = mod.checkpoint
        seen: list[str] = []

        def spy(fn, *a, _seen=seen, _real=real, **k):  # type: ignore[no-untyped-def]
            _seen.append(getattr(fn, "__name__", type(fn).__name__))
            return _real(fn, *a, **k)

        monkeypatch.setattr(mod, "checkpoint", spy)  # the name Block.forward calls
        runs[mode] = (_train_step(m, tokens, 256), dict(m.named_parameters()), seen)
        monkeypatch.undo()
    assert runs["none"][2] == [] and runs["selective"][2] == [
        "_attn",
        "_attn",
    ]  # attention of each block only
    torch.testing.assert_close(runs["selective"][0], runs["none"][0], rtol=0, atol=1e-6)
    for n, p in runs["selective"][1].items():
        torch.testing.assert_close(p.grad, runs["none"][1][n].grad, rtol=1e-5, atol=1e-7, msg=n)


# ---- the library as shipped

SPACES = sorted((ROOT / "search_spaces").glob("*.yaml"))


def test_every_patch_has_an_equivalence_test() -> None:
    names = sorted(p.stem for p in (ROOT / "workloads/patches").glob("*.diff"))
    assert names, "no patches shipped"
    tested = {n for n in names if any(k.startswith(f"test_{n}_") for k in globals())}
    assert sorted(set(names) - tested) == []


def test_the_spaces_name_shipped_patches_and_sets() -> None:
    named = {n for s in SPACES for v in patch_names(s) for n in patch_set(v)}
    assert named == {p.stem for p in (ROOT / "workloads/patches").glob("*.diff")}
    assert any("+" in v for s in SPACES for v in patch_names(s))  # at least one set is searched


@pytest.mark.parametrize("space", [s for s in SPACES if patch_names(s)], ids=lambda p: p.name)
def test_shipped_space_patches_pass_init_checks(space: Path) -> None:
    try:
        git.Repo(ROOT)
    except git.InvalidGitRepositoryError:
        pytest.skip("not a git checkout")
    files = check_space_patches(space, ROOT, ["workloads/**"])
    assert len(files) == len({n for v in patch_names(space) for n in patch_set(v)})
