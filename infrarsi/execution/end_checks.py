"""The end-of-trial checks: the parameter checksum across replicas and the eval loss of the trained model.

End-of-trial checks (after the last step), all on the rank's own device (the GPU on ``cuda``,
the host on ``cpu``), in one pass over the trained parameters (``trained_parameters``):

- the parameter checksum, sum(p) + sum(p^2) over the replicated parameters, accumulated in
  float64 on the device a chunk of ``CHECKSUM_CHUNK_ELEMENTS`` at a time (``add_sum_and_squares``);
- the eval loss: the untouched reference model code builds the single-device model on the
  device with its parameters on the meta device (``build_reference``), the trained values fill
  them (``checksum_and_load``: a live fp32 parameter is used as is, any other value is copied to
  fp32 on the device), and the fixed held-out batch runs through it in fp32, a chunk of rows at
  a time (``eval_loss``).

ZeRO-3 partitions are gathered ``GATHER_GROUP_ELEMENTS`` at a time, never the whole model; every
parameter enters the checksum (no sampling).

Host-memory bound of the checks, per rank, over what training already holds:

- ``cuda``: independent of the model: nothing but the eval batch's token ids and scalars
  reaches the host (parameters, gathered groups, the reference model and its activations live
  on the GPU; there the reference adds 4 bytes per parameter that is not already a live fp32
  tensor, i.e. under bf16 or ZeRO-3, plus the eval activations of one chunk of rows).
- ``cpu``, ZeRO 0-2 with fp32 parameters (the CPU path's trials): at most the largest single
  parameter tensor (allocated, never written, while the reference skeleton is built) + 32 MiB
  (the checksum chunk and its square) + the reference's forward activations on one chunk of the
  eval batch (logits at most ``EVAL_LOGITS_BUDGET_BYTES``), independent of the number of
  parameters. ZeRO-3 on ``cpu`` adds an fp32 copy of the parameters (the reference model must
  hold them, and on ``cpu`` the device is the host) and expert parallelism the other ranks'
  expert shards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from infrarsi.errors import WorkloadError

CHECKSUM_CHUNK_ELEMENTS = 1 << 21
"""Elements of a parameter turned into float64 at a time by the checksum (16 MiB as float64;
the chunk and its square: 32 MiB)."""
GATHER_GROUP_ELEMENTS = 1 << 26
"""ZeRO-3: parameters are gathered in consecutive groups of at most this many elements (or one
larger parameter alone), never the whole model."""
EVAL_LOGITS_BUDGET_BYTES = 256 << 20
"""The eval batch runs through the reference model in chunks of rows whose fp32 logits take at
most this many bytes (at least one row per chunk)."""


@dataclass(frozen=True)
class TrainedTensor:
    """One parameter of the single-device model, full size, on the rank's device, as
    ``trained_parameters`` yields it."""

    name: str
    """Name in the single-device model (``model.named_parameters()`` style)."""
    tensor: torch.Tensor
    """The full parameter, detached, in the trained dtype, on the rank's device."""
    replicated: bool
    """True for a parameter every data-parallel rank holds alike (it enters the checksum);
    False for an expert-parallel expert (gathered from every rank's shard)."""
    stable: bool
    """True when ``tensor`` stays valid after the next item is drawn (a live unpartitioned
    parameter, or a fresh gathered tensor); False for a ZeRO-3 parameter, whose gathered data
    is released when its group is re-partitioned."""


def _is_zero3(p: torch.Tensor) -> bool:
    return hasattr(p, "ds_id")


def _full_numel(p: torch.Tensor) -> int:
    """Elements of the full parameter (a ZeRO-3 parameter's own ``numel`` is its partition's)."""
    return int(getattr(p, "ds_numel", p.numel()))


def trained_parameters(model: nn.Module, ep_mod: Any | None = None) -> Iterator[TrainedTensor]:
    """Every parameter of the trained single-device model, full size, on the rank's device, a
    bounded amount at a time: ZeRO-3 partitions are gathered ``GATHER_GROUP_ELEMENTS`` at a time
    (``deepspeed.zero.GatheredParameters``; a collective, so every rank draws every item, in the
    same order), expert-parallel shards are all-gathered by the workload's ``gather_full_experts``
    (collective too) and come last. Nothing is copied to the host."""
    named = list(model.named_parameters())
    i = 0
    while i < len(named):
        group = [named[i]]
        size = _full_numel(named[i][1])
        i += 1
        while i < len(named):
            n = _full_numel(named[i][1])
            if size + n > GATHER_GROUP_ELEMENTS:
                break
            group.append(named[i])
            size += n
            i += 1
        zero3 = [p for _, p in group if _is_zero3(p)]
        if zero3:
            from deepspeed.runtime.zero.partition_parameters import GatheredParameters

            with GatheredParameters(zero3, modifier_rank=None):
                for name, p in group:
                    yield TrainedTensor(name, p.detach(), replicated=True, stable=not _is_zero3(p))
        else:
            for name, p in group:
                yield TrainedTensor(name, p.detach(), replicated=True, stable=True)
    if ep_mod is not None:
        for name, t in ep_mod.gather_full_experts(model).items():
            yield TrainedTensor(name, t.detach(), replicated=False, stable=True)


