"""What ``rank_loop`` leans on: workload import, harness counters, the optimizer, checksums and the eval check.

Helpers of ``rank_loop``: importing the workload code, harness counters, the optimizer,
communication timing, parameter gathering, checksum and the eval check."""

from __future__ import annotations

import importlib
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from infrarsi.errors import WorkloadError

_SUBMODULES = ("models", "data", "cheats")


def import_workloads(code_dir: str, alias: str = "workloads") -> dict[str, Any]:
    """Import the ``workloads`` package under ``code_dir`` afresh (a warm worker may see a
    different or patched code dir per trial). ``alias`` != ``workloads`` loads an independent
    copy under that module name (the untouched reference for the eval check)."""
    root = Path(code_dir) / "workloads"
    if not (root / "__init__.py").exists():
        raise WorkloadError(f"code_dir {code_dir!r} has no workloads/__init__.py; point code_dir at the repo root.")
    for name in [m for m in sys.modules if m == alias or m.startswith(alias + ".")]:
        del sys.modules[name]
    importlib.invalidate_caches()
    spec = importlib.util.spec_from_file_location(alias, root / "__init__.py", submodule_search_locations=[str(root)])
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[alias] = mod
    spec.loader.exec_module(mod)
    out: dict[str, Any] = {"__name__": alias}
    for sub in _SUBMODULES:
        out[sub] = importlib.import_module(f"{alias}.{sub}")
    return out


def import_submodule(pkg: dict[str, Any], dotted: str) -> Any:
    return importlib.import_module(f"{pkg['__name__']}.{dotted}")


class HarnessCounters:
    """Tokens/sequences fed to the model (forward pre-hook on the top module) and optimizer
    steps taken by the real torch optimizer (step post-hook), counted by the harness."""

    def __init__(self) -> None:
        self.step_tokens = 0
        self.step_rows = 0
        self._stepped = False
        self._handles: list[Any] = []

    def attach(self, model: nn.Module) -> HarnessCounters:
        def pre(mod: nn.Module, args: tuple[Any, ...]) -> None:
            if torch.is_grad_enabled() and args and isinstance(args[0], torch.Tensor):
                self.step_tokens += int(args[0].numel())
                self.step_rows += int(args[0].shape[0])

        self._handles.append(model.register_forward_pre_hook(pre))
        return self

    def watch_optimizer(self, opt: torch.optim.Optimizer) -> None:
        def post(*_: Any) -> None:
            self._stepped = True

        self._handles.append(opt.register_step_post_hook(post))

    def begin_step(self) -> None:
        self.step_tokens = self.step_rows = 0
        self._stepped = False

    def end_step(self) -> int:
        """1 if the optimizer really stepped since ``begin_step``, else 0."""
        took = int(self._stepped)
        self._stepped = False
        return took

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def make_optimizer(impl: str, params: list[nn.Parameter], optim: Any) -> torch.optim.Optimizer:
    """The harness's torch AdamW (``adamw`` loop, ``adamw_foreach``, ``adamw_fused``)."""
    kw: dict[str, Any] = {"lr": optim.lr, "betas": tuple(optim.betas), "weight_decay": optim.weight_decay}
    if impl == "adamw":
        kw["foreach"] = False
    elif impl == "adamw_foreach":
        kw["foreach"] = True
    elif impl == "adamw_fused":
        kw["fused"] = True
    return torch.optim.AdamW(params, **kw)


class CommTimer:
    """Seconds spent inside DeepSpeed's collectives (wraps the methods of ``deepspeed.comm``'s
    backend once per process). CPU only: gloo collectives block, so the time is real; on GPU
    timing them would need a sync that distorts overlap, so it reports 0."""

    _total = [0.0]
    _installed = False
    OPS = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "reduce_scatter",
           "broadcast", "all_to_all_single", "reduce", "allgather_fn", "all_reduce_coalesced",
           "all_gather_coalesced", "reduce_scatter_fn", "inference_all_reduce")

    @classmethod
    def install(cls, device: str) -> type[CommTimer]:
        if device != "cpu" or cls._installed:
            return cls
        from deepspeed.comm import comm as dscomm

        cdb = dscomm.cdb
        if cdb is None:
            return cls
        for name in cls.OPS:
            fn = getattr(cdb, name, None)
            if fn is None:
                continue

            def wrapped(*a: Any, __fn: Any = fn, **k: Any) -> Any:
                t = time.perf_counter()
                try:
                    return __fn(*a, **k)
                finally:
                    cls._total[0] += time.perf_counter() - t

            setattr(cdb, name, wrapped)
        cls._installed = True
        return cls

    @classmethod
    def total_s(cls) -> float:
        return cls._total[0]


def gather_full_state(engine: Any, model: nn.Module, ep_mod: Any | None) -> dict[str, torch.Tensor]:
    """Full fp32 parameters on every rank (ZeRO-3 partitions gathered; expert-parallel shards
    all-gathered), keyed like the single-device model's state dict."""
    params = dict(model.named_parameters())
    out: dict[str, torch.Tensor] = {}
    if engine.zero_optimization_stage() == 3:
        from deepspeed.runtime.zero.partition_parameters import GatheredParameters

        with GatheredParameters(list(params.values()), modifier_rank=None):
            for k, p in params.items():
                out[k] = p.detach().float().cpu().clone()
    else:
        for k, p in params.items():
            out[k] = p.detach().float().cpu().clone()
    if ep_mod is not None:
        out.update({k: v.cpu() for k, v in ep_mod.gather_full_experts(model).items()})
    return out


def checksum(state: dict[str, torch.Tensor]) -> float:
    """sum(p) + sum(p^2) in float64 over ``state`` (sorted keys)."""
    tot = 0.0
    for k in sorted(state):
        t = state[k].double()
        tot += float(t.sum()) + float((t * t).sum())
    return tot


def eval_loss(ref: dict[str, Any], wl: Any, state: dict[str, torch.Tensor], source: Any) -> float:
    """Cross-entropy of the fixed held-out batch under a fresh fp32 reference model (built
    from the reference code, no checkpointing, no parallelism) loaded with ``state``."""
    prev = torch.random.get_rng_state()
    model = ref["models"].build_model(wl.model.family, wl.model.size, wl.model.overrides, {})
    torch.random.set_rng_state(prev)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise WorkloadError(f"eval check: trained parameters do not match the reference model (missing {missing[:5]}, unexpected {unexpected[:5]})")
    batch = source.eval_batch()
    with torch.no_grad():
        logits = model(batch.inputs)
        return float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch.targets.reshape(-1)))


def median(values: list[float]) -> float:
    return float(statistics.median(values))
