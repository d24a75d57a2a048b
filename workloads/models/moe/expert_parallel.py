"""Expert parallelism for the MoE family: each of ``ep_size`` ranks holds ``E / ep_size``
experts, and token copies travel to their expert's rank and back with
``torch.distributed.all_to_all_single`` (gloo supports it).

Gradients: a local expert receives gradient from every rank's tokens (the backward of the
all-to-all sends it home), i.e. the *sum* over ranks of each rank's loss gradient. Data-parallel
training averages gradients over ranks, so the local expert gradients are divided by the
data-parallel world size (``finish_expert_grads``). Expert parameters must therefore NOT go
through DeepSpeed's data-parallel reduction (it would average rank 0's experts with rank 1's
different experts): ``parallelize_moe`` keeps them out of the module's registered parameters,
and the harness steps them with its own optimizer (``expert_parameters``).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from .model import GroupedExperts, MoELayer

COMM_TIME_S: list[float] = [0.0]
"""Seconds spent in expert-parallel all-to-alls in this process (the harness reads the delta)."""


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):  # type: ignore[override]
        ctx.splits = (out_splits, in_splits)
        ctx.group = group
        return _exchange(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        out_splits, in_splits = ctx.splits
        return _exchange(grad, in_splits, out_splits, ctx.group), None, None, None


def _exchange(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    """``all_to_all_single`` of rows ``x [sum(in_splits), dim]`` (fp32 on the wire)."""
    t0 = time.perf_counter()
    send = x.float().contiguous()
    out = send.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, send, out_splits, in_splits, group=group)
    COMM_TIME_S[0] += time.perf_counter() - t0
    return out.to(x.dtype)


class AllToAllDispatch:
    """Dispatcher: send sorted token copies to the rank owning their expert, run the local
    experts there, send the outputs back in the original order."""

    def __init__(self, group, ep_size: int, ep_rank: int, experts_per_rank: int) -> None:
        self.group, self.ep_size, self.ep_rank, self.epr = group, ep_size, ep_rank, experts_per_rank

    def __call__(
        self, x: torch.Tensor, expert_ids: torch.Tensor, experts: GroupedExperts
    ) -> torch.Tensor:
        t0 = time.perf_counter()
        dest = expert_ids // self.epr
        send_counts = torch.bincount(dest, minlength=self.ep_size)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()
        recv_ids = expert_ids.new_empty(sum(recv_splits))
        dist.all_to_all_single(
            recv_ids, expert_ids.contiguous(), recv_splits, send_splits, group=self.group
        )
        COMM_TIME_S[0] += time.perf_counter() - t0
        recv_x = _AllToAll.apply(x, recv_splits, send_splits, self.group)
        local_ids = recv_ids - self.ep_rank * self.epr
        order = torch.argsort(local_ids, stable=True)
        y_sorted = experts.run(recv_x[order], local_ids[order])
        y = torch.empty_like(y_sorted).index_copy_(0, order, y_sorted)
        return _AllToAll.apply(y, send_splits, recv_splits, self.group)


def moe_layers(model: nn.Module) -> list[MoELayer]:
    return [m for m in model.modules() if isinstance(m, MoELayer)]


def parallelize_moe(model: nn.Module, group=None) -> nn.Module:
    """Shard every ``MoELayer``'s experts over the ranks of ``group`` (ep_size = its size).
    Rank r keeps experts ``[r*E/ep, (r+1)*E/ep)`` with their already-initialised weights, so
    an expert-parallel model starts from exactly the data-parallel model's parameters."""
    ep_size = dist.get_world_size(group)
    ep_rank = dist.get_rank(group)
    for layer in moe_layers(model):
        full = layer.experts
        if full.num_experts % ep_size:
            raise ValueError(
                f"num_experts ({full.num_experts}) must be divisible by the expert-parallel size ({ep_size})"
            )
        epr = full.num_experts // ep_size
        lo, hi = ep_rank * epr, (ep_rank + 1) * epr
        # on the full experts' device and dtype: these weights are hidden from DeepSpeed, which
        # would otherwise have moved and cast them with the rest of the model
        local = GroupedExperts(epr, full.w1.shape[2], full.w1.shape[1]).to(
            device=full.w1.device, dtype=full.w1.dtype
        )
        with torch.no_grad():
            for name in ("w1", "w2", "w3"):
                getattr(local, name).copy_(getattr(full, name)[lo:hi])
        del layer.experts  # unregister: DeepSpeed must not reduce these across ranks
        layer.__dict__["_ep_experts"] = local
        layer.dispatch = AllToAllDispatch(group, ep_size, ep_rank, epr)
    return model


def expert_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The rank-local expert parameters hidden from DeepSpeed (empty when not parallelised)."""
    out: list[nn.Parameter] = []
    for layer in moe_layers(model):
        ep = layer.__dict__.get("_ep_experts")
        if ep is not None:
            out.extend(ep.parameters())
    return out


def finish_expert_grads(params: list[nn.Parameter], dp_world_size: int) -> None:
    """Turn the summed-over-ranks expert gradients into the data-parallel mean."""
    for p in params:
        if p.grad is not None:
            p.grad.div_(dp_world_size)


def gather_full_experts(model: nn.Module, group=None) -> dict[str, torch.Tensor]:
    """All-gather every layer's expert shards into full ``[E, ...]`` tensors, keyed like the
    single-device model's state dict (``layers.{i}.feed_forward.experts.w1``...)."""
    out: dict[str, torch.Tensor] = {}
    ep_size = dist.get_world_size(group)
    for name, mod in model.named_modules():
        if isinstance(mod, MoELayer) and mod.__dict__.get("_ep_experts") is not None:
            local = mod.__dict__["_ep_experts"]
            for w in ("w1", "w2", "w3"):
                t = getattr(local, w).detach().float().contiguous()
                parts = [torch.empty_like(t) for _ in range(ep_size)]
                dist.all_gather(parts, t, group=group)
                out[f"{name}.experts.{w}"] = torch.cat(parts)
    return out
