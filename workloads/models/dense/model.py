"""Single-device Llama-style transformer (torchtitan style: no parallelism in this file).

Shapes: ``tokens`` is ``[batch, seq]`` (int64); ``Transformer.forward`` returns logits
``[batch, seq, vocab]``, or, given ``targets``, their mean cross-entropy computed by the output
module without the logits (``OutputHead``: the ``fused_loss_tokens`` knob). Activation
checkpointing is a build option (``none``, ``selective``: the attention sub-layer of every block,
``full``: every block) applied with ``torch.utils.checkpoint`` (non-reentrant), so it changes
memory and time, never the numbers.

Every module draws its own weights inside its own ``__init__`` (``NormalLinear``,
``NormalEmbedding``), in construction order, never in a pass over the finished model: so the
model can be built straight on a GPU (``torch.device``) or under DeepSpeed's ``zero.Init``
(which partitions each module's parameters as soon as that module is built) and start from the
same values either way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from infrarsi.execution.knobs.fused_loss import fused_linear_cross_entropy


@dataclass(frozen=True)
class ModelArgs:
    """Architecture of one flavour."""

    dim: int = 256
    """Hidden size."""
    n_layers: int = 4
    """Transformer blocks."""
    n_heads: int = 4
    """Attention heads (head_dim = dim / n_heads)."""
    n_kv_heads: int | None = None
    """Key/value heads for grouped-query attention (None: n_heads)."""
    vocab_size: int = 4096
    """Vocabulary size."""
    ffn_hidden: int = 682
    """SwiGLU inner size (Llama: 2/3 of 4 x dim)."""
    max_seq_len: int = 128
    """Longest sequence RoPE is precomputed for."""
    rope_theta: float = 10000.0
    """RoPE base."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    init_std: float = 0.02
    """Std of the normal init of every weight matrix."""
    # MoE fields (ignored by the dense family)
    num_experts: int = 0
    """Experts per MoE layer (0: dense)."""
    top_k: int = 2
    """Experts each token is routed to."""
    expert_hidden: int = 256
    """SwiGLU inner size of one expert."""

    def with_overrides(self, overrides: dict[str, Any]) -> ModelArgs:
        unknown = sorted(set(overrides) - set(self.__dataclass_fields__))
        if unknown:
            raise ValueError(
                f"unknown model override(s) {unknown}; valid fields: {sorted(self.__dataclass_fields__)}"
            )
        return replace(self, **overrides)


FLAVOURS: dict[str, ModelArgs] = {
    "debug": ModelArgs(),
    "1b": ModelArgs(
        dim=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        vocab_size=128256,
        ffn_hidden=8192,
        max_seq_len=4096,
        rope_theta=500000.0,
    ),
    "8b": ModelArgs(
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        vocab_size=128256,
        ffn_hidden=14336,
        max_seq_len=8192,
        rope_theta=500000.0,
    ),
}
"""Dense flavours by name; GPU-scale ones are only built by name on a GPU."""


def output_std(a: ModelArgs) -> float:
    """Std of the matrices that write into the residual stream (attention ``wo``, FFN ``w2``)."""
    return a.init_std / math.sqrt(2 * a.n_layers)


def normal_init_(t: torch.Tensor, std: float) -> None:
    """Fill ``t`` from N(0, std) drawn in fp32 whatever ``t``'s dtype: under ZeRO-3's
    ``zero.Init`` a bf16 job's parameters are already bf16 when built, and drawing in fp32 then
    rounding gives the very values (and random stream) of an fp32 build cast to bf16 later."""
    with torch.no_grad():
        scratch = torch.empty_like(t, dtype=torch.float32)
        nn.init.normal_(scratch, std=std)
        t.copy_(scratch)


class NormalLinear(nn.Linear):
    """Bias-free ``nn.Linear`` whose weight is drawn from N(0, std) when it is built (its
    ``reset_parameters``, which ``nn.Linear.__init__`` calls: no other draw)."""

    def __init__(self, in_features: int, out_features: int, std: float) -> None:
        self.init_std = std  # read by reset_parameters during nn.Linear.__init__
        super().__init__(in_features, out_features, bias=False)

    def reset_parameters(self) -> None:
        normal_init_(self.weight, self.init_std)


class NormalEmbedding(nn.Embedding):
    """``nn.Embedding`` whose weight is drawn from N(0, std) when it is built."""

    def __init__(self, num_embeddings: int, dim: int, std: float) -> None:
        self.init_std = std
        super().__init__(num_embeddings, dim)

    def reset_parameters(self) -> None:
        normal_init_(self.weight, self.init_std)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


