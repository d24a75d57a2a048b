"""The DeepSpeed config a knob config becomes, as the report and ``apply`` show it.

The DeepSpeed config a knob config becomes (through ``infrarsi.execution.knobs.deepspeed``), and
diffs between configs, shared by the report and ``apply``.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from infrarsi.result import TrialResult
from infrarsi.study.contract import Contract


def model_sizes(contract: Contract, trials: list[TrialResult] | None = None) -> tuple[int, int]:
    """(num_params, hidden_size) of the workload's model: from logged rows, else the model registry."""
    num_params = 0
    for r in trials or []:
        n = r.extra.num_params
        if n:
            num_params = int(n)
            break
    hidden = 0
    try:
        from workloads.models import model_args

        m = contract.workload.get("model", {})
        if not m.get("family"):  # a user's entry point: its hidden size is not known here
            return num_params, 0
        args = model_args(m["family"], m.get("size", "debug"), m.get("overrides"))
        hidden = int(getattr(args, "dim", 0) or getattr(args, "hidden_size", 0) or 0)
    except Exception:  # the workload code may not be importable here; buckets stay at auto
        hidden = 0
    return num_params, hidden


def deepspeed_config(
    contract: Contract, config: dict[str, Any], trials: list[TrialResult] | None = None
) -> dict[str, Any] | None:
    """The DeepSpeed config dict ``config`` builds for the contract's workload: the one a logged
    trial of that config actually used (``extra.ds_config``), else the translation of the
    knobs; None when neither is available (the caller shows the knob diff instead)."""
    for r in trials or []:
        logged = r.extra.ds_config
        if r.config == config and isinstance(logged, dict) and logged:
            return dict(logged)
    from infrarsi.execution.knobs.deepspeed import build_trial

    num_params, hidden = model_sizes(contract, trials)
    try:
        if contract.workload.get("backend") == "surrogate":
            # registers the surrogate-only knobs (tp, pp, flash_attention) as record-only
            import infrarsi.execution.surrogate.backend  # noqa: F401
        wl = contract.workload_model()
        build = build_trial(wl, dict(config), wl.world_size, num_params, hidden)
    except Exception:
        return None
    return dict(build.ds_config)


def knob_diff(baseline: dict[str, Any], best: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(knob, baseline value, best value) for each knob whose value differs."""
    keys = sorted(set(baseline) | set(best))
    return [(k, baseline.get(k), best.get(k)) for k in keys if baseline.get(k) != best.get(k)]


def json_diff(
    old: dict[str, Any], new: dict[str, Any], *, old_name: str = "baseline", new_name: str = "best"
) -> str:
    """A unified diff of two JSON dicts (sorted keys, indented)."""
    a = json.dumps(old, indent=2, sort_keys=True, default=str).splitlines(keepends=True)
    b = json.dumps(new, indent=2, sort_keys=True, default=str).splitlines(keepends=True)
    return "".join(difflib.unified_diff(a, b, fromfile=old_name, tofile=new_name, n=2))


__all__ = ["deepspeed_config", "json_diff", "knob_diff", "model_sizes"]
