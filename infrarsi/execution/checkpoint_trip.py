"""A DeepSpeed checkpoint round trip inside one trial (the long check's mid-horizon restart).

A trial whose spec has ``checkpoint_step`` S (``rank_loop``) saves a DeepSpeed checkpoint
(``engine.save_checkpoint``) right after optimizer step S and trains on, uninterrupted, to the
last step. After its end-of-trial checks the engine is destroyed and rebuilt from scratch (the
same knob config, a fresh ``job.build_model()``, a fresh optimizer, ``deepspeed.initialize``),
the checkpoint is loaded (``engine.load_checkpoint``, module strict) and training continues from
step S with the same harness-owned batches (indexed by step, rank and micro-batch). The
continued losses are reported beside the uninterrupted ones; ``long_check`` compares them.

A load that raises (a parameter renamed, missing or added; a shape changed) is caught and
described (``describe_load_error``: which keys), every rank learns that some rank failed (an
all-reduced flag, so no rank waits in a collective the others skipped), and the trial itself
stays ``ok``: the uninterrupted run was measured in full.

Where the files go: one temporary directory whose name rank 0 picks and broadcasts; every rank
creates it on its own node (DeepSpeed writes each rank's shards there). Removed after the load.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

CHECKPOINT_TAG_PREFIX = "infrarsi-step"
"""Tag of the saved checkpoint: ``infrarsi-step<S>``."""
KEYS_SHOWN = 5
"""How many missing / unexpected parameter names an error names (then a count)."""


@dataclass
class RoundTrip:
    """What a rank reports of the checkpoint round trip (``RankResult.checkpoint``)."""

    step: int
    """Optimizer steps done when the checkpoint was saved; the continued run starts at this step."""
    loss: list[float] = field(default_factory=list)
    """Global mean training loss of each continued step (steps ``step`` .. last), harness-computed
    as in the uninterrupted run; empty when the load failed or nothing ran."""
    error: str = ""
    """Why the round trip failed (save, rebuild or load; ``describe_load_error``); empty when it ran."""
    skipped: str = ""
    """Why no round trip was tried (training stopped before ``step``, expert parallelism); empty otherwise."""
    save_s: float = 0.0
    """Seconds ``engine.save_checkpoint`` took."""
    restart_s: float = 0.0
    """Seconds of the rebuild and ``engine.load_checkpoint``."""
    continue_s: float = 0.0
    """Seconds of the continued steps."""
    checkpoint_bytes: int = 0
    """Bytes of the checkpoint files this rank saw on its node."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def shared_temp_dir() -> str:
    """A fresh directory name chosen by rank 0 and known to every rank (created on each node)."""
    box: list[Any] = [tempfile.mkdtemp(prefix="infrarsi-ckpt-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    path = str(box[0])
    os.makedirs(path, exist_ok=True)
    return path


def tag_for(step: int) -> str:
    return f"{CHECKPOINT_TAG_PREFIX}{step}"


def save(engine: Any, directory: str, step: int, trip: RoundTrip) -> None:
    """``engine.save_checkpoint`` under ``tag_for(step)`` (collective: every rank calls it)."""
    t0 = time.perf_counter()
    engine.save_checkpoint(directory, tag=tag_for(step), client_state={"infrarsi_step": step})
    trip.save_s = time.perf_counter() - t0
    trip.checkpoint_bytes = _dir_bytes(directory)


def _dir_bytes(directory: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(directory):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                continue
    return total


_KEYS = re.compile(
    r"(Missing|Unexpected) key\(s\) in state_dict: (.*?)(?:\.\s*$|\.\s*\n|$)", re.M | re.S
)


def describe_load_error(exc: BaseException) -> str:
    """A one-paragraph reason for a failed ``load_checkpoint``: for torch's strict
    ``load_state_dict`` error, which parameter names the rebuilt model lacks and which the
    checkpoint has that the model does not (the first ``KEYS_SHOWN`` of each, and how many), and
    the shape mismatches; else the exception's type and text."""
    text = str(exc)
    missing: list[str] = []
    unexpected: list[str] = []
    for kind, names in _KEYS.findall(text):
        keys = re.findall(r'"([^"]+)"', names)
        (missing if kind == "Missing" else unexpected).extend(keys)
    shapes = re.findall(r"size mismatch for ([^:]+): (.*?)(?:\.\s*\n|\.\s*$)", text, re.M)
    if not (missing or unexpected or shapes):
        return f"checkpoint load failed: {type(exc).__name__}: {text.strip()[:600]}"
    parts = []
    if missing:
        parts.append(
            f"{len(missing)} parameter(s) of the rebuilt model are not in the checkpoint "
            f"(missing: {_first(missing)})"
        )
    if unexpected:
        parts.append(
            f"{len(unexpected)} parameter(s) in the checkpoint are not in the rebuilt model "
            f"(unexpected: {_first(unexpected)})"
        )
    if shapes:
        parts.append(
            f"{len(shapes)} shape mismatch(es) ({'; '.join(f'{n}: {w}' for n, w in shapes[:KEYS_SHOWN])})"
        )
    return (
        "checkpoint load failed: " + "; ".join(parts) + ". The parameter names (or shapes) the "
        "model code registers changed between the save and the rebuild, so a run restarted from "
        "this checkpoint cannot resume."
    )


def _first(keys: list[str]) -> str:
    more = f" and {len(keys) - KEYS_SHOWN} more" if len(keys) > KEYS_SHOWN else ""
    return ", ".join(keys[:KEYS_SHOWN]) + more


def any_rank(flag: bool, device: torch.device | str) -> bool:
    """True on every rank when ``flag`` is True on some rank (an all-reduced max)."""
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def load(engine: Any, directory: str, step: int, trip: RoundTrip) -> bool:
    """``engine.load_checkpoint`` of ``tag_for(step)``, module strict; True when every rank
    loaded it (a rank's failure is described in ``trip.error``; the others say a peer failed)."""
    error = ""
    try:
        path, _client = engine.load_checkpoint(
            directory, tag=tag_for(step), load_module_strict=True
        )
        if path is None:
            error = f"checkpoint load failed: DeepSpeed found no checkpoint {tag_for(step)!r} in {directory}"
    except Exception as e:  # a model that no longer matches its checkpoint, a corrupt file...
        error = describe_load_error(e)
    failed_somewhere = any_rank(bool(error), engine.device)
    if error:
        trip.error = error
    elif failed_somewhere:
        trip.error = "checkpoint load failed on another rank (see that rank's error)"
    return not failed_somewhere


def continue_training(
    engine: Any,
    base_optimizer: Any,
    job: Any,
    seams: Any,
    planned: list[list[Any]],
    start: int,
    vocab_size: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    trip: RoundTrip,
) -> None:
    """Train steps ``start`` .. ``len(planned) - 1`` on the restored ``engine`` and record each
    step's global mean harness loss in ``trip.loss`` (the same computation as the uninterrupted
    run: harness cross-entropy from the logits, the job's own loss back-propagated, the
    optimizer stepped through the seams). Stops at a non-finite loss."""
    t0 = time.perf_counter()
    dev = engine.device
    for step in range(start, len(planned)):
        batches = [(b.inputs.to(dev), b.targets.to(dev)) for b in seams.fetch(planned[step])]
        loss_sum = torch.zeros((), dtype=torch.float64, device=dev)
        n_tok = 0
        for i, (inp, tgt) in enumerate(batches):
            logits = job.forward(engine, inp)
            loss = loss_fn(logits, tgt)
            loss_sum += loss.detach().double() * tgt.numel()
            n_tok += tgt.numel()
            if job.loss is not None:
                loss = job.loss(logits, tgt)
            engine.backward(loss)
            seams.optimizer_step(engine, base_optimizer, step, i == len(batches) - 1)
            del logits, loss
        totals = torch.stack(
            [loss_sum, torch.tensor(float(n_tok), dtype=torch.float64, device=dev)]
        )
        dist.all_reduce(totals)
        tot = totals.tolist()
        trip.loss.append(tot[0] / max(tot[1], 1.0))
        if not torch.isfinite(torch.tensor(trip.loss[-1])):
            break
    trip.continue_s = time.perf_counter() - t0


def harness_loss(
    vocab_size: int, loss_chunk: int
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The harness's mean cross-entropy of logits against targets (chunked when ``loss_chunk``)."""
    from infrarsi.execution.knobs.loss_chunk import chunked_cross_entropy

    def fn(logits: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        if loss_chunk:
            return chunked_cross_entropy(logits, tgt, loss_chunk)
        return F.cross_entropy(logits.float().reshape(-1, vocab_size), tgt.reshape(-1))

    return fn


def remove(directory: str) -> None:
    """Remove the checkpoint files on this node (never raises)."""
    shutil.rmtree(directory, ignore_errors=True)


__all__ = [
    "RoundTrip",
    "any_rank",
    "continue_training",
    "describe_load_error",
    "harness_loss",
    "load",
    "remove",
    "save",
    "shared_temp_dir",
    "tag_for",
]
