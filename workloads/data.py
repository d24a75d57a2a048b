"""Synthetic, learnable, fixed-seed data owned by the harness.

The source is a random sparse Markov chain over the vocabulary: every token has ``fanout``
possible successors with fixed random probabilities, so a model can learn it (the loss falls
from ln(vocab) toward the chain's entropy rate). Global batch ``step`` is a pure function of
``(seed, step)``: every rank generates the same ``[global_batch, seq_len + 1]`` tokens and takes
its own rows, so losses compare across micro-batch splits and rank counts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

EVAL_STREAM = -1
"""Stream number of the held-out eval batch (no training step draws from it)."""


def stream_seed(seed: int, stream: int) -> int:
    """63-bit generator seed of stream ``stream`` (a step) of data seed ``seed``. Hashed, because
    torch's CPU generator keeps only 32 bits of what it is seeded with (so no ``seed + step``)."""
    digest = hashlib.sha256(f"infrarsi-data:{seed}:{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass(frozen=True)
class Batch:
    """Inputs and next-token targets, both ``[rows, seq_len]`` int64."""

    inputs: torch.Tensor
    targets: torch.Tensor


class MarkovSource:
    """Fixed random sparse Markov chain over ``vocab_size`` tokens."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int, fanout: int = 16) -> None:
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        g = torch.Generator().manual_seed(seed)
        self.successors = torch.randint(0, vocab_size, (vocab_size, fanout), generator=g)
        self.probs = torch.softmax(2.0 * torch.randn(vocab_size, fanout, generator=g), dim=-1)

    def _generate(self, rows: int, stream_step: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(stream_seed(self.seed, stream_step))
        out = torch.empty(rows, self.seq_len + 1, dtype=torch.long)
        out[:, 0] = torch.randint(0, self.vocab_size, (rows,), generator=g)
        for t in range(1, self.seq_len + 1):
            prev = out[:, t - 1]
            pick = torch.multinomial(self.probs[prev], 1, generator=g).squeeze(1)
            out[:, t] = self.successors[prev, pick]
        return out

    def global_batch(self, step: int, global_batch_size: int) -> Batch:
        """Global batch ``step``: ``[global_batch_size, seq_len]`` inputs and targets."""
        if step < 0:
            raise ValueError(f"training step must be >= 0, got {step}")
        toks = self._generate(global_batch_size, step)
        return Batch(toks[:, :-1], toks[:, 1:])

    def rank_micro_batches(
        self, step: int, global_batch_size: int, rank: int, world_size: int, micro_batch_size: int
    ) -> list[Batch]:
        """Rank ``rank``'s rows of global batch ``step`` (contiguous block of
        ``global_batch_size / world_size`` rows), split into micro-batches in order."""
        per_rank = global_batch_size // world_size
        if per_rank * world_size != global_batch_size or per_rank % micro_batch_size:
            raise ValueError(
                f"global batch {global_batch_size} does not split into {world_size} ranks x "
                f"micro-batches of {micro_batch_size}"
            )
        b = self.global_batch(step, global_batch_size)
        lo = rank * per_rank
        return [
            Batch(b.inputs[i : i + micro_batch_size], b.targets[i : i + micro_batch_size])
            for i in range(lo, lo + per_rank, micro_batch_size)
        ]

    def eval_batch(self, rows: int = 16) -> Batch:
        """The fixed held-out batch (a stream no training step ever draws from)."""
        toks = self._generate(rows, EVAL_STREAM)
        return Batch(toks[:, :-1], toks[:, 1:])
