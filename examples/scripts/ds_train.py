"""A plain DeepSpeed training script, the kind a team already has; infrarsi tunes it unchanged.

Today it is launched as::

    deepspeed examples/scripts/ds_train.py --deepspeed --deepspeed_config examples/scripts/ds.json

and infrarsi runs the same line on its ranks (``examples/scripts/ds_train.yaml``). Nothing in
here knows about infrarsi: its own argparse (DeepSpeed's ``add_config_arguments`` and
``--local_rank``), its own tiny causal LM, its own deterministic data (each global batch is a
pure function of the seed and the step; every rank takes its rows of it), its own loop of
``engine(batch)``, ``engine.backward(loss)``, ``engine.step()``. It reads the micro-batch size
and gradient accumulation from the engine, so a tuned DeepSpeed config reaches its loop.

``--report_engine PATH`` (optional) writes what DeepSpeed built for this rank (ZeRO stage,
micro-batch, accumulation) to ``PATH.<rank>.json``; ``--crash_at_step N`` and ``--exit_at_step N``
fail on purpose (the tests use them).
"""

from __future__ import annotations

import argparse
import json
import os

import deepspeed
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """Causal self-attention and an MLP, pre-norm, residual."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (
            self.qkv(self.norm1(x))
            .view(b, s, 3, self.heads, d // self.heads)
            .permute(2, 0, 3, 1, 4)
        )
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """Token ids ``[batch, seq]`` -> logits ``[batch, seq, vocab]``."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq_len: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq_len, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def global_batch(
    step: int, rows: int, seq_len: int, vocab: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's whole batch, ``[rows, seq_len]`` inputs and next-token targets: a noisy affine
    chain (learnable), fixed by (seed, step) whatever the micro-batch split."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.empty(rows, seq_len + 1, dtype=torch.long)
    x[:, 0] = torch.randint(0, vocab, (rows,), generator=g)
    for t in range(1, seq_len + 1):
        x[:, t] = (x[:, t - 1] * 7 + 3) % vocab
    noise = torch.rand(rows, seq_len + 1, generator=g) < 0.1
    x = torch.where(noise, torch.randint(0, vocab, x.shape, generator=g), x)
    return x[:, :-1], x[:, 1:]


def main() -> None:
    parser = argparse.ArgumentParser(description="Train a tiny LM with DeepSpeed.")
    parser.add_argument("--local_rank", type=int, default=-1, help="Set by the deepspeed launcher.")
    parser.add_argument("--steps", type=int, default=200, help="Optimizer steps to train.")
    parser.add_argument("--seq_len", type=int, default=64, help="Tokens per sequence.")
    parser.add_argument("--vocab", type=int, default=512, help="Vocabulary size.")
    parser.add_argument("--dim", type=int, default=64, help="Hidden size.")
    parser.add_argument("--layers", type=int, default=2, help="Transformer blocks.")
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate.")
    parser.add_argument("--seed", type=int, default=1234, help="Seed of the weights and the data.")
    parser.add_argument(
        "--data_seed",
        type=int,
        default=None,
        help="Seed of the data (default: --seed); -1 draws a new one each run, as an unseeded "
        "shuffle does (the doctor refuses such a job).",
    )
    parser.add_argument(
        "--report_engine", default=None, help="Write the engine's settings to PATH.<rank>.json."
    )
    parser.add_argument("--crash_at_step", type=int, default=-1, help="Raise at this step (tests).")
    parser.add_argument(
        "--exit_at_step", type=int, default=-1, help="sys.exit(3) at this step (tests)."
    )
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    deepspeed.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = TinyLM(args.vocab, args.dim, args.layers, heads=4, seq_len=args.seq_len)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95))
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, optimizer=optimizer)
    data_seed = args.seed if args.data_seed is None else args.data_seed
    if data_seed == -1:
        data_seed = int.from_bytes(os.urandom(4), "little")
        t = torch.tensor([data_seed], dtype=torch.long, device=engine.device)
        dist.broadcast(t, src=0)  # every rank takes its rows of the same global batch
        data_seed = int(t)

    micro, accum = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    if args.report_engine:
        with open(f"{args.report_engine}.{rank}.json", "w") as f:
            json.dump(
                {
                    "zero_stage": engine.zero_optimization_stage(),
                    "micro_batch_size": micro,
                    "gradient_accumulation_steps": accum,
                    "train_batch_size": engine.train_batch_size(),
                },
                f,
            )
    per_rank = micro * accum
    for step in range(args.steps):
        if step == args.crash_at_step:
            raise RuntimeError(f"ds_train.py: deliberate crash at step {step} (--crash_at_step)")
        if step == args.exit_at_step:
            raise SystemExit(3)
        inputs, targets = global_batch(step, per_rank * world, args.seq_len, args.vocab, data_seed)
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        inputs, targets = inputs[mine].to(engine.device), targets[mine].to(engine.device)
        for i in range(accum):
            rows = slice(i * micro, (i + 1) * micro)
            logits = engine(inputs[rows])
            loss = F.cross_entropy(
                logits.float().reshape(-1, args.vocab), targets[rows].reshape(-1)
            )
            engine.backward(loss)
            engine.step()
        if rank == 0 and step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
