"""Single-device Mixtral-style MoE layer and model (no parallelism here).

A token ``x [dim]`` is routed by ``softmax(router(x))``; its top-k experts' SwiGLU outputs are
summed with the renormalised top-k weights. Experts are stored batched (``w1 [E, F, dim]``,
``w2 [E, dim, F]``, ``w3 [E, F, dim]``) so expert parallelism can slice them.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from ..dense.model import ModelArgs, NormalLinear, Transformer, normal_init_, output_std


class GroupedExperts(nn.Module):
    """``E`` SwiGLU experts held as three batched weight tensors."""

    def __init__(
        self, num_experts: int, dim: int, hidden: int, std: float = 0.02, out_std: float = 0.02
    ) -> None:
        """Weights drawn from N(0, std) (``w1``, ``w3``) and N(0, out_std) (``w2``) here."""
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden, dim))
        normal_init_(self.w1, std)
        normal_init_(self.w2, out_std)
        normal_init_(self.w3, std)

    @property
    def num_experts(self) -> int:
        return int(self.w1.shape[0])

    def expert_forward(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Apply local expert ``e`` to ``x [n, dim]``; returns ``[n, dim]``."""
        w1, w2, w3 = self.w1[e], self.w2[e], self.w3[e]
        xc = x.to(w1.dtype)
        y = F.linear(F.silu(F.linear(xc, w1)) * F.linear(xc, w3), w2)
        return y.to(x.dtype)

    def run(self, x: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        """``x [n, dim]`` rows sorted by ``expert_ids [n]`` (local ids) -> outputs ``[n, dim]``."""
        counts = torch.bincount(expert_ids, minlength=self.num_experts).tolist()
        outs = []
        for e, chunk in enumerate(torch.split(x, counts)):
            if counts[e]:
                outs.append(self.expert_forward(e, chunk))
        return torch.cat(outs) if outs else x.new_zeros((0, x.shape[-1]))


class Dispatcher(Protocol):
    def __call__(
        self, x: torch.Tensor, expert_ids: torch.Tensor, experts: GroupedExperts
    ) -> torch.Tensor: ...


def local_dispatch(
    x: torch.Tensor, expert_ids: torch.Tensor, experts: GroupedExperts
) -> torch.Tensor:
    """Every expert is on this rank: just run them."""
    return experts.run(x, expert_ids)


class MoELayer(nn.Module):
    """Top-k router + experts. ``dispatch`` moves sorted token copies to their experts and back
    (local by default; ``expert_parallel.parallelize_moe`` swaps in an all-to-all)."""

    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.top_k = a.top_k
        self.num_experts = a.num_experts
        self.router = NormalLinear(a.dim, a.num_experts, a.init_std)
        self.experts = GroupedExperts(
            a.num_experts, a.dim, a.expert_hidden, a.init_std, output_std(a)
        )
        self.dispatch: Dispatcher = local_dispatch

    def get_experts(self) -> GroupedExperts:
        """The experts this rank runs: all of them, or under expert parallelism the local shard
        (kept out of the module's registered parameters, see ``expert_parallel``)."""
        ep = self.__dict__.get("_ep_experts")
        return ep if ep is not None else self.experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        xt = x.reshape(-1, shape[-1])  # [T, dim]
        logits = self.router(xt).float()
        topv, topi = torch.topk(logits, self.top_k, dim=-1)  # [T, k]
        weights = torch.softmax(topv, dim=-1).to(x.dtype)
        flat_e = topi.reshape(-1)  # [T*k]
        order = torch.argsort(flat_e, stable=True)
        token_idx = order // self.top_k
        y = self.dispatch(xt[token_idx], flat_e[order], self.get_experts())
        y = y * weights.reshape(-1)[order].unsqueeze(-1)
        out = torch.zeros_like(xt).index_add_(0, token_idx, y)
        return out.reshape(shape)


FLAVOURS: dict[str, ModelArgs] = {
    "debug": ModelArgs(num_experts=8, top_k=2, expert_hidden=256),
    "8x1b": ModelArgs(
        dim=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        vocab_size=128256,
        max_seq_len=4096,
        rope_theta=500000.0,
        num_experts=8,
        top_k=2,
        expert_hidden=8192,
    ),
    # Mixtral-8x7B's published architecture (46.7e9 parameters): 32 layers, hidden 4096, 32 heads
    # (8 KV), 8 SwiGLU experts of 14336, top-2, vocab 32000, RoPE base 1e6, 32k context. The
    # reference workloads cut it down with ``model.overrides`` and say what they cut.
    "8x7b": ModelArgs(
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        vocab_size=32000,
        max_seq_len=32768,
        rope_theta=1e6,
        num_experts=8,
        top_k=2,
        expert_hidden=14336,
    ),
}
"""MoE flavours by name; GPU-scale ones are only built by name on a GPU."""


def build_moe_transformer(
    args: ModelArgs, activation_checkpointing: str = "none", **_: Any
) -> Transformer:
    """A ``Transformer`` whose every FFN is a ``MoELayer``."""
    if args.num_experts < args.top_k or args.top_k < 1:
        raise ValueError(
            f"MoE needs 1 <= top_k <= num_experts, got top_k={args.top_k}, num_experts={args.num_experts}"
        )
    return Transformer(args, activation_checkpointing, ffn_factory=lambda a, i: MoELayer(a))
