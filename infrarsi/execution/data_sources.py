"""The harness's data sources: a synthetic Markov chain (default) and a file of token ids.

Both give global batch ``step`` as a pure function of ``step``, and every rank takes its own
rows of it (``rank_micro_batches``), so losses compare across micro-batch splits and rank
counts. A job can bring its own loader instead (``TrainingJob.global_batch``, ``JobSource``).

The synthetic source is a random sparse Markov chain over the vocabulary: every token has
``fanout`` possible successors with fixed random probabilities, so a model can learn it (the loss
falls from ln(vocab) toward the chain's entropy rate); global batch ``step`` is a pure function
of ``(seed, step)``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from infrarsi.errors import WorkloadError
from infrarsi.job import TokenBatch

if TYPE_CHECKING:
    from infrarsi.job import TrainingJob
    from infrarsi.workload import DataSpec

Batch = TokenBatch
"""The rows of one (micro-)batch: ``inputs`` and ``targets`` ``[rows, seq_len]`` int64."""

EVAL_STREAM = -1
"""Stream number of the held-out eval batch (no training step draws from it)."""

EVAL_ROWS = 4
"""Sequences in the held-out eval batch of the end-of-trial eval check (enough to tell a model
whose math or weights changed; each row costs a forward pass of the trained model in fp32)."""


def stream_seed(seed: int, stream: int) -> int:
    """63-bit generator seed of stream ``stream`` (a step) of data seed ``seed``. Hashed, because
    torch's CPU generator keeps only 32 bits of what it is seeded with (so no ``seed + step``)."""
    digest = hashlib.sha256(f"infrarsi-data:{seed}:{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def split_rows(
    b: Batch, global_batch_size: int, rank: int, world_size: int, micro_batch_size: int
) -> list[Batch]:
    """Rank ``rank``'s rows of global batch ``b`` (contiguous block of ``global_batch_size /
    world_size`` rows), split into micro-batches in order."""
    per_rank = global_batch_size // world_size
    if per_rank * world_size != global_batch_size or per_rank % micro_batch_size:
        raise ValueError(
            f"global batch {global_batch_size} does not split into {world_size} ranks x "
            f"micro-batches of {micro_batch_size}"
        )
    lo = rank * per_rank
    return [
        Batch(b.inputs[i : i + micro_batch_size], b.targets[i : i + micro_batch_size])
        for i in range(lo, lo + per_rank, micro_batch_size)
    ]


class _Source:
    """Shared by the sources: a rank's micro-batches of a global batch."""

    def global_batch(self, step: int, global_batch_size: int) -> Batch:
        raise NotImplementedError

    def eval_batch(self, rows: int = EVAL_ROWS) -> Batch:
        raise NotImplementedError

    def rank_micro_batches(
        self, step: int, global_batch_size: int, rank: int, world_size: int, micro_batch_size: int
    ) -> list[Batch]:
        """Rank ``rank``'s rows of global batch ``step`` (``split_rows``)."""
        return split_rows(
            self.global_batch(step, global_batch_size),
            global_batch_size,
            rank,
            world_size,
            micro_batch_size,
        )


class MarkovSource(_Source):
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

    def eval_batch(self, rows: int = EVAL_ROWS) -> Batch:
        """The fixed held-out batch (a stream no training step ever draws from)."""
        toks = self._generate(rows, EVAL_STREAM)
        return Batch(toks[:, :-1], toks[:, 1:])


TOKEN_DTYPES: dict[str, np.dtype] = {
    "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
}
"""``data.dtype`` of a raw token file -> its numpy dtype (``.npy`` files carry their own)."""