def add_sum_and_squares(acc: torch.Tensor, t: torch.Tensor) -> None:
    """``acc += sum(t) + sum(t^2)`` in float64 on ``t``'s device, ``CHECKSUM_CHUNK_ELEMENTS``
    elements at a time (only a chunk is ever held in float64)."""
    flat = t.reshape(-1)
    for lo in range(0, flat.numel(), CHECKSUM_CHUNK_ELEMENTS):
        c = flat[lo : lo + CHECKSUM_CHUNK_ELEMENTS].to(torch.float64)
        acc += c.sum()
        acc += (c * c).sum()
        del c


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """While a model is built: every parameter, once registered, is replaced by a meta tensor of
    the same shape and dtype (buffers stay real). One parameter exists for real at a time, and
    its memory is never written (initialisation then runs on the meta tensor)."""
    orig = nn.Module.register_parameter

    def register(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        orig(self, name, param)
        if param is not None and not param.is_meta:
            self._parameters[name] = nn.Parameter(
                torch.empty_like(param, device="meta"), requires_grad=param.requires_grad
            )

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = orig  # type: ignore[method-assign]


def build_reference(build: Callable[[], nn.Module], device: torch.device | str) -> nn.Module:
    """The reference model built by ``build`` (the untouched model code) on ``device``, with its
    parameters left on the meta device (``checksum_and_load`` fills them) and its buffers
    computed by the reference code on ``device``. The RNG state is left as it was."""
    dev = torch.device(device)
    forked = (
        [dev.index if dev.index is not None else torch.cuda.current_device()]
        if dev.type == "cuda"
        else []
    )
    with torch.random.fork_rng(devices=forked), torch.device(dev), _parameters_on_meta():
        model = build()
    return model.eval()


def _meta_slots(reference: nn.Module) -> dict[str, list[tuple[nn.Module, str]]]:
    """Canonical parameter name -> every (module, attribute) holding that meta parameter (a
    tied parameter has several holders)."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for mod in reference.modules():
        for leaf, p in mod._parameters.items():
            if p is not None and p.is_meta:
                holders.setdefault(id(p), []).append((mod, leaf))
    return {name: holders[id(p)] for name, p in reference.named_parameters() if id(p) in holders}


def checksum_and_load(
    model: nn.Module,
    ep_mod: Any | None = None,
    reference: nn.Module | None = None,
    device: torch.device | str | None = None,
) -> float:
    """One pass over ``trained_parameters``: returns the parameter checksum (sum(p) + sum(p^2) in
    float64, computed on the rank's device, over the replicated parameters in model order; the
    same on every data-parallel replica unless they diverged) and, when ``reference`` (from
    ``build_reference``) is given, fills its meta parameters with the trained values in fp32 (or
    the reference's declared dtype) on ``device``: a stable plain tensor already in that dtype
    and on that device is used as is (no copy), any other value is copied. Raises
    ``WorkloadError`` when the trained parameters and the reference's differ in names or shapes."""
    slots = _meta_slots(reference) if reference is not None else {}
    dev = torch.device(device) if device is not None else None
    acc: torch.Tensor | None = None
    unexpected: list[str] = []
    mismatched: list[str] = []
    for item in trained_parameters(model, ep_mod):
        t = item.tensor
        if item.replicated:
            if acc is None:
                acc = torch.zeros((), dtype=torch.float64, device=t.device)
            add_sum_and_squares(acc, t)
        if reference is None:
            continue
        where = slots.pop(item.name, None)
        if where is None:
            unexpected.append(item.name)
            continue
        meta = where[0][0]._parameters[where[0][1]]
        assert meta is not None
        if tuple(meta.shape) != tuple(t.shape):
            mismatched.append(
                f"{item.name}: trained {tuple(t.shape)} vs reference {tuple(meta.shape)}"
            )
            continue
        target = dev or t.device
        if item.stable and type(t) is torch.Tensor and t.dtype == meta.dtype and t.device == target:
            value = t
        else:
            value = torch.empty(t.shape, dtype=meta.dtype, device=target).copy_(t)
        param = nn.Parameter(value, requires_grad=False)
        for mod, leaf in where:
            mod._parameters[leaf] = param
    if reference is not None and (slots or unexpected or mismatched):
        raise WorkloadError(
            f"eval check: trained parameters do not match the reference model (missing "
            f"{sorted(slots)[:5]}, unexpected {unexpected[:5]}, shape {mismatched[:5]})"
        )
    return float(acc.item()) if acc is not None else 0.0


@contextlib.contextmanager
def _fp32_matmuls() -> Iterator[None]:
    """Full fp32 matmuls (no TF32) inside, whatever the trained code set; restored after."""
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(prev)


def eval_loss(
    reference: nn.Module,
    batch: Any,
    device: torch.device | str,
    vocab_size: int,
    forward: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None,
) -> float:
    """Mean cross-entropy of the fixed held-out ``batch`` (``inputs``/``targets`` ``[rows, seq]``)
    under ``reference`` (filled by ``checksum_and_load``; called through the job's ``forward``
    when given) on ``device``, in fp32, without
    autograd, in chunks of rows whose fp32 logits (``seq x vocab_size``) fit
    ``EVAL_LOGITS_BUDGET_BYTES`` (the whole batch at once when it fits)."""
    rows, seq = int(batch.inputs.shape[0]), int(batch.inputs.shape[1])
    chunk = max(1, EVAL_LOGITS_BUDGET_BYTES // max(1, seq * int(vocab_size) * 4))
    total = torch.zeros((), dtype=torch.float64, device=device)
    n = 0
    with torch.no_grad(), _fp32_matmuls():
        for lo in range(0, rows, chunk):
            inp = batch.inputs[lo : lo + chunk].to(device)
            tgt = batch.targets[lo : lo + chunk].to(device)
            logits = forward(reference, inp) if forward is not None else reference(inp)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tgt.reshape(-1))
            total += loss.double() * tgt.numel()
            n += tgt.numel()
            del logits, loss
    return float((total / max(n, 1)).item())