def rope_tables(head_dim: int, seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``[seq, head_dim/2]``, fp32, on the device the model is built on. Positions
    are integer ``arange``s turned float64 by ``.to``: under ZeRO-3's ``zero.Init`` torch's float
    constructors return the training dtype (bf16 cannot hold positions past 256), integer ones do
    not, and both land on the build device."""
    inv = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float64) / head_dim)
    )
    ang = torch.outer(torch.arange(seq_len, dtype=torch.int64).to(torch.float64), inv)
    return ang.cos().float(), ang.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[b, heads, seq, head_dim]`` pairwise by the RoPE angles."""
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
    c, s = cos[: x.shape[-2]], sin[: x.shape[-2]]
    out = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.n_heads = a.n_heads
        self.n_kv_heads = a.n_kv_heads or a.n_heads
        self.head_dim = a.dim // a.n_heads
        self.wq = NormalLinear(a.dim, a.dim, a.init_std)
        self.wk = NormalLinear(a.dim, self.n_kv_heads * self.head_dim, a.init_std)
        self.wv = NormalLinear(a.dim, self.n_kv_heads * self.head_dim, a.init_std)
        self.wo = NormalLinear(a.dim, a.dim, output_std(a))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.n_kv_heads != self.n_heads:
            rep = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, d))


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.w1 = NormalLinear(a.dim, a.ffn_hidden, a.init_std)
        self.w2 = NormalLinear(a.ffn_hidden, a.dim, output_std(a))
        self.w3 = NormalLinear(a.dim, a.ffn_hidden, a.init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``h + ffn(norm(h))``."""

    def __init__(self, a: ModelArgs, ffn: nn.Module) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(a.dim, a.norm_eps)
        self.attention = Attention(a)
        self.ffn_norm = RMSNorm(a.dim, a.norm_eps)
        self.feed_forward = ffn
        self.checkpoint_attention: bool = False

    def _attn(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.attention(self.attention_norm(x), cos, sin)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.checkpoint_attention and torch.is_grad_enabled():
            h = x + checkpoint(self._attn, x, cos, sin, use_reentrant=False)
        else:
            h = x + self._attn(x, cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


CHECKPOINT_MODES = ("none", "selective", "full")


class Transformer(nn.Module):
    """Llama-style decoder. ``ffn_factory(args, layer_id)`` builds each block's FFN (the MoE
    family passes its MoE layer)."""

    def __init__(
        self,
        args: ModelArgs,
        activation_checkpointing: str = "none",
        ffn_factory: Callable[[ModelArgs, int], nn.Module] | None = None,
    ) -> None:
        super().__init__()
        if activation_checkpointing not in CHECKPOINT_MODES:
            raise ValueError(
                f"activation_checkpointing must be one of {CHECKPOINT_MODES}, got {activation_checkpointing!r}"
            )
        self.args = args
        make_ffn = ffn_factory or (lambda a, i: FeedForward(a))
        self.tok_embeddings = NormalEmbedding(args.vocab_size, args.dim, args.init_std)
        self.layers = nn.ModuleList(Block(args, make_ffn(args, i)) for i in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = OutputHead(args.dim, args.vocab_size, args.init_std)
        cos, sin = rope_tables(args.dim // args.n_heads, args.max_seq_len, args.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.set_checkpointing(activation_checkpointing)

    def set_checkpointing(self, mode: str) -> None:
        self.checkpointing = mode
        for blk in self.layers:
            blk.checkpoint_attention = mode == "selective"  # type: ignore[assignment]

    def forward(
        self, tokens: torch.Tensor, targets: torch.Tensor | None = None, loss_chunk: int = 0
    ) -> torch.Tensor:
        """``tokens [b, s]`` -> logits ``[b, s, vocab]``; with ``targets [b, s]``, their mean
        cross-entropy, ``loss_chunk`` tokens at a time without the logits (``OutputHead``)."""
        h = self.tok_embeddings(tokens)
        cos, sin = self.rope_cos, self.rope_sin
        for blk in self.layers:
            if self.checkpointing == "full" and torch.is_grad_enabled():
                h = checkpoint(blk, h, cos, sin, use_reentrant=False)
            else:
                h = blk(h, cos, sin)
        out: torch.Tensor = self.output(self.norm(h), targets, loss_chunk)
        return out


class OutputHead(NormalLinear):
    """The output projection to the vocabulary: the logits, or, given targets, their mean
    cross-entropy fused with the projection a chunk of tokens at a time (the logits never whole:
    ``fused_linear_cross_entropy``). Done in this module's own ``forward``, so ZeRO-3 has gathered
    the weight; the parameter's name (``output.weight``) is the plain linear's."""

    def forward(
        self, x: torch.Tensor, targets: torch.Tensor | None = None, loss_chunk: int = 0
    ) -> torch.Tensor:
        if targets is None:
            return super().forward(x)
        return fused_linear_cross_entropy(x, self.weight, targets, loss_chunk)