class TokenFileSource(_Source):
    """The user's own tokens: a 1-D file of token ids (``.npy``, or raw ``uint16``/``uint32``/...
    as nanoGPT's ``.bin``), memory-mapped. Global batch ``step`` holds consecutive windows of
    ``seq_len + 1`` tokens from offset ``step x rows x seq_len`` (wrapping around); the eval batch
    comes from the last ``eval_rows x (seq_len + 1)`` tokens, which training never reads."""

    def __init__(
        self,
        path: str | Path,
        seq_len: int,
        vocab_size: int,
        *,
        dtype: str = "uint16",
        eval_rows: int = EVAL_ROWS,
        source: str = "data.path",
    ) -> None:
        p = Path(path)
        if not p.exists():
            raise WorkloadError(
                f"{source}: token file {str(p)!r} does not exist; give a .npy or raw "
                f"token-id file (path relative to the workload YAML)."
            )
        if p.suffix == ".npy":
            arr = np.load(p, mmap_mode="r")
        else:
            if dtype not in TOKEN_DTYPES:
                raise WorkloadError(
                    f"{source}: data.dtype {dtype!r} is unknown; valid: {sorted(TOKEN_DTYPES)}."
                )
            arr = np.memmap(p, dtype=TOKEN_DTYPES[dtype], mode="r")
        if arr.ndim != 1:
            raise WorkloadError(
                f"{source}: token file {p} must be 1-D token ids, got shape {arr.shape}."
            )
        self.tokens, self.seq_len, self.vocab_size = arr, seq_len, vocab_size
        self.eval_rows = eval_rows
        self._eval_len = eval_rows * (seq_len + 1)
        self._train_len = len(arr) - self._eval_len
        if self._train_len < seq_len + 1:
            raise WorkloadError(
                f"{source}: token file {p} holds {len(arr)} tokens; it needs at least "
                f"{(eval_rows + 1) * (seq_len + 1)} (one training window of seq_len + 1 "
                f"plus {eval_rows} held-out eval windows)."
            )

    def _windows(self, starts: list[int], base: int) -> Batch:
        rows = [
            np.asarray(self.tokens[base + s : base + s + self.seq_len + 1], dtype=np.int64)
            for s in starts
        ]
        toks = torch.from_numpy(np.stack(rows))
        hi = int(toks.max()) if toks.numel() else 0
        if hi >= self.vocab_size or int(toks.min()) < 0:
            raise WorkloadError(
                f"token file holds id {hi} outside the model's vocabulary [0, {self.vocab_size})."
            )
        return Batch(toks[:, :-1], toks[:, 1:])

    def global_batch(self, step: int, global_batch_size: int) -> Batch:
        """Global batch ``step``: ``[global_batch_size, seq_len]`` consecutive windows."""
        if step < 0:
            raise ValueError(f"training step must be >= 0, got {step}")
        span = self._train_len - self.seq_len - 1
        starts = [
            ((step * global_batch_size + r) * self.seq_len) % (span + 1)
            for r in range(global_batch_size)
        ]
        return self._windows(starts, 0)

    def eval_batch(self, rows: int = EVAL_ROWS) -> Batch:
        """The held-out batch: windows from the file's last tokens."""
        n = min(rows, self.eval_rows)
        return self._windows([r * (self.seq_len + 1) for r in range(n)], self._train_len)


class JobSource(_Source):
    """The job's own loader (``TrainingJob.global_batch`` / ``eval_batch``), with the harness's
    synthetic source as the eval fallback."""

    def __init__(
        self,
        global_batch: Callable[[int, int], Batch],
        eval_batch: Callable[[], Batch] | None,
        fallback: _Source,
    ) -> None:
        self._global, self._eval, self._fallback = global_batch, eval_batch, fallback

    def global_batch(self, step: int, global_batch_size: int) -> Batch:
        b = self._global(step, global_batch_size)
        return Batch(
            torch.as_tensor(b.inputs, dtype=torch.long),
            torch.as_tensor(b.targets, dtype=torch.long),
        )

    def eval_batch(self, rows: int = EVAL_ROWS) -> Batch:
        if self._eval is None:
            return self._fallback.eval_batch(rows)  # type: ignore[attr-defined, no-any-return]
        return self._eval()


def make_source(
    data: DataSpec, vocab_size: int, *, job: TrainingJob | None = None, data_path: str | None = None
) -> _Source:
    """The data source a trial trains on: the job's own loader when it has one, else the
    workload's ``data`` (``synthetic``, or ``tokens`` from ``data_path``: ``data.path`` resolved
    against the workload YAML's folder by the driver)."""
    if data.kind == "tokens":
        path = data_path or data.path or ""
        base: _Source = TokenFileSource(path, data.seq_len, vocab_size, dtype=data.dtype)
    else:
        base = MarkovSource(vocab_size, data.seq_len, data.seed)
    if job is not None and job.global_batch is not None:
        return JobSource(job.global_batch, job.eval_batch, base)
    return base
